"""Data-parallel training on CPU with msrun: 2 workers, 127.0.0.1 only, every run time-bounded."""
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import mindspore as ms
import numpy as np
import pytest

from src.data.sampling import EpochSampler
from src.utils.checkpoint import checkpoint_name, read_checkpoint, stored_best
from src.utils.device import check_fusion_config, fusion_config_for
from tests.helpers import CIFAR_SAMPLE, ROOT, copy_class_folders, run_in_process, succeeded

LAUNCH_TIMEOUT = 420  # seconds any launch may take before the test fails


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python_first_env():
    """The environment with this interpreter's folder first on PATH: msrun starts its workers
    with ``python`` from PATH, which must be the one running the tests (venv or not).

    ``MS_NODE_TIMEOUT`` 10 s: when a worker exits with a non-zero status, msrun kills the
    others at once, and one killed before it unregistered keeps MindSpore's scheduler (and so
    the launch) waiting for its heartbeat time-out, 30 s by default, after every stop.

    ``MS_CPU_COMM_OP_TIMEOUT`` 120 s: without it, ``MS_NODE_TIMEOUT`` is also how long a rank's
    CPU all-reduce waits for its peer, and a rank whose graph compiled more than 10 s after the
    other's (the other worker's tests loading the cores) failed its first all-reduce ("Ring
    ReduceScatter wait receiving ... failed"), seen once in a full run."""
    return dict(os.environ, MS_NODE_TIMEOUT="10", MS_CPU_COMM_OP_TIMEOUT="120",
                PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])


def launcher(*args, timeout=LAUNCH_TIMEOUT):
    env = python_first_env()
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", "run_distribute_train_cpu.sh"),
                           *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def trained_parameters(tmp_path_factory):
    """``tests/dist_worker.py`` on 2 ranks (one msrun launch) and in one process: the
    parameters after 3 steps of ``TrainStep`` with no option on and with accumulation,
    clipping and an EMA, by variant: {"ranks": [rank 0's, rank 1's], "single": ...}; "logs": the
    two ranks' msrun logs (the same launch also all-gathers ints across the ranks). On the
    ranks also ``microbatch`` (``TrainStep`` all-reducing every micro-batch) and ``overflow``
    (a dynamic loss scale, an inf gradient on rank 1 alone at step 2); on both ``distill``
    (logit distillation from a frozen ResNet-18, with each step's losses)."""
    out = tmp_path_factory.mktemp("dist_params")
    data = os.path.join(CIFAR_SAMPLE, "test")  # real images, every class in every batch
    worker = os.path.join(ROOT, "tests", "dist_worker.py")
    msrun = os.path.join(os.path.dirname(sys.executable), "msrun")
    dist = subprocess.run([msrun, "--worker_num", "2", "--local_worker_num", "2",
                           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
                           "--log_dir", str(out / "logs"), "--join", "True",
                           "--cluster_time_out", "60", worker, "--out", str(out),
                           "--data_path", data], env=python_first_env(), capture_output=True,
                          text=True, timeout=LAUNCH_TIMEOUT, check=False)
    logs = "".join(open(out / "logs" / f"worker_{r}.log", errors="replace").read()
                   for r in range(2))
    assert dist.returncode == 0, dist.stdout[-2000:] + dist.stderr[-2000:] + logs[-3000:]
    single = subprocess.run([sys.executable, worker, "--out", str(out), "--single",
                             "--variants", "onestep,trainstep,distill", "--data_path", data],
                            capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, check=False)
    assert single.returncode == 0, single.stderr[-2000:]
    return {"logs": logs, "single_output": single.stdout, **{
        variant: {"ranks": [np.load(out / f"{variant}_rank{r}_of2.npz") for r in range(2)],
                  "single": np.load(out / f"{variant}_single.npz")
                  if variant in ("onestep", "trainstep", "distill") else None}
        for variant in ("onestep", "trainstep", "microbatch", "overflow", "distill")}}


def rank_records(trained_parameters, key):
    """The JSON record each rank of the launch above printed as ``rank R KEY {...}``, by
    rank (exactly one line each)."""
    records = []
    for rank in range(2):
        lines = [line for line in trained_parameters["logs"].splitlines()
                 if f"rank {rank} {key} " in line]
        assert len(lines) == 1, lines
        records.append(json.loads(lines[0].split(f" {key} ", 1)[1]))
    return records


@pytest.mark.slow
def test_all_gather_int_over_two_real_ranks(trained_parameters):
    """The collective under the rank agreement, on MindSpore's CPU collectives (msrun, 2
    local workers on 127.0.0.1), values beyond float32's exact integers included: run by
    ``tests/dist_worker.py`` after its training, in the launch above."""
    for rank in range(2):
        assert f"rank {rank} gathered [3, 13] [-1, 499999]" in trained_parameters["logs"]


@pytest.mark.slow
def test_two_real_ranks_compute_one_map_over_the_scores_of_both(trained_parameters):
    """Multi-label evaluation in data parallel (the launch above): each rank evaluates its shard
    of 45 images (23 and 22, the padding row left out), the scores of both are gathered and mAP
    is computed once; every rank reports what one process reports over the 45 images (float32
    scores of the same images; a mean of per-rank mAPs would differ)."""
    ranks = rank_records(trained_parameters, "multilabel")
    single = [line for line in trained_parameters["single_output"].splitlines()
              if line.startswith("rank 0 multilabel ")]
    assert len(single) == 1, trained_parameters["single_output"][-2000:]
    single = json.loads(single[0].split(" multilabel ", 1)[1])
    assert ranks[0] == ranks[1]
    assert ranks[0]["eval_images"] == single["eval_images"] == 45
    assert ranks[0]["mAP"] == pytest.approx(single["mAP"], abs=1e-6)
    assert ranks[0]["eval_loss"] == pytest.approx(single["eval_loss"], rel=1e-5)


@pytest.mark.slow
def test_two_real_ranks_read_the_repeated_augmentation_epoch_between_them(trained_parameters):
    """Repeated augmentation on 2 msrun ranks (the launch above): each rank's pipeline reads
    its shard, and the two, interleaved, are the epoch's sample list (its 11 images' order,
    each image 3 times in a row, cut to 6 per rank), the copies of an image on both ranks."""
    read = rank_records(trained_parameters, "aug_repeats")
    settings = {k: read[0][k] for k in ("images", "repeats", "seed")}
    assert settings == {k: read[1][k] for k in settings} == {"images": 11, "repeats": 3,
                                                             "seed": 5}
    order = EpochSampler(np.arange(11), seed=5).epoch_order(0)
    assert [len(r["rows"]) for r in read] == [6, 6]
    np.testing.assert_array_equal(np.stack([r["rows"] for r in read], axis=1).ravel(),
                                  np.repeat(order, 3)[:12])


@pytest.mark.slow
def test_two_real_ranks_read_the_class_balanced_draws_between_them(trained_parameters):
    """Class-balanced sampling on 2 msrun ranks (the launch above): each rank's pipeline reads
    its stride of the epoch's weighted draws of (seed, epoch), 6 rows each, and the two
    together are those 12 draws (the data-parallel training test checks only its step count)."""
    from src.data.sampling import balanced_sample_weights
    drawn = rank_records(trained_parameters, "class_balance")
    labels = np.array(drawn[0]["labels"])
    draws = EpochSampler(np.arange(len(labels)), seed=drawn[0]["seed"],
                         weights=balanced_sample_weights(labels), num_shards=2,
                         shard_id=0).epoch_order(0)
    assert [len(r["rows"]) for r in drawn] == [6, 6] and len(draws) == 12
    np.testing.assert_array_equal(np.stack([r["rows"] for r in drawn], axis=1).ravel(), draws)


@pytest.mark.slow
def test_ranks_draw_their_own_stochastic_depth(trained_parameters):
    """train.py's network on rank 0 and on rank 1 of a real launch draws different keep/drop
    patterns for its different images (the rank is hashed into the draws)."""
    draws = [re.search(rf"rank {r} drop path keeps ([01]+)", trained_parameters["logs"])
             for r in range(2)]
    assert all(draws), trained_parameters["logs"][-2000:]
    draws = [d.group(1) for d in draws]
    assert len(draws[0]) == 7 * 8 and set(draws[0]) == set(draws[1]) == {"0", "1"}
    assert draws[0] != draws[1]


