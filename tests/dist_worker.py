"""Worker of the data-parallel tests: K training steps of ResNet-18 with frozen BatchNorm on
real CIFAR-10 images, with two training cells one after the other, their parameters saved as
.npz:

- ``onestep``: this package's ``TrainStep`` with no option on (one call per optimizer step,
  the cell of a plain recipe; the same operations as MindSpore's ``nn.TrainOneStepCell``),
  per-rank batch B;
- ``trainstep``: this package's ``TrainStep`` with gradient accumulation over
  ``ACCUMULATION`` micro-batches (one call each, as ``Model`` feeds them: the all-reduce
  runs in the call that steps the optimizer), global-norm clipping and a weight EMA;
  per-rank ``ACCUMULATION`` x B images per optimizer step;
- ``microbatch`` (ranks only): ``trainstep`` with ``allreduce_per`` "micro_batch" (the
  all-reduce in every call, outside the branch that steps the optimizer);
- ``distill``: a logit-distilling step as train.py builds it (``build_train_step`` with a
  frozen random ResNet-18 teacher, ``KD_TEMPERATURE``, task and distill weights
  ``KD_WEIGHTS``), per-rank batch B; it also saves each step's loss as the step returned it
  and its ``kd_loss.task`` / ``kd_loss.distill`` parts (``loss.total``, ``loss.task``,
  ``loss.distill``: one value a step);
- ``overflow`` (ranks only): ``TrainStep`` with a dynamic loss scale (``OVERFLOW_SCALE``,
  factor 2) and the overflow check on its ``IsFinite`` path (``tests/test_overflow.py``'s
  ``force_ascend_910b_check``), one micro-batch per step; on rank 1 alone one soft target of
  step ``OVERFLOW_STEP`` (0-based) is inf, so only its gradients overflow. Each rank prints
  ``rank R overflow {JSON}``: per step the overflow flag and the loss scale after it, the
  ``overflow_count`` parameter, and whether that step left the weights untouched.

    msrun --worker_num 2 ... tests/dist_worker.py --out DIR     # rank r trains on its half
    python tests/dist_worker.py --out DIR --single --variants onestep,trainstep  # one process

Global batch = 2 x per-rank batch; rank r takes rows [r*b, (r+1)*b) of every global batch
(b its per-rank batch), so the averaged gradient of the two ranks is the single process's
gradient (the single process accumulates ``ACCUMULATION`` micro-batches of the global batch:
each a mean over equal halves, so the same mean). Files: ``{variant}_{name}.npz`` with the
network's parameters after training (``ema.*``: the EMA's averages) and ``init.*`` (their
values before the first step), name ``single`` or ``rank{r}_of{size}``.

On 2 ranks each rank then also all-gathers two ints with ``all_gather_int`` (the collective
under the ranks' agreement on the resume step, values beyond float32's exact integers
included) and prints ``rank R gathered [...] [...]`` to its msrun log; reads its shard of
an epoch of repeated augmentation (``EpochSampler`` over ``RA_IMAGES`` rows, ``RA_REPEATS``
copies, seed ``RA_SEED``, sharded by its real rank and group size) through a MindSpore
pipeline and prints ``rank R aug_repeats {JSON}`` (those three numbers and the rows read), and
likewise its shard of an epoch of class-balanced draws (``rank R class_balance {JSON}``); and
prints the stochastic depth draws of its first training step as train.py builds its network
(``rank R drop path keeps 0110...``); and, in one process too, evaluates a multi-label
network on its shard as ``run_eval`` does (``rank R multilabel {JSON}``, mAP over the gathered
scores): one launch serves these checks.
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from src.env import set_cpu_fast_path  # noqa: E402

set_cpu_fast_path()

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402

from src.data.sampling import EpochSampler  # noqa: E402
from src.data.settings import EvalPreprocess  # noqa: E402
from src.deploy.inference import preprocess_images  # noqa: E402
from src.models.resnet import create_network  # noqa: E402
from src.training.distill import Distillation, Teacher, tensors_digest  # noqa: E402
from src.training.loss import CrossEntropySmooth  # noqa: E402
from src.training.model import StepRecipe, build_train_step  # noqa: E402
from src.training.optimizer import create_optimizer  # noqa: E402
from src.training.train_step import TrainStep, WeightEma  # noqa: E402
from tests.helpers import interleaved_class_images  # noqa: E402

ACCUMULATION = 2  # micro-batches per optimizer step (trainstep)
CLIP_NORM = 1.0  # global-norm threshold (trainstep): the gradients' norm is ~3.3, so it clips
EMA_DECAY = 0.5  # far from 1, so 3 updates leave the averages away from the weights
OVERFLOW_SCALE, OVERFLOW_STEP = 1024.0, 1  # overflow: the loss scale, rank 1's inf step
RA_IMAGES, RA_REPEATS, RA_SEED = 11, 3, 5  # the repeated-augmentation epoch read per rank
BALANCED_LABELS = [0] * 6 + [1] * 3 + [2] * 2  # the class-balanced epoch read per rank
ML_IMAGES = 45  # the multi-label evaluation: odd, so one shard holds a padding row
KD_TEACHER_SEED, KD_TEMPERATURE, KD_WEIGHTS = 7, 4.0, (0.5, 0.5)  # distill: (task, distill)


def real_batches(data_path, steps, global_batch):
    paths, labels = interleaved_class_images(data_path, steps * global_batch)
    return preprocess_images(paths, EvalPreprocess(image_size=32, resize=32)), labels


def frozen_bn_resnet18():
    """ResNet-18 (10 classes) with BatchNorm on its moving statistics: no per-rank state."""
    ms.set_seed(1)  # same initial weights on every rank
    net = create_network("resnet18", class_num=10)
    for _, cell in net.cells_and_names():
        if isinstance(cell, ms.nn.BatchNorm2d):
            cell.use_batch_statistics = False
    return net


def train(variant, args, rank):
    """Train ``variant`` for ``args.steps`` steps on this process's rows; returns the
    parameters to save."""
    net = frozen_bn_resnet18()
    with_loss = ms.nn.WithLossCell(net, CrossEntropySmooth(0.1, 10))
    optimizer = create_optimizer(net, 0.05, 0.875, 1 / 32768)
    ema = None
    if variant == "onestep":
        step, per_rank = TrainStep(with_loss, optimizer), args.batch
    else:
        ema = WeightEma(net, EMA_DECAY)
        step = TrainStep(with_loss, optimizer, grad_clip_norm=CLIP_NORM,
                         accumulation_steps=ACCUMULATION, ema=ema,
                         allreduce_per="micro_batch" if variant == "microbatch" else "step")
        per_rank = ACCUMULATION * args.batch
    # a copy: asnumpy() may share the parameter's host memory, which training overwrites
    init = {f"init.{p.name}": p.asnumpy().copy() for p in net.trainable_params()}
    step.set_train(True)
    global_batch = 2 * per_rank
    images, labels = real_batches(args.data_path, args.steps, global_batch)
    rows = slice(0, global_batch) if args.single else slice(rank * per_rank,
                                                            (rank + 1) * per_rank)
    calls = 1 if variant == "onestep" else ACCUMULATION  # per optimizer step
    for s in range(args.steps):
        x = images[s * global_batch:(s + 1) * global_batch][rows]
        y = labels[s * global_batch:(s + 1) * global_batch][rows]
        size = len(x) // calls
        for i in range(calls):
            step(ms.Tensor(x[i * size:(i + 1) * size]), ms.Tensor(y[i * size:(i + 1) * size]))
    saved = dict(init, **{p.name: p.asnumpy() for p in net.trainable_params()})
    if ema is not None:
        names = {p.name for p in net.trainable_params()}
        saved.update({p.name: p.asnumpy() for p in ema.averages
                      if p.name.split(".", 1)[1] in names})
    return saved


def distilling_step(net):
    """train.py's ``TrainStep`` of ``net`` distilling the logits of a frozen random ResNet-18
    (seed ``KD_TEACHER_SEED``, the same on every rank)."""
    ms.set_seed(KD_TEACHER_SEED)
    teacher = Teacher(create_network("resnet18", class_num=10))
    distill = Distillation(teacher=teacher, distill_type="logit", temperature=KD_TEMPERATURE,
                           task_weight=KD_WEIGHTS[0], distill_weight=KD_WEIGHTS[1],
                           projection=None, source="random", digest=tensors_digest(teacher))
    recipe = StepRecipe(amp_level="O0", device_target="CPU", class_num=10, label_smoothing=0.1,
                        optimizer_kwargs={"momentum": 0.875, "weight_decay": 1 / 32768},
                        loss_kwargs={"loss": "ce"}, distill=distill)
    return build_train_step(net, 0.05, recipe)


def train_distilling(args, rank):
    """The ``distill`` variant: ``args.steps`` steps on this process's rows of each global
    batch (2 x ``args.batch``); returns the parameters and the per-step losses to save."""
    net = frozen_bn_resnet18()
    step = distilling_step(net)
    init = {f"init.{p.name}": p.asnumpy().copy() for p in net.trainable_params()}
    step.set_train(True)
    global_batch = 2 * args.batch
    images, labels = real_batches(args.data_path, args.steps, global_batch)
    rows = slice(0, global_batch) if args.single else slice(rank * args.batch,
                                                            (rank + 1) * args.batch)
    losses = {"loss.total": [], "loss.task": [], "loss.distill": []}
    for s in range(args.steps):
        x = images[s * global_batch:(s + 1) * global_batch][rows]
        y = labels[s * global_batch:(s + 1) * global_batch][rows]
        losses["loss.total"].append(float(step(ms.Tensor(x), ms.Tensor(y)).asnumpy()))
        for name, part in zip(("loss.task", "loss.distill"), step.network.parts):
            losses[name].append(float(part.asnumpy()))
    return dict(init, **{k: np.array(v) for k, v in losses.items()},
                **{p.name: p.asnumpy() for p in net.trainable_params()})


def train_through_an_overflow(args, rank):
    """The ``overflow`` variant: ``args.steps`` steps; returns (the parameters to save, the
    record printed)."""
    from tests.test_overflow import force_ascend_910b_check
    net = frozen_bn_resnet18()
    with_loss = ms.nn.WithLossCell(net, ms.nn.SoftmaxCrossEntropyWithLogits(
        sparse=False, reduction="mean"))
    step = TrainStep(with_loss, create_optimizer(net, 0.05, 0.875, 1 / 32768),
                     scale_sense=ms.nn.DynamicLossScaleUpdateCell(OVERFLOW_SCALE, 2.0, 1000),
                     check_overflow=True)
    force_ascend_910b_check(step)
    step.set_train(True)
    images, labels = real_batches(args.data_path, args.steps, 2 * args.batch)
    targets = np.eye(10, dtype=np.float32)[labels]
    record = {"overflow": [], "scale": [], "unchanged": []}
    for s in range(args.steps):
        rows = slice(s * 2 * args.batch + rank * args.batch,
                     s * 2 * args.batch + (rank + 1) * args.batch)
        x, y = images[rows], targets[rows].copy()
        if rank == 1 and s == OVERFLOW_STEP:
            y[0, 0] = np.inf  # the backward pass only: the forward's statistics stay finite
        before = [p.asnumpy().copy() for p in net.trainable_params()]
        _, overflow, scale = step(ms.Tensor(x), ms.Tensor(y))
        record["overflow"].append(bool(overflow.asnumpy()))
        record["scale"].append(float(step.scale_sense.asnumpy()))
        record["unchanged"].append(all(np.array_equal(b, p.asnumpy()) for b, p in zip(
            before, net.trainable_params())))
    record["overflow_count"] = int(step.overflow_count.asnumpy())
    return {p.name: p.asnumpy() for p in net.trainable_params()}, record


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--data_path", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="per-rank (micro-)batch")
    parser.add_argument("--single", action="store_true")
    parser.add_argument("--variants",
                        default="onestep,trainstep,microbatch,overflow,distill")
    args = parser.parse_args()

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    rank, size = 0, 1
    if not args.single:
        from mindspore.communication import get_group_size, get_rank, init
        init()
        rank, size = get_rank(), get_group_size()
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL,
                                     gradients_mean=True, all_reduce_fusion_config=[33, 61])
    name = "single" if args.single else f"rank{rank}_of{size}"
    for variant in args.variants.split(","):
        if variant == "overflow":
            saved, record = train_through_an_overflow(args, rank)
            print(f"rank {rank} overflow {json.dumps(record)}", flush=True)
        elif variant == "distill":
            saved = train_distilling(args, rank)
        else:
            saved = train(variant, args, rank)
        np.savez(os.path.join(args.out, f"{variant}_{name}.npz"), **saved)
    if not args.single:
        from src.utils.device import all_gather_int
        print(f"rank {rank} gathered {all_gather_int(rank * 10 + 3)} "
              f"{all_gather_int(-1 + rank * 500000)}", flush=True)
        print(f"rank {rank} aug_repeats {json.dumps(repeated_rows(rank, size))}", flush=True)
        print(f"rank {rank} class_balance {json.dumps(balanced_rows(rank, size))}", flush=True)
        print(f"rank {rank} drop path keeps {drop_path_draws(rank)}", flush=True)
    print(f"rank {rank} multilabel {json.dumps(multilabel_eval(args.data_path, rank, size))}",
          flush=True)


def balanced_rows(rank, size):
    """The rows this rank's pipeline reads in epoch 1 of class-balanced draws over
    ``BALANCED_LABELS`` (weights as ``class_balance sampler`` gives them, seed ``RA_SEED``):
    ``{"labels", "seed", "rows"}``."""
    import mindspore.dataset as ds

    from src.data.sampling import balanced_sample_weights
    labels = np.array(BALANCED_LABELS)
    sampler = EpochSampler(np.arange(len(labels)), seed=RA_SEED,
                           weights=balanced_sample_weights(labels), num_shards=size,
                           shard_id=rank)
    rows = ds.NumpySlicesDataset({"row": np.arange(len(labels))}, sampler=sampler)
    return {"labels": BALANCED_LABELS, "seed": RA_SEED,
            "rows": [int(row[0]) for row in rows.create_tuple_iterator(num_epochs=1,
                                                                        output_numpy=True)]}


def repeated_rows(rank, size):
    """The rows this rank's pipeline reads in one epoch of repeated augmentation, with the
    sampler's settings: ``{"images", "repeats", "seed", "rows"}``."""
    import mindspore.dataset as ds

    sampler = EpochSampler(np.arange(RA_IMAGES), seed=RA_SEED, num_shards=size,
                           shard_id=rank, repeats=RA_REPEATS)
    rows = ds.NumpySlicesDataset({"row": np.arange(RA_IMAGES)}, sampler=sampler)
    return {"images": RA_IMAGES, "repeats": RA_REPEATS, "seed": RA_SEED,
            "rows": [int(row[0]) for row in rows.create_tuple_iterator(num_epochs=1,
                                                                        output_numpy=True)]}