@pytest.mark.slow
def test_two_ranks_hold_identical_parameters_equal_to_a_single_process(trained_parameters):
    """TrainStep with no option on (a plain recipe's cell, one call per step): 3 steps, 2
    ranks x 8 images vs 1 process x 16."""
    ranks, ref = trained_parameters["onestep"]["ranks"], trained_parameters["onestep"]["single"]
    names = [n for n in ref.files if not n.startswith("init.")]
    assert len(names) == 62
    for name in names:
        # the all-reduce hands both ranks the same averaged gradient: bit-identical
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
    # vs one process over the concatenated batch: the same gradient, summed in another order
    # (two half-batch means averaged vs one full-batch mean), so float32 rounding only.
    worst = max(float(np.abs(ranks[0][n] - ref[n]).max() / np.abs(ref[n]).max()) for n in names)
    print(f"\n[dist] 3 steps, 2 ranks x 8 vs 1 x 16: worst parameter rel diff {worst:.2e}")
    assert worst < 1e-5


@pytest.mark.slow
def test_train_step_in_data_parallel_equals_one_process_on_the_global_batch(
        trained_parameters):
    """TrainStep with 2 accumulated micro-batches, global-norm clipping (active: the gradient
    norm is ~3.3, the threshold 1) and a weight EMA: 3 steps, 2 ranks x (2 x 8) images vs one
    process x 32 (2 micro-batches of 16). Each rank averages its micro-batches, the all-reduce
    averages the ranks, then clipping (on the all-reduced gradient), the optimizer and the EMA
    run on every rank: the weights and the averages must end as in the one process, to float32
    rounding (a few ulps of the tensor's largest value), and so must the updates (trained
    minus initial values, ~1e-3: a wrong clip factor or average would be off by far more)."""
    ranks, ref = trained_parameters["trainstep"]["ranks"], trained_parameters["trainstep"]["single"]
    names = [n for n in ref.files if not n.startswith("init.")]
    assert len(names) == 2 * 62 and sum(n.startswith("ema.") for n in names) == 62
    for name in names:
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
    worst_param = worst_update = 0.0
    for name in names:
        init = ref["init." + name.removeprefix("ema.")]
        moved, moved_ref = ranks[0][name] - init, ref[name] - init
        assert np.abs(moved_ref).max() > 0, name  # every tensor trained (and averaged)
        worst_param = max(worst_param, float(np.abs(ranks[0][name] - ref[name]).max()
                                             / np.abs(ref[name]).max()))
        worst_update = max(worst_update, float(np.abs(moved - moved_ref).max()
                                               / np.abs(moved_ref).max()))
    print(f"\n[dist] TrainStep k=2, clip, EMA; 3 steps, 2 ranks vs 1 process: worst rel diff "
          f"{worst_param:.2e} of the parameters, {worst_update:.2e} of the updates")
    assert worst_param < 1e-6  # float32 eps is 1.2e-7
    assert worst_update < 1e-3


@pytest.mark.slow
def test_distilling_in_data_parallel_equals_one_process_on_the_global_batch(trained_parameters):
    """Logit distillation in data parallel (train.py's cell: ``build_train_step`` with a frozen
    random ResNet-18 teacher, task and distill weights 0.5, T 4): 3 steps, 2 ranks x 8 images
    vs one process x 16. Each rank's losses are means over its 8 images (the KL's
    ``batchmean`` too), so the mean of the two ranks' total, task and distill losses of each
    step must be the one process's over the 16, to float32 rounding of those sums: a
    relative ``16 x 10 x eps`` (the images x classes summed). Steps 2 and 3 score the weights
    the all-reduced steps before them left; the ranks' students end bit-identical. Their
    weights are not compared with the one process's: an ulp of difference moves 3-step updates
    apart by up to ~2e-3 here (docs/training.md#knowledge-distillation)."""
    ranks, ref = trained_parameters["distill"]["ranks"], trained_parameters["distill"]["single"]
    names = [n for n in ref.files if not n.startswith(("init.", "loss."))]
    assert len(names) == 62
    for name in names:
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
    bound = 16 * 10 * float(np.finfo(np.float32).eps)
    worst = {}
    for part in ("total", "task", "distill"):
        key = "loss." + part
        assert len(ref[key]) == 3 and (ref[key] > 0).all(), (key, ref[key])
        assert (ranks[0][key] != ranks[1][key]).all(), key  # each rank its own images
        mean = (ranks[0][key].astype(np.float64) + ranks[1][key]) / 2
        worst[part] = float((np.abs(mean - ref[key]) / ref[key]).max())
    print(f"\n[dist] distillation, 3 steps, 2 ranks x 8 vs 1 x 16: worst relative loss "
          f"difference {', '.join(f'{k} {v:.1e}' for k, v in worst.items())} (bound "
          f"{bound:.1e})")
    assert max(worst.values()) <= bound, worst


@pytest.mark.slow
def test_all_reducing_every_micro_batch_equals_all_reducing_once_per_step(trained_parameters):
    """``grad_accumulation_allreduce micro_batch`` (each of the 2 micro-batches' gradients
    all-reduced, then summed) against ``step`` (the sum all-reduced once, inside the branch
    that steps the optimizer), same data, clipping and EMA, 3 steps on 2 ranks: the
    all-reduce is linear, so the same parameters and averages to float32 rounding, and
    bit-identical on the two ranks."""
    per_step = trained_parameters["trainstep"]["ranks"][0]
    ranks = trained_parameters["microbatch"]["ranks"]
    names = [n for n in per_step.files if not n.startswith("init.")]
    assert len(names) == 2 * 62
    worst_update = 0.0
    for name in names:
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
        init = per_step["init." + name.removeprefix("ema.")]
        moved, moved_ref = ranks[0][name] - init, per_step[name] - init
        assert np.abs(moved_ref).max() > 0, name
        worst_update = max(worst_update, float(np.abs(moved - moved_ref).max()
                                               / np.abs(moved_ref).max()))
    print(f"\n[dist] all-reduce per micro-batch vs per step: worst rel diff of the updates "
          f"{worst_update:.2e}")
    assert worst_update < 1e-3


@pytest.mark.slow
def test_an_overflow_on_rank_1_alone_is_skipped_on_both_ranks_and_halves_the_scale(
        trained_parameters):
    """``TrainStep`` with a dynamic loss scale (1024) and the overflow check compiled in data
    parallel (its ``IsFinite`` path, which has CPU kernels), an inf in one soft target of rank
    1's batch at step 2: both ranks flag step 2 alone, leave the weights untouched at that
    step, halve the scale (1024 -> 512) and count one overflowed step; their weights stay
    bit-identical."""
    records = rank_records(trained_parameters, "overflow")
    print(f"\n[dist] inf on rank 1 at step 2: {records}")
    assert records[0] == records[1] == {"overflow": [False, True, False],
                                        "scale": [1024.0, 512.0, 512.0],
                                        "unchanged": [False, True, False],
                                        "overflow_count": 1}
    ranks = trained_parameters["overflow"]["ranks"]
    assert len(ranks[0].files) == 62
    for name in ranks[0].files:
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
        assert np.isfinite(ranks[0][name]).all(), name


def worker_log_lines(out, rank, text):
    """The lines of rank ``rank``'s msrun log (``out/logs/worker_R.log``) holding ``text``."""
    path = os.path.join(out, "logs", f"worker_{rank}.log")
    with open(path, encoding="utf-8", errors="replace") as f:
        return [line.rstrip("\n") for line in f if text in line]


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    """One data-parallel training run as two hosts on loopback (multi-host msrun through
    ``scripts/run_distribute_train_cpu.sh``, as documented: two launches, one worker each,
    node ranks 0 and 1), with --run_eval true, a weight EMA, LP-FT (fc alone in epoch 1,
    then layer4 too), the class-balanced sampler, TensorBoard and early stopping (4 epochs;
    patience 1 with a min_delta no rise reaches: fine-tuning's first evaluation, epoch 2, is
    the reference, so the run ends after epoch 3), over 160 training images
    (16 per class: each rank 80 draws, 5 steps of 16 per epoch) and an eval set whose size
    (199) does not divide by the ranks. Returns {"hosts": [(returncode, stdout, stderr) by
    node], "out": [host 0's output folder, host 1's], "eval_dir"}; rank R's msrun log is in
    ``out[R]/logs``."""
    root = tmp_path_factory.mktemp("two_hosts")
    train_dir = copy_class_folders(os.path.join(CIFAR_SAMPLE, "train"), str(root / "train"), 16)
    eval_dir = copy_class_folders(os.path.join(CIFAR_SAMPLE, "test"), str(root / "test"), 20)
    dropped = os.path.join(eval_dir, "cat")
    os.remove(os.path.join(dropped, sorted(os.listdir(dropped))[0]))  # 199 images
    port = free_port()
    env = python_first_env()
    common = ["--device_num", "1", "--worker_num", "2", "--master_addr", "127.0.0.1",
              "--master_port", str(port), "--cluster_time_out", "90"]
    # msrun starts the scheduler on the host that owns master_addr; on one machine both
    # "hosts" own 127.0.0.1, so the second host's launcher gets an msrun that answers as a
    # real second machine would (not the master) and starts workers only.
    not_master = root / "msrun_not_master"
    not_master.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "from mindspore.parallel.cluster.process_entity import _api\n"
        "_api._is_local_ip = lambda address: False\n"
        "from mindspore.parallel.cluster.run import main\nsys.exit(main())\n")
    not_master.chmod(0o755)
    outs = [root / f"host{node}" for node in range(2)]
    hosts = []
    for node in range(2):
        node_env = dict(env, MSRUN=str(not_master)) if node else env
        hosts.append(subprocess.Popen(
            ["bash", os.path.join(ROOT, "scripts", "run_distribute_train_cpu.sh"), *common,
             "--node_rank", str(node), train_dir, "configs/quick_start.yaml", str(outs[node]),
             "--eval_data_path", eval_dir, "--run_eval", "true", "--eval_interval", "1",
             "--epoch_size", "4", "--batch_size", "16", "--base_lr", "0.2",
             "--warmup_epochs", "0", "--ema_decay", "0.5", "--save_checkpoint_epochs", "1",
             "--log_interval", "2", "--linear_probe_epochs", "1", "--trainable_layers", "1",
             "--class_balance", "sampler", "--tensorboard", "true",
             "--early_stopping_patience", "1", "--early_stopping_min_delta", "0.99"],
            cwd=ROOT, env=node_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for h in hosts:
            stdout, stderr = h.communicate(timeout=LAUNCH_TIMEOUT)
            results.append((h.returncode, stdout, stderr))
    finally:
        for h in hosts:
            if h.poll() is None:
                h.kill()
    return {"hosts": results, "out": outs, "eval_dir": eval_dir}


@pytest.mark.slow
def test_two_hosts_on_loopback(two_hosts):
    """Multi-host msrun, as documented: two launches, one worker each, node ranks 0 and 1
    (the run of ``two_hosts``): both exit 0, the global batch spans the two hosts, rank 0
    alone saves."""
    for code, stdout, stderr in two_hosts["hosts"]:
        assert code == 0, stdout[-1500:] + stderr[-1500:]
    host0, host1 = two_hosts["out"]
    assert "16 per device x 2 devices" in (host0 / "train.log").read_text()
    assert (host0 / "resnet18-2_5.ckpt").exists()  # rank 0 saves
    assert (host0 / "resnet18-best.ckpt").exists()
    assert not list(host1.glob("*.ckpt"))  # rank 1 does not (nor its best)


@pytest.mark.slow
def test_data_parallel_evaluation_counts_each_image_once_and_rank0_keeps_the_best(
        two_hosts, tmp_path):
    """train.py on 2 ranks (the run of ``two_hosts``) with --run_eval true, a weight EMA,
    LP-FT (fc alone in epoch 1, then layer4 too) and the class-balanced sampler, over an
    eval set whose size (199) does not divide by the ranks: both ranks exit 0 and log the
    same figures (so take the same "best" decisions), exactly one best checkpoint, and
    eval.py in one process reproduces metrics.jsonl's top-1/top-5 (live, EMA, best) over the
    same 199 images."""
    for code, stdout, stderr in two_hosts["hosts"]:
        assert code == 0, stdout[-2000:] + stderr[-3000:]
    out, eval_dir = two_hosts["out"][0], two_hosts["eval_dir"]
    logs = two_hosts["out"]  # rank R's msrun log: in host R's folder
    for rank in range(2):
        assert not worker_log_lines(logs[rank], rank, "Traceback")
        # LP-FT in data parallel: the all-reduce split fits fc alone, then layer4 + fc
        assert worker_log_lines(logs[rank], rank, "fused in groups split at [1] of 2 trainable")
        assert worker_log_lines(logs[rank], rank,
                                "fused in groups split at [9, 16] of 17 trainable")
        assert worker_log_lines(logs[rank], rank, "LP-FT: linear probe done after 5 steps")
    # the class-balanced sampler, sharded: each rank 80 of the 160 draws, 5 batches of 16
    assert "epoch 1/4 step 5/5" in out.joinpath("train.log").read_text()
    assert sorted(p.name for p in out.iterdir() if "best" in p.name) == ["resnet18-best.ckpt"]
    records = [json.loads(line) for line in open(out / "metrics.jsonl", encoding="utf-8")]
    records = [r for r in records if "event" not in r]  # the early stop's: test below
    assert [r["epoch"] for r in records] == [1, 2, 3]
    # every rank computed the same figures, so took the same "best" decisions
    evaluated = ("top1", "top5", "eval_loss", "ema_top1", "ema_top5", "ema_eval_loss",
                 "best_top1", "eval_images")
    for rank in range(2):
        logged = [json.loads(line.split(" done: ", 1)[1])
                  for line in worker_log_lines(logs[rank], rank, " done: {")]
        assert [{k: r.get(k) for k in evaluated} for r in logged] == [
            {k: r.get(k) for k in evaluated} for r in records], rank
    assert all(r["eval_images"] == 199 for r in records), records
    # TensorBoard from rank 0 alone: one events file, its losses rank 0's progress lines',
    # its evaluations metrics.jsonl's (tensorboard true)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert not list(logs[1].glob("**/events.out.tfevents.*"))  # rank 1's folder: none
    reader = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0,
                                                                       "images": 0})
    reader.Reload()
    losses = [(e.step, round(e.value, 4)) for e in reader.Scalars("train/loss")]
    lines = [line.split("(global ", 1)[1] for line in worker_log_lines(out, 0, " loss ")
             if "(global " in line]
    # log_interval 2 over 5 steps an epoch: steps 2, 4 and the epoch's last, 3 epochs
    assert len(losses) == 9 and losses == [
        (int(x.split(")")[0]), float(x.split(" loss ")[1].split()[0])) for x in lines]
    for key, tag in (("top1", "top1"), ("ema_top1", "ema_top1"), ("best_top1", "best_top1"),
                     ("eval_loss", "loss"), ("ema_eval_loss", "ema_loss")):
        assert [(e.step, e.value) for e in reader.Scalars(f"eval/{tag}")] == [
            (r["step"], float(np.float32(r[key]))) for r in records], key
    # the confusion matrix (summed over the ranks) at the first evaluation, a new best
    assert reader.Images("eval/confusion_matrix")[0].step == records[0]["step"]
    last = records[-1]
    assert last["best_top1"] == max(r["top1"] for r in records)

    def eval_py(ckpt, use_ema):  # in this process, from tmp_path (rejected images land there)
        folder = tmp_path / f"eval_{os.path.basename(ckpt)}_{use_ema}"
        succeeded(run_in_process(
            "eval.py", "--config_path", os.path.join(ROOT, "configs", "quick_start.yaml"),
            "--data_path", eval_dir, "--checkpoint_path", ckpt, "--use_ema", use_ema,
            "--output_dir", str(folder), cwd=tmp_path))
        return json.load(open(folder / "eval_result.json", encoding="utf-8"))

    best = max(records, key=lambda r: r["top1"])  # the first of equals: it is not replaced
    for ckpt, use_ema, prefix, record in ((out / "resnet18-3_5.ckpt", "false", "", last),
                                          (out / "resnet18-3_5.ckpt", "true", "ema_", last),
                                          (out / "resnet18-best.ckpt", "false", "", best)):
        report = eval_py(str(ckpt), use_ema)
        print(f"\n[dist eval] {ckpt.name} use_ema {use_ema}: eval.py top-1 {report['top1']} "
              f"top-5 {report['top5']} over {report['images']} images; metrics.jsonl epoch "
              f"{record['epoch']} {prefix}top1 {record[prefix + 'top1']} {prefix}top5 "
              f"{record[prefix + 'top5']}")
        assert report["images"] == 199
        for k in ("top1", "top5"):
            assert report[k] == pytest.approx(record[prefix + k], abs=1e-12), (k, record)