def multilabel_eval(data_path, rank, size):
    """The multi-label evaluation of ``frozen_bn_resnet18`` (its weights of seed 1) over the
    first ``ML_IMAGES`` images of ``data_path`` with seeded multi-hot targets, sharded over the
    ranks as train.py's ``run_eval`` shards it: ``{"mAP", "eval_loss", "eval_images"}``."""
    from src.data.multilabel import LabelTable
    from src.training.evaluator import MultiLabelEvaluator, eval_shard
    from src.training.model import eval_model
    paths, _ = interleaved_class_images(data_path, ML_IMAGES)
    targets = (np.random.default_rng(0).random((ML_IMAGES, 10)) < 0.3).astype(np.uint8)
    table = LabelTable([os.path.relpath(p, data_path) for p in paths], list(paths), targets,
                       [f"class{i}" for i in range(10)])
    net = frozen_bn_resnet18()
    model = eval_model(net, "O0", 0.0, 10, loss_kwargs={"task": "multilabel", "loss": "bce"})
    data_args = dict(settings=EvalPreprocess(image_size=32, resize=32), batch_size=8,
                     labels=table, check_images=False, num_parallel_workers=1)
    shards = dict(num_shards=size, shard_id=rank) if size > 1 else {}
    shard = eval_shard(data_path, data_args, **shards)
    return MultiLabelEvaluator(model, shard, net)()


def drop_path_draws(rank):
    """The keep (1) / drop (0) draws of the first training step of train.py's network on
    ``rank`` with drop_path_rate 0.5 (every block with a rate, 8 images each)."""
    from src.recipe import training_network
    from src.utils.config import parse_config
    cfg = parse_config(["--config_path", os.path.join(ROOT, "configs", "quick_start.yaml"),
                        "--drop_path_rate", "0.5"])
    net = training_network(cfg, rank)
    scales = net.drop_path_scales(net.drop_path_step.value(), 8).asnumpy()
    return "".join("1" if kept else "0" for kept in scales.ravel() > 0)


if __name__ == "__main__":
    main()