@pytest.mark.slow
def test_two_ranks_stop_early_together_counting_from_fine_tuning(two_hosts):
    """Early stopping on 2 ranks (the run of ``two_hosts``: LP-FT's probe in epoch 1, patience
    1, a min_delta no rise reaches, 4 epochs): both ranks end after epoch 3, each saying why
    with the best checkpoint; rank 0 saves that epoch's checkpoint with the count and records
    the reason last in metrics.jsonl; nothing of epoch 4 is trained."""
    out, logs = two_hosts["out"][0], two_hosts["out"]
    for rank in range(2):
        lines = worker_log_lines(logs[rank], rank, "early stopping after epoch ")
        assert len(lines) == 1 and "after epoch 3: top1" in lines[0], (rank, lines)
        assert "(epoch 2) by more than 0.99 for 1 epochs" in lines[0]
        assert "resnet18-best.ckpt" in lines[0]
        assert not worker_log_lines(logs[rank], rank, "epoch 4/4")
    event = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert {k: event[k] for k in ("event", "epoch", "reference_epoch", "patience")} == {
        "event": "early_stop", "epoch": 3, "reference_epoch": 2, "patience": 1}
    assert sorted(p.name for p in out.glob("resnet18-*_5.ckpt"))[-1] == "resnet18-3_5.ckpt"
    stored = stored_best(read_checkpoint(str(out / "resnet18-3_5.ckpt")))
    assert stored["early_stop"]["stopped"] == 3 and stored["early_stop"]["epoch"] == 2


def worker_pids(marker):
    """PIDs of train.py worker processes (not msrun's scheduler, which runs the same script)
    whose command line contains ``marker``."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if (len(argv) > 1 and argv[1].endswith(b"train.py") and marker.encode() in b" ".join(argv)
                and b"MS_ROLE=MS_WORKER" in environ):
            pids.append(int(pid))
    return pids


def rank_of(pid):
    """The RANK_ID msrun gave worker ``pid``."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        environ = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    return int(environ[b"RANK_ID"])


def faulty_launch(out, train_dir, *train_args, fault=()):
    """train.py on 2 msrun workers (as ``scripts/run_distribute_train_cpu.sh`` starts it) through
    ``tests/rank_fault.py`` (``fault``: its options), which prints each rank's exit status;
    quick_start.yaml on the class folders ``train_dir``, logs in ``out/logs``. Returns the
    Popen."""
    msrun = os.path.join(os.path.dirname(sys.executable), "msrun")
    return subprocess.Popen(
        [msrun, "--worker_num", "2", "--local_worker_num", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(free_port()), "--log_dir", str(out / "logs"), "--join", "True",
         "--cluster_time_out", "60", os.path.join(ROOT, "tests", "rank_fault.py"), *fault,
         os.path.join(ROOT, "train.py"), "--device_target", "CPU", "--run_distribute", "true",
         "--device_num", "2", "--data_path", train_dir,
         "--config_path", "configs/quick_start.yaml", "--output_dir", str(out),
         "--batch_size", "32", "--warmup_epochs", "0", "--log_interval", "1", *train_args],
        cwd=ROOT, env=python_first_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def stop_lines(out):
    """Each rank's exit status (as ``tests/rank_fault.py`` printed it) and its lines of the
    stop: ``[(status, [lines]), ...]`` by rank."""
    ranks = []
    for rank in range(2):
        status = worker_log_lines(out, rank, f"rank {rank} exit status ")
        lines = [re.sub(r"^[\d:]+ rank\d \w+ ", "", line)
                 for line in worker_log_lines(out, rank, "stopp")]
        ranks.append((int(status[-1].rsplit(" ", 1)[1]) if status else None, lines))
    return ranks


def end_launch(proc, out):
    """SIGKILL the launch ``proc`` if it still runs, and any worker of ``out`` left."""
    if proc.poll() is None:
        proc.kill()
    for pid in worker_pids(str(out)):
        os.kill(pid, signal.SIGKILL)
    proc.wait()


def finish(proc, out, timeout):
    """Wait for the launch ``proc`` (ended by ``end_launch`` if it outlives ``timeout`` s);
    returns (stdout, stderr)."""
    try:
        return proc.communicate(timeout=timeout)
    finally:
        end_launch(proc, out)


def launch_killing_a_worker(root, attempts=2):
    """SIGKILL to one worker while both train (after their first step, so the other waits in
    a collective): quick_start.yaml on 70 images (1 step of 2 x 32 per epoch, 100 epochs).
    A launch whose cluster never formed (its workers could not reach the scheduler: seen once
    among several launches starting together) is launched again, on another port, once.
    Returns {"returncode", "stderr", "elapsed": s from the kill to the launch's end, "out"}."""
    train_dir = copy_class_folders(os.path.join(CIFAR_SAMPLE, "train"), str(root / "t"), 7)
    for attempt in range(attempts):
        out = root / f"killed{attempt or ''}"
        proc = subprocess.Popen(
            ["bash", os.path.join(ROOT, "scripts", "run_distribute_train_cpu.sh"),
             "--master_port", str(free_port()), "--cluster_time_out", "30", train_dir,
             "configs/quick_start.yaml", str(out), "--epoch_size", "100", "--run_eval",
             "false", "--log_interval", "1"],
            cwd=ROOT, env=python_first_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        deadline, trained = time.time() + 240, False
        while time.time() < deadline and not trained:  # both ranks train (a step line)
            logs = [out / "logs" / f"worker_{r}.log" for r in range(2)]
            trained = all(p.exists() and "(global " in p.read_text(errors="replace")
                          for p in logs)
            time.sleep(0 if trained else 0.2)
        if trained or attempt == attempts - 1:
            break
        end_launch(proc, out)  # never formed: no step logged by both ranks
    try:
        pids = worker_pids(str(out))
        assert len(pids) == 2, f"expected 2 workers, found {pids}"
        killed_at = time.time()
        os.kill(max(pids), signal.SIGKILL)
    except BaseException:
        end_launch(proc, out)
        raise
    _, stderr = finish(proc, out, 300)
    return {"returncode": proc.returncode, "stderr": stderr, "out": out,
            "elapsed": time.time() - killed_at}


def launch_sigterm_to_rank_1(root):
    """SIGTERM to rank 1 alone once both ranks logged global step 3: quick_start.yaml on 320
    images, batch 16, 2 accumulated micro-batches (5 optimizer steps of 2 ranks x 2 x 16 per
    epoch), 50 epochs. Returns {"returncode", "stdout", "stderr", "out"}."""
    out = root / "sig"
    train_dir = copy_class_folders(os.path.join(CIFAR_SAMPLE, "train"), str(root / "t"), 32)
    proc = subprocess.Popen(
        ["bash", os.path.join(ROOT, "scripts", "run_distribute_train_cpu.sh"), "--master_port",
         str(free_port()), "--cluster_time_out", "60", train_dir,
         "configs/quick_start.yaml", str(out), "--epoch_size", "50", "--run_eval", "false",
         "--log_interval", "1", "--batch_size", "16", "--grad_accumulation_steps", "2"],
        cwd=ROOT, env=python_first_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline:  # wait until both ranks have trained a few steps
            logs = [out / "logs" / f"worker_{r}.log" for r in range(2)]
            if all(p.exists() and "(global 3)" in p.read_text(errors="replace") for p in logs):
                break
            time.sleep(0.2)
        pids = {rank_of(pid): pid for pid in worker_pids(str(out))}
        assert sorted(pids) == [0, 1], pids
        os.kill(pids[1], signal.SIGTERM)
    except BaseException:
        end_launch(proc, out)
        raise
    stdout, stderr = finish(proc, out, 240)
    return {"returncode": proc.returncode, "stdout": stdout, "stderr": stderr, "out": out}


def launch_with_a_nan_on_rank_1(root):
    """Rank 1's third batch with NaN soft targets (mixup, ``tests/rank_fault.py``), 320 images:
    5 steps of 2 x 32, a checkpoint every 2 steps. Returns {"returncode", "stdout", "stderr",
    "out"}."""
    out = root / "nan"
    train_dir = copy_class_folders(os.path.join(CIFAR_SAMPLE, "train"), str(root / "t"), 32)
    proc = faulty_launch(out, train_dir, "--epoch_size", "1", "--run_eval", "false",
                         "--mixup_alpha", "0.2", "--save_checkpoint_steps", "2",
                         fault=("--nan_rank", "1", "--nan_batch", "3"))
    stdout, stderr = finish(proc, out, LAUNCH_TIMEOUT)
    return {"returncode": proc.returncode, "stdout": stdout, "stderr": stderr, "out": out}


# Makes a folder (with a file in it) where the checkpoint LAST goes as soon as FIRST exists;
# a process of its own, so that the moment does not wait for the test process (its threads
# share one interpreter lock with whatever the module's other tests run meanwhile).
BLOCK_WHEN = """import os, sys, time
first, last, deadline = sys.argv[1], sys.argv[2], time.time() + float(sys.argv[3])
while not os.path.exists(first) and time.time() < deadline:
    time.sleep(0.05)
os.mkdir(last)
open(os.path.join(last, "keep"), "w").close()
"""


# A randomly initialized 10-class ResNet-18 saved as a .ckpt at argv[1]: a distillation teacher.
WRITE_TEACHER = """import sys
import mindspore as ms
from src.models.resnet import create_network
ms.set_seed(7)
ms.save_checkpoint(create_network("resnet18", class_num=10), sys.argv[1])
"""


def file_sha256(path):
    import hashlib
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def launch_with_an_unwritable_last_checkpoint(root):
    """Rank 0's last checkpoint (step 8) cannot be written: a folder stands where the file
    goes, made once the checkpoint of step 2 exists (6 steps and an evaluation ahead); 260
    images: 4 steps of 2 x 32 per epoch, 2 epochs, an evaluation each. The run distils from a
    ResNet-18 teacher (``teacher``, a .ckpt written first; ``teacher_sha256`` its file's
    digest then) and each rank saves its training cell's parameters when ``Model.train``
    returns (``params``: ``rank{R}.npz``, ``tests/rank_fault.py``). Returns {"returncode",
    "stdout", "stderr", "out", "teacher", "teacher_sha256", "params"}."""
    train_dir = copy_class_folders(os.path.join(CIFAR_SAMPLE, "train"), str(root / "t"), 26)
    eval_dir = copy_class_folders(os.path.join(CIFAR_SAMPLE, "test"), str(root / "e"), 5)
    out, params, teacher = root / "unwritable", root / "params", root / "teacher.ckpt"
    subprocess.run([sys.executable, "-c", WRITE_TEACHER, str(teacher)], cwd=ROOT, check=True,
                   capture_output=True, timeout=LAUNCH_TIMEOUT)
    teacher_sha256 = file_sha256(teacher)
    first, last = (out / checkpoint_name("resnet18", step, 4) for step in (2, 8))
    blocker = subprocess.Popen([sys.executable, "-c", BLOCK_WHEN, str(first), str(last),
                                str(LAUNCH_TIMEOUT)])
    proc = faulty_launch(out, train_dir, "--eval_data_path", eval_dir,
                         "--epoch_size", "2", "--run_eval", "true", "--eval_interval", "1",
                         "--save_checkpoint_steps", "2", "--save_checkpoint_epochs", "1",
                         "--kd_teacher", str(teacher), "--task_loss_weight", "0.5",
                         fault=("--save_params", str(params)))
    try:
        stdout, stderr = finish(proc, out, LAUNCH_TIMEOUT)
    finally:
        if blocker.poll() is None:
            blocker.kill()
        blocker.wait()
    return {"returncode": proc.returncode, "stdout": stdout, "stderr": stderr, "out": out,
            "teacher": teacher, "teacher_sha256": teacher_sha256, "params": params}


# The launches of the fault scenarios, by the test that checks each (a launch named twice runs
# once, for both tests).
FAULT_LAUNCHES = {
    "test_a_killed_worker_fails_the_launch_quickly": launch_killing_a_worker,
    "test_sigterm_to_one_worker_stops_every_rank_after_the_same_step_and_rank0_saves_it":
        launch_sigterm_to_rank_1,
    "test_a_nan_on_rank_1_alone_stops_both_ranks_with_status_3_after_that_step":
        launch_with_a_nan_on_rank_1,
    "test_a_checkpoint_rank_0_cannot_write_at_the_last_step_stops_both_ranks_with_status_4":
        launch_with_an_unwritable_last_checkpoint,
    "test_two_ranks_distill_each_from_its_own_frozen_teacher":
        launch_with_an_unwritable_last_checkpoint,
}


@pytest.fixture(scope="module", autouse=True)
def fault_launches(request, tmp_path_factory):
    """The launches of ``FAULT_LAUNCHES`` whose tests are selected, started together in
    background threads before the module's first test, each in its own folder on its own
    port: their ranks spend much of a launch waiting (the collective start-up, msrun's
    heartbeat time-out after a stop), and those waits overlap the module's other tests.
    Yields {test name: a Future of its launch's result}; ends once every launch has."""
    selected = {item.name for item in request.session.items
                if getattr(item, "module", None) is request.module}
    launches = {name: launch for name, launch in FAULT_LAUNCHES.items() if name in selected}
    if not launches:
        yield {}
        return
    with ThreadPoolExecutor(max_workers=len(launches)) as pool:
        started = {}
        for launch in launches.values():
            if launch not in started:
                started[launch] = pool.submit(launch, tmp_path_factory.mktemp("fault"))
        yield {name: started[launch] for name, launch in launches.items()}


@pytest.mark.slow
def test_a_killed_worker_fails_the_launch_quickly(fault_launches):
    """SIGKILL to one worker while both train (after their first step, so the other waits in
    a collective): the launcher fails, naming the logs, well within the cluster time-out."""
    run = fault_launches["test_a_killed_worker_fails_the_launch_quickly"].result()
    print(f"\n[dist] launch exited {run['returncode']} {run['elapsed']:.0f} s after a worker "
          f"was killed")
    assert run["returncode"] != 0
    assert "distributed training failed" in run["stderr"]
    assert str(run["out"] / "logs") in run["stderr"]
    assert run["elapsed"] < 240


@pytest.mark.slow
def test_sigterm_to_one_worker_stops_every_rank_after_the_same_step_and_rank0_saves_it(
        fault_launches):
    """SIGTERM to rank 1 only (which writes nothing): the ranks agree at the step's end, every
    rank stops after that same step, rank 0 saves it, each exits 143 with a line naming the
    signal and the rank, and the launcher reports the stop (status 143). With gradient
    accumulation over 2 micro-batches (2 calls of the training cell per optimizer step): the
    signal may come between them, the ranks still agree and stop after an optimizer step."""
    run = fault_launches[
        "test_sigterm_to_one_worker_stops_every_rank_after_the_same_step_and_rank0_saves_it"
    ].result()
    out, stdout, stderr = run["out"], run["stdout"], run["stderr"]
    stopped = [worker_log_lines(out, r, "stopped by SIGTERM at global step") for r in range(2)]
    print(f"\n[dist] SIGTERM to rank 1: {stopped}; launcher: {stderr.strip()[-300:]}")
    assert all(len(lines) == 1 for lines in stopped), stdout[-1500:] + stderr[-3000:]
    steps = [int(lines[0].split("at global step ")[1].split(",")[0]) for lines in stopped]
    assert steps[0] == steps[1] > 3  # the same step on both ranks, in the middle of training
    # 320 images: 5 optimizer steps of 2 ranks x 2 micro-batches x 16 per epoch
    ckpt = out / checkpoint_name("resnet18", steps[0], 5)
    assert ckpt.exists(), sorted(os.listdir(out))
    saved = ms.load_checkpoint(str(ckpt))
    assert int(saved["global_step"].asnumpy()) == steps[0]
    assert not [n for n in saved if n.startswith("grad_accum")]
    assert f"saved {ckpt}" in stopped[0][0] and f"saved {ckpt}" in stopped[1][0]
    for rank in range(2):
        assert worker_log_lines(out, rank, "rank 1 received SIGTERM"), rank
        assert not worker_log_lines(out, rank, "Traceback"), rank
    assert f"stopped by SIGTERM at global step {steps[0]}" in stderr
    assert run["returncode"] == 128 + signal.SIGTERM, stderr[-2000:]


@pytest.mark.slow
def test_a_nan_on_rank_1_alone_stops_both_ranks_with_status_3_after_that_step(fault_launches):
    """Rank 1's third batch has NaN soft targets (mixup; ``tests/rank_fault.py``; rank 0's
    data is clean, so its own loss at that step is finite): the ranks agree on the stop in
    the step's exchange, both stop after global step 3 and exit 3 (not one exiting while the
    other waits in the next all-reduce until msrun kills it); rank 0 names its checkpoint of
    step 2 as the last good one, rank 1 its own non-finite loss."""
    run = fault_launches[
        "test_a_nan_on_rank_1_alone_stops_both_ranks_with_status_3_after_that_step"].result()
    out = run["out"]
    (status0, lines0), (status1, lines1) = stop_lines(out)
    print(f"\n[dist] NaN on rank 1: rank 0 exit {status0} {lines0}\n rank 1 exit {status1} "
          f"{lines1}")
    last_good = out / checkpoint_name("resnet18", 2, 5)
    assert (status0, status1) == (3, 3), run["stdout"][-1500:] + run["stderr"][-1500:]
    assert last_good.exists() and not (out / checkpoint_name("resnet18", 3, 5)).exists()
    agreed = "stopping every rank after global step 3: rank 1 stopped (non-finite loss)"
    assert any(agreed in line for line in lines0) and any(agreed in line for line in lines1)
    assert (f"stopped: rank 1 stopped training (non-finite loss), every rank after global "
            f"step 3; last good checkpoint: {last_good}") in lines0
    assert ("stopped: non-finite loss at global step 3; last good checkpoint: named by "
            "rank 0") in lines1
    for rank in range(2):
        assert not worker_log_lines(out, rank, "(global 4)"), rank  # no step after it
        assert not worker_log_lines(out, rank, "Traceback"), rank
    assert run["returncode"] != 0


@pytest.mark.slow
def test_a_checkpoint_rank_0_cannot_write_at_the_last_step_stops_both_ranks_with_status_4(
        fault_launches):
    """Rank 0's last checkpoint (step 8, after the evaluation of epoch 2, which has
    collectives of its own) cannot be written: a folder stands where the file goes, made
    while the run trains (once the checkpoint of step 2 exists: 6 steps and an evaluation
    ahead). The ranks agree on it at the exchange that ends the epoch: both exit 4 (rank 1
    would otherwise end 0, the run complete for it); rank 0 names the checkpoint of step 6
    as the last good one, rank 1 says rank 0 stopped and why."""
    run = fault_launches[
        "test_a_checkpoint_rank_0_cannot_write_at_the_last_step_stops_both_ranks_with_status_4"
    ].result()
    out = run["out"]
    good, last = (out / checkpoint_name("resnet18", step, 4) for step in (6, 8))
    (status0, lines0), (status1, lines1) = stop_lines(out)
    print(f"\n[dist] checkpoint not written on rank 0: rank 0 exit {status0} {lines0}\n rank 1 "
          f"exit {status1} {lines1}")
    assert (status0, status1) == (4, 4), run["stdout"][-1500:] + run["stderr"][-1500:]
    agreed = ("stopping every rank after global step 8: rank 0 stopped (a file not written: "
              "a checkpoint, metrics.jsonl or train.log)")
    assert any(agreed in line for line in lines0) and any(agreed in line for line in lines1)
    assert any(line.startswith(f"stopped: cannot write checkpoint {last}: ") and line.endswith(
        f"; last good checkpoint: {good}") for line in lines0), lines0
    assert ("stopped: rank 0 stopped training (a file not written: a checkpoint, metrics.jsonl "
            "or train.log), every rank after global step 8; last good checkpoint: named by "
            "rank 0") in lines1
    records = [json.loads(line) for line in open(out / "metrics.jsonl", encoding="utf-8")]
    assert [r["epoch"] for r in records] == [1, 2]  # both evaluations ran on both ranks
    for rank in range(2):
        assert not worker_log_lines(out, rank, "Traceback"), rank


@pytest.mark.slow
def test_two_ranks_distill_each_from_its_own_frozen_teacher(fault_launches):
    """Knowledge distillation in data parallel (the launch of the unwritable checkpoint above,
    with ``--kd_teacher`` a ResNet-18 .ckpt and ``--task_loss_weight 0.5``): both ranks train
    with the teacher (task and distillation losses in their progress lines and in
    metrics.jsonl); after the 8 steps the two ranks hold bit-identical student parameters and
    optimizer state (the gradients all-reduced) though their batches differed (their last
    loss parts differ); each rank's teacher tensors are still the file's (frozen, BatchNorm
    statistics too: the teacher is not in the optimizer, so not in the all-reduce), the file
    is unchanged, and rank 0's checkpoint holds the student alone."""
    run = fault_launches["test_two_ranks_distill_each_from_its_own_frozen_teacher"].result()
    out = run["out"]
    for rank in range(2):
        lines = [line for line in worker_log_lines(out, rank, "(global ") if " loss " in line]
        assert len(lines) == 8, (rank, lines)  # log_interval 1: every step
        assert all(" task_loss " in line and " distill_loss " in line for line in lines), lines
    records = [json.loads(line) for line in open(out / "metrics.jsonl", encoding="utf-8")]
    assert [r["epoch"] for r in records] == [1, 2]
    for r in records:
        assert np.isfinite(r["task_loss"]) and r["distill_loss"] > 0, r
    ranks = [np.load(run["params"] / f"rank{r}.npz") for r in range(2)]
    assert sorted(ranks[0].files) == sorted(ranks[1].files)
    teacher = {name: t.asnumpy() for name, t in ms.load_checkpoint(str(run["teacher"])).items()}
    in_cell = [n for n in ranks[0].files if n.startswith("kd_teacher.")]
    assert sorted(n.removeprefix("kd_teacher.") for n in in_cell) == sorted(teacher)
    # no optimizer state (nor anything else) of the teacher's: not in the optimizer
    assert not [n for n in ranks[0].files if "kd_teacher." in n and n not in in_cell]
    # per rank: the last step's loss parts and the student's BatchNorm statistics (each rank
    # its own batches; not all-reduced, as without a teacher)
    own = [n for n in ranks[0].files if n.startswith("kd_loss.")
           or n.endswith((".moving_mean", ".moving_variance")) and n not in in_cell]
    assert len(own) == 2 + 2 * 20
    assert all((ranks[0][n] != ranks[1][n]).any() for n in own)
    student = [n for n in ranks[0].files if not n.startswith("kd_teacher.") and n not in own]
    assert "conv1.weight" in student and "moments.fc.weight" in student
    for name in student:
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
    for name in in_cell:
        for rank in range(2):
            np.testing.assert_array_equal(ranks[rank][name],
                                          teacher[name.removeprefix("kd_teacher.")],
                                          err_msg=f"rank {rank} {name}")
    assert file_sha256(run["teacher"]) == run["teacher_sha256"]
    saved = ms.load_checkpoint(str(out / checkpoint_name("resnet18", 6, 4)))
    assert "conv1.weight" in saved
    assert not [n for n in saved if n.startswith(("kd_teacher.", "kd_loss."))]


def test_launcher_usage_and_argument_errors(tmp_path):
    result = launcher()
    assert result.returncode == 2 and "usage: bash" in result.stderr
    result = launcher(tmp_path / "nope", "configs/quick_start.yaml", tmp_path / "out")
    assert result.returncode == 2 and "is not a folder" in result.stderr
    result = launcher("--device_num", "two", "data", "configs/quick_start.yaml", tmp_path)
    assert result.returncode == 2 and "device_num must be an integer" in result.stderr


def test_fusion_config_is_checked_against_the_network():
    check_fusion_config([85, 160], 161, "resnet50")
    with pytest.raises(ValueError, match=r"within \[1, 61\] \(62 trainable tensors\).*33,61"):
        check_fusion_config([85, 160], 62, "resnet18")
    with pytest.raises(ValueError, match="strictly increasing"):
        check_fusion_config([100, 50], 161, "resnet50")
    assert fusion_config_for(161) == [85, 160]
    # fine-tuning: fc alone (2 tensors), fc + one BatchNorm'd layer, a single tensor
    assert [fusion_config_for(n) for n in (2, 3, 1)] == [[1], [2], []]
    for n in (2, 3, 17):
        check_fusion_config(fusion_config_for(n), n, "resnet18")


@pytest.mark.parametrize("net_name, split", [("resnet18", [33, 61]), ("resnet34", [58, 109]),
                                             ("resnet50", [85, 160]),
                                             ("resnet101", [166, 313])])
def test_the_default_fusion_split_is_chosen_for_the_network(net_name, split):
    # before: [85, 160] whatever the network, so --net_name resnet18 stopped with an error
    import mindspore as ms

    from src.models.resnet import create_network
    from src.utils.device import apply_fusion_config
    tensors = len(create_network(net_name, class_num=10).trainable_params())
    try:
        assert apply_fusion_config([], tensors, net_name) == split
        assert ms.get_auto_parallel_context("all_reduce_fusion_config") == split
        with pytest.raises(ValueError, match="does not fit"):
            apply_fusion_config([tensors, tensors + 5], tensors, net_name)  # explicit: checked
    finally:
        ms.reset_auto_parallel_context()


# ---- the collective stop and the sharded evaluation, one process standing in for the ranks ----

class Params(dict):
    """Stands in for ``RunContext.original_args()``."""
    __getattr__ = dict.__getitem__


def test_a_signal_on_one_rank_stops_every_rank_after_the_same_step():
    from mindspore.train import RunContext

    from src.training.signals import StopSignals

    log = logging.getLogger("test")
    peer = [0]  # the other rank's signal number in the exchange (0: none)
    exits = []
    rank0 = StopSignals(log, exit_now=exits.append, gather=lambda mine: [mine, peer[0]])
    context = RunContext(Params())
    rank0.on_train_step_end(context)
    assert rank0.received is None and not context.get_stop_requested()
    peer[0] = signal.SIGTERM  # rank 1 got SIGTERM during this step
    rank0.on_train_step_end(context)
    assert rank0.received == "SIGTERM" and rank0.signum == 143 - 128
    assert context.get_stop_requested() and rank0.own is None
    rank0._handle(signal.SIGINT, None)  # its own first signal, while rank 0 saves: not an exit
    assert exits == [] and rank0.received == "SIGTERM"
    rank0._handle(signal.SIGINT, None)  # its own second one
    assert exits == [128 + signal.SIGINT]

    rank1 = StopSignals(log, gather=lambda mine: [0, mine])
    rank1._handle(signal.SIGTERM, None)
    assert rank1.own == "SIGTERM" and rank1.received is None  # noted, not acted on alone
    context = RunContext(Params())
    rank1.on_train_step_end(context)
    assert rank1.received == "SIGTERM" and context.get_stop_requested()


def on_two_ranks(calls):
    """Run ``calls[r]()`` on one thread per rank (their exchanges meet: ``ThreadGather``)."""
    import threading
    threads = [threading.Thread(target=call) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), "a rank waits in a collective"


def test_a_failure_on_one_rank_is_agreed_and_stops_every_rank_after_the_same_step():
    """The failures ride the signals' exchange (one int per rank): a non-finite loss noted
    on rank 1 before the step's exchange stops both ranks at that exchange; a write failure
    on rank 0 after it stops no rank alone (the others would wait for it in the next
    collective) but at the exchange that ends the epoch (``FailureAgreement``)."""
    from mindspore.train import RunContext

    from src.training.callbacks import NONFINITE_LOSS, NOT_WRITTEN, StepState
    from src.training.signals import StopSignals
    from tests.test_train_safety import ThreadGather

    log = logging.getLogger("test")
    group, sent = ThreadGather(2), []

    def rank(r):
        def gather(mine):
            sent.append((r, mine))
            return group.gather(r, mine)
        state, stop = StepState(start_step=5), StopSignals(log, gather=gather)
        stop.install = lambda: None  # signal handlers: the main thread's only
        return state, stop, stop.watch(state), RunContext(Params())

    ranks = [rank(0), rank(1)]
    state1, _, _, context1 = ranks[1]
    state1.nonfinite_step = 5
    state1.fail(NONFINITE_LOSS, context1)  # before the exchange, as StepState does
    assert not context1.get_stop_requested() and not state1.must_stop  # not alone
    on_two_ranks([lambda s=s, c=c: s.on_train_step_end(c) for _, s, _, c in ranks])
    assert sorted(sent) == [(0, 0), (1, StopSignals.REASON_UNIT * NONFINITE_LOSS)]
    for state, _, _, context in ranks:
        assert state.stopped_by == (1, NONFINITE_LOSS, 5) and state.must_stop
        assert context.get_stop_requested()

    sent.clear()
    ranks = [rank(0), rank(1)]
    state0, _, _, context0 = ranks[0]
    state0.fail(NOT_WRITTEN, context0)  # rank 0's saver, after the step's exchange
    assert not context0.get_stop_requested() and not state0.must_stop
    on_two_ranks([lambda a=a, c=c: a.on_train_epoch_end(c) for _, _, a, c in ranks])
    assert sorted(sent) == [(0, StopSignals.REASON_UNIT * NOT_WRITTEN), (1, 0)]
    for state, _, _, context in ranks:
        assert state.stopped_by == (0, NOT_WRITTEN, 5) and context.get_stop_requested()
        assert state.must_stop  # so every rank skips the evaluation and the saves
    on_two_ranks([lambda a=a, c=c: a.on_train_epoch_end(c) for _, _, a, c in ranks])
    assert len(sent) == 2  # agreed: nothing more exchanged


def test_every_rank_exits_with_the_agreed_status_and_the_others_name_the_rank(caplog):
    """finish(): rank 1, which wrote nothing and had no failure of its own, exits 4 with a
    line naming rank 0 and its reason; rank 0 names its failure and the last good
    checkpoint and exits 4 too; a non-finite loss on rank 1 makes rank 0 exit 3."""
    from types import SimpleNamespace

    from src.training.callbacks import NONFINITE_LOSS, NOT_WRITTEN, StepState
    from src.training.loop import EXIT_NONFINITE, EXIT_SAVE_FAILED, TrainCallbacks
    from src.training.loop import finish as loop_finish

    def finish(rank, stopped_by, failure=None):
        state = StepState(start_step=8)
        state.agreed, state.stopped_by = True, stopped_by
        saver = SimpleNamespace(error=None, diverged=False, write=rank == 0,
                                last_saved="out/resnet18-1_6.ckpt" if rank == 0 else None)
        monitor = SimpleNamespace(error=None)
        if failure:
            state.failure, saver.error = NOT_WRITTEN, failure
        stop = SimpleNamespace(received=None)
        caplog.clear()
        status = loop_finish(TrainCallbacks(state=state, saver=saver, monitor=monitor),
                             stop, 100, "out", logging.getLogger("test"))
        return status, caplog.text

    with caplog.at_level(logging.INFO):
        status, text = finish(1, (0, NOT_WRITTEN, 8))
        assert status == EXIT_SAVE_FAILED
        assert "rank 0 stopped training (a file not written" in text
        assert "after global step 8; last good checkpoint: named by rank 0" in text
        status, text = finish(0, (0, NOT_WRITTEN, 8), "cannot write checkpoint x.ckpt")
        assert status == EXIT_SAVE_FAILED and "rank 0 stopped" not in text
        assert "stopped: cannot write checkpoint x.ckpt; last good checkpoint: " \
               "out/resnet18-1_6.ckpt" in text
        status, text = finish(0, (1, NONFINITE_LOSS, 3))
        assert status == EXIT_NONFINITE
        assert "rank 1 stopped training (non-finite loss), every rank after global step 3; " \
               "last good checkpoint: out/resnet18-1_6.ckpt" in text


def test_every_rank_waits_for_rank0s_save_of_a_stop_and_learns_its_outcome(tmp_path):
    from mindspore import nn
    from mindspore.train import RunContext

    from src.training.callbacks import StepState
    from src.training.saver import CheckpointSaver
    from src.training.signals import StopSignals

    log = logging.getLogger("test")
    path = str(tmp_path / checkpoint_name("net", 7, 10))
    exchanged = []

    def saver_of(rank, rank0_wrote):
        def gather(mine):
            exchanged.append((rank, mine))
            return [mine, 0] if rank == 0 else [rank0_wrote, mine]
        stop = StopSignals(log, gather=gather)
        stop.received = "SIGTERM"  # as agreed at this step's exchange
        return CheckpointSaver(StepState(start_step=7), stop, output_dir=str(tmp_path),
                               prefix="net", steps_per_epoch=10, total_steps=100, write=rank == 0)

    context = RunContext(Params(train_network=nn.Dense(2, 2)))
    writer = saver_of(0, None)
    writer.on_train_step_end(context)
    assert exchanged == [(0, 1)] and writer.last_saved == path and os.path.exists(path)
    assert context.get_stop_requested()
    other = saver_of(1, 1)
    other.on_train_step_end(RunContext(Params(train_network=nn.Dense(2, 2))))
    assert other.last_saved == path and other.error is None  # finish() names rank 0's file
    failed = saver_of(1, 0)
    failed.on_train_step_end(RunContext(Params(train_network=nn.Dense(2, 2))))
    assert failed.last_saved is None and "did not save" in failed.error


def test_eval_shards_hold_each_image_once(tmp_path):
    """MindSpore's sharding pads the shards to equal sizes with copies of other shards'
    images; the first ``images`` rows of each shard are its own, and together every image
    once."""
    from src.data.settings import EvalPreprocess
    from src.training.evaluator import eval_shard

    folder = copy_class_folders(os.path.join(CIFAR_SAMPLE, "test"), str(tmp_path / "e"), 3)
    for name in sorted(os.listdir(os.path.join(folder, "cat")))[:2]:
        os.remove(os.path.join(folder, "cat", name))
    os.remove(os.path.join(folder, "dog", sorted(os.listdir(os.path.join(folder, "dog")))[0]))
    args = dict(settings=EvalPreprocess(image_size=32, resize=32), dataset="imagefolder",
                batch_size=4, num_parallel_workers=1, check_images=False)

    def rows(dataset):
        return [(int(label), hash(image.tobytes())) for images, labels in
                dataset.create_tuple_iterator(num_epochs=1, output_numpy=True)
                for image, label in zip(images, labels)]

    everything = sorted(rows(eval_shard(folder, args).dataset))
    assert len(everything) == 27
    for num_shards in (2, 4, 5):
        shards = [eval_shard(folder, args, num_shards, s) for s in range(num_shards)]
        read = [rows(shard.dataset) for shard in shards]
        assert sum(map(len, read)) > 27  # padded: counting every row would count some twice
        own = [r[:shard.image_count] for r, shard in zip(read, shards)]
        assert sorted(sum(own, [])) == everything, num_shards


def test_the_evaluator_counts_its_own_images_with_rank0s_statistics_and_only_rank0_writes(
        tmp_path):
    import mindspore as ms
    from mindspore import nn
    from mindspore.dataset import NumpySlicesDataset
    from mindspore.train import Model

    from src.training.best import BestCheckpoint
    from src.training.evaluator import EvalShard, Evaluator

    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(4, 3), nn.BatchNorm1d(3)])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((10, 4)).astype(np.float32)
    y = rng.integers(0, 3, 10).astype(np.int32)
    data = NumpySlicesDataset({"image": x, "label": y}, shuffle=False).batch(4)
    model = Model(net, eval_network=nn.WithEvalCell(net, nn.SoftmaxCrossEntropyWithLogits(
        sparse=True, reduction="mean")), metrics={"top1": nn.Top1CategoricalAccuracy()},
                  eval_indexes=[0, 1, 2])
    rank0_mean = np.array([-5.0, 5.0, 0.0], np.float32)  # turns predictions to class 0
    sent = []

    def broadcast(arrays):  # [moving mean, moving variance]: rank 0's mean differs from ours
        sent.extend(arrays)
        return [rank0_mean, arrays[1]]

    shard = EvalShard(data, image_count=7, sum_over_ranks=lambda counts: [2 * c for c in counts],
                      broadcast=broadcast, sum_arrays=lambda floats: 2 * floats)
    # (a second rank that counted the same)
    own_mean = net[1].moving_mean.asnumpy().copy()
    best = tmp_path / "net-best.ckpt"
    evaluator = Evaluator(model, shard, net)
    result = evaluator()
    # every rank decides the same (the summed numbers), a rank other than 0 writes nothing
    other_rank = BestCheckpoint(str(best), write=False)
    assert other_rank.update(result, 1, evaluator.network(other_rank.metric))
    assert len(sent) == 2  # moving mean and variance: the non-trainable parameters
    np.testing.assert_array_equal(net[1].moving_mean.asnumpy(), own_mean)  # put back
    z = x[:7] @ net[0].weight.asnumpy().T + net[0].bias.asnumpy()
    std = np.sqrt(net[1].moving_variance.asnumpy() + 1e-5)
    hits = ((z - rank0_mean) / std).argmax(axis=1) == y[:7]
    assert (((z - own_mean) / std).argmax(axis=1) == y[:7]).sum() != hits.sum()  # it matters
    assert result["eval_images"] == 14
    assert result["top1"] == hits.sum() / 7  # the 7 own rows (not the 3 padded ones)
    assert result["top5"] == 1.0  # 3 classes: top-3
    assert not best.exists()  # only the writing rank saves
    assert other_rank.score() == {"top1": result["top1"], "epoch": 1}
    sent.clear()
    rank0 = BestCheckpoint(str(best), write=True)
    assert rank0.update(evaluator(), 1, evaluator.network(rank0.metric))
    assert best.exists() and rank0.score() == other_rank.score()
    # a best checkpoint that cannot be written: recorded (the monitor stops training, in data
    # parallel after the ranks agree), not raised out of Model.train on rank 0 alone
    blocked = tmp_path / "blocked-best.ckpt"
    (blocked / "keep").mkdir(parents=True)
    blocked_best = BestCheckpoint(str(blocked), write=True)
    assert blocked_best.update(evaluator(), 1, evaluator.network(blocked_best.metric))
    assert blocked_best.error.startswith(f"cannot write the best checkpoint {blocked}: ")
