"""The recipe: the one place below the entry points that reads the config (``Config``). Its
adapters turn config keys into the plain arguments of the library (timm's
``optimizer_kwargs(cfg)`` style; the ``create_*`` factories take no config): the checks of a
training config, the network, the training ``Model``, the data pipelines, the evaluator and
LP-FT's switch. Imported by the entry points, the benchmarks and the tests only.
"""
from dataclasses import dataclass
from functools import partial

import mindspore as ms
import mindspore.dataset as ds
import numpy as np

from src.data.class_names import CIFAR10_CLASSES
from src.data.mixing import BatchMixer
from src.data.pipeline import class_names_of, count_images, create_dataset
from src.data.sampling import balanced_class_weights, class_counts
from src.data.split import (
    checked_split,
    held_out_fraction,
    read_split_file,
    split_image_folder,
    training_labels,
)
from src.models.freeze import set_trainable
from src.models.resnet import create_network, last_feature_map_side
from src.training.evaluator import Evaluator
from src.training.loop import TrainPlan
from src.training.model import (
    StepRecipe,
    build_model,
    build_train_step,
    eval_model,
    resolve_allreduce_per,
    with_train_step,
)
from src.training.optimizer import HYPERPARAMETERS
from src.training.output_dir import record_training_images
from src.training.profiler import parse_profile_steps
from src.training.resume import epoch_seed, restore_training_state
from src.utils.checkpoint import load_into_network
from src.utils.config import INT32_MAX, ConfigError

TRAIN_SECTIONS = ("network", "data", "training data", "optimization", "fine-tuning", "device",
                  "precision, distribution", "outputs", "performance", "training checkpoints")
"""The sections of train.py's ``--help``, in order."""


# ---- checks of a training config ----

def check_train_config(cfg):
    """Reject training values that cannot work, naming the key (ranges: ``check_values``).

    Raises:
        ConfigError: For an empty ``data_path``, ``run_eval`` with nothing to evaluate on,
            ``check_split_and_balance``'s cases, a bad ``profile_steps``, a linear probe as
            long as the run, or a batch whose last BatchNorm layers see one value per channel.
    """
    if not cfg.data_path:
        raise ConfigError("data_path is empty: give --data_path, the training data folder")
    if cfg.run_eval and not (cfg.eval_data_path or cfg.val_split):
        raise ConfigError("run_eval is true but eval_data_path is empty (and val_split is 0: "
                          "no part of data_path is held out)")
    check_split_and_balance(cfg)
    parse_profile_steps(cfg.profile_steps)
    if cfg.linear_probe_epochs >= cfg.epoch_size:
        raise ConfigError(f"linear_probe_epochs {cfg.linear_probe_epochs} leaves no epoch to "
                          f"fine-tune in epoch_size {cfg.epoch_size}: use fewer, or "
                          f"trainable_layers 0 for a linear probe alone")
    side = last_feature_map_side(cfg.train_image_size)
    batch_statistics = not cfg.freeze_bn and cfg.trainable_layers >= 1
    if batch_statistics and cfg.batch_size * side * side < 2:
        raise ConfigError(f"batch_size {cfg.batch_size} at train_image_size "
                          f"{cfg.train_image_size}: the last stage's feature map is {side}x{side}"
                          f", so its BatchNorm layers would see one value per channel (variance "
                          f"undefined, the running statistics become NaN); use batch_size 2 or "
                          f"more, a train_image_size above 32, or freeze_bn true")


def check_split_and_balance(cfg):
    """Reject ``val_split``, ``class_balance`` and ``split_file`` values train.py cannot use
    (the ranges: ``check_values``; a class too small to split: ``split_image_folder``).

    Raises:
        ConfigError: For a ``split_file`` (eval.py's key), or ``val_split`` or
            ``class_balance`` with the cifar10 binaries.
    """
    if cfg.split_file:
        raise ConfigError(f"split_file {cfg.split_file} is read by eval.py only: train.py holds "
                          f"out part of data_path with val_split")
    for key, value, off in (("val_split", held_out(cfg), 0.0),
                            ("class_balance", cfg.class_balance, "none")):
        if cfg.dataset == "cifar10" and value != off:
            raise ConfigError(f"{key} {value} needs dataset imagefolder: the cifar10 binary "
                              f"release comes split (test_batch.bin, for eval_data_path) and "
                              f"balanced (5000 training images per class)")


def resolve_sink_size(cfg, steps_per_epoch):
    """Steps per dataset-sink call, 0 for step-by-step training: ``dataset_sink_mode`` auto is
    sink mode on GPU/Ascend in graph mode; ``sink_size`` 0 is one epoch.

    Raises:
        ConfigError: For ``dataset_sink_mode true`` on CPU: MindSpore 2.10's ``Model.train``
            runs no sink mode there (it logs that and trains step by step, each "epoch" a
            whole pass of the data), so the sink calls would not be what they claim. Also in
            PyNative mode, where ``Model.train`` calls the step callbacks once per step even
            in sink mode, so a callback would not end ``sink_size`` steps. In sink mode, for
            a ``sink_size`` larger than an epoch or one that does not divide it (epochs must
            end on call boundaries: the epoch's record, evaluation and checkpoint happen
            there); the message names both numbers and the divisors nearest.
    """
    if cfg.dataset_sink_mode == "true" and cfg.device_target == "CPU":
        raise ConfigError("dataset_sink_mode true: MindSpore has no dataset sink mode on CPU "
                          "(Model.train falls back to step by step); use false or auto")
    if cfg.dataset_sink_mode == "true" and cfg.mode != "GRAPH":
        raise ConfigError(f"dataset_sink_mode true needs mode GRAPH (got {cfg.mode}): in "
                          f"PyNative mode Model.train runs sink mode step by step; use false "
                          f"or auto")
    sink = cfg.dataset_sink_mode == "true" or (cfg.dataset_sink_mode == "auto"
                                               and cfg.device_target != "CPU"
                                               and cfg.mode == "GRAPH")
    if not sink:
        return 0
    sink_size = cfg.sink_size or steps_per_epoch
    if sink_size > steps_per_epoch:
        raise ConfigError(f"sink_size {sink_size} is larger than an epoch ({steps_per_epoch} "
                          f"steps per device): use at most {steps_per_epoch}, or 0 for one "
                          f"epoch per call")
    if steps_per_epoch % sink_size:
        divisors = [d for d in range(1, steps_per_epoch + 1) if steps_per_epoch % d == 0]
        near = sorted(divisors, key=lambda d: abs(d - sink_size))[:2]
        raise ConfigError(f"sink_size {sink_size} does not divide an epoch of "
                          f"{steps_per_epoch} steps: epochs must end on a sink call; use a "
                          f"divisor such as {' or '.join(map(str, sorted(near)))}, or 0 for one "
                          f"epoch per call")
    return sink_size


# ---- the training Model: loss, optimizer, TrainStep, EMA ----

def optimizer_kwargs(cfg):
    """Keywords of ``create_optimizer`` from the config (timm's ``optimizer_kwargs``): every
    optimizer's hyperparameters (``HYPERPARAMETERS``), the chosen one takes its own."""
    return dict(optimizer=cfg.optimizer, weight_decay=cfg.weight_decay,
                layer_decay=cfg.layer_decay, head_lr_scale=cfg.head_lr_scale,
                **{key: cfg[key] for key in HYPERPARAMETERS})


def loss_kwargs(cfg):
    """Keywords of ``create_loss`` besides ``label_smoothing`` and ``class_num``: the loss,
    soft targets when mixup or CutMix is on, the ``class_balance loss`` weights.

    Raises:
        ConfigError, ValueError: As ``loss_class_weights``.
    """
    return dict(loss=cfg.loss, bce_target_threshold=cfg.bce_target_threshold,
                soft_targets=bool(cfg.mixup_alpha or cfg.cutmix_alpha),
                class_weights=loss_class_weights(cfg))


def loss_class_weights(cfg):
    """The class weights of ``class_balance loss``: scikit-learn's "balanced" weights
    ``n / (K * count_c)`` (``src.data.sampling.balanced_class_weights``) of the images the
    run trains on (``data_path`` without the part ``val_split`` holds out: ``held_out``);
    None for the other ``class_balance`` values. ``benchmark_steps`` reads no data: weights
    of 1 (the same ops, the same cost).

    Returns:
        numpy.ndarray or None: float32 (class_num,).

    Raises:
        ConfigError: As ``src.data.split.split_image_folder``.
        ValueError: If a class has no training image (``class_num`` above the folder's).
    """
    if cfg.class_balance != "loss":
        return None
    if cfg.benchmark_steps:
        return np.ones(cfg.class_num, np.float32)
    labels = training_labels(cfg.data_path, held_out(cfg), cfg.seed)
    return balanced_class_weights(class_counts(labels, cfg.class_num))


def step_recipe(cfg, amp_level):
    """The ``StepRecipe`` of the config under the resolved ``amp_level``.

    Raises:
        ConfigError, ValueError: As ``loss_class_weights``.
    """
    return StepRecipe(
        amp_level=amp_level, device_target=cfg.device_target, class_num=cfg.class_num,
        label_smoothing=cfg.label_smoothing, optimizer_kwargs=optimizer_kwargs(cfg),
        loss_kwargs=loss_kwargs(cfg), loss_scale=cfg.loss_scale,
        loss_scale_type=cfg.loss_scale_type, scale_factor=cfg.scale_factor,
        scale_window=cfg.scale_window, grad_clip_norm=cfg.grad_clip_norm,
        grad_accumulation_steps=cfg.grad_accumulation_steps,
        allreduce_per=resolve_allreduce_per(cfg.grad_accumulation_allreduce, cfg.device_target))


def training_model(cfg, net, lr, amp_level, recipe=None):
    """The training ``Model`` of ``net`` under the config (``src.training.model.build_model``).

    Args:
        cfg (Config): The resolved config.
        net (nn.Cell): The network (fp32 parameters).
        lr (numpy.ndarray or float): LR per optimizer step (``create_lr``) or a constant.
        amp_level (str): The resolved AMP level (``resolve_amp_level``).
        recipe (StepRecipe, optional): Built here if not given (``step_recipe``).

    Returns:
        tuple: (``Model``, the ``WeightEma`` or None), as ``build_model``.
    """
    return build_model(net, lr, recipe or step_recipe(cfg, amp_level), cfg.ema_decay,
                       cfg.ema_warmup)


# ---- the network ----

def network_kwargs(cfg):
    """``create_network``'s arguments of the configured architecture: ``net_name``,
    ``class_num``, ``zero_init_residual``, ``device_target``, ``stem_pool_pad_mode``."""
    return dict(net_name=cfg.net_name, class_num=cfg.class_num,
                zero_init_residual=cfg.zero_init_residual, device_target=cfg.device_target,
                stem_pool_pad_mode=cfg.stem_pool_pad_mode)


def training_network(cfg, rank=0):
    """The configured ResNet as it trains on data-parallel rank ``rank``: with its stochastic
    depth (``drop_path_rate``, drawn from ``seed`` and the rank)."""
    return create_network(**network_kwargs(cfg), drop_path_rate=cfg.drop_path_rate,
                          drop_path_seed=cfg.seed, shard_id=rank)


def build_network(cfg, device_num, log, rank=0):
    """The configured ResNet (``training_network``), initialized from ``pre_trained`` if given
    (a classifier of another class count is dropped and trained from scratch), with the
    stages that train now (``trainable_layers``, only ``fc`` during LP-FT's linear probe) and
    ``freeze_bn``.

    Raises:
        As ``create_network`` and ``load_into_network``.
    """
    net = training_network(cfg, rank)
    if cfg.pre_trained:
        dropped, _ = load_into_network(net, cfg.pre_trained, drop_mismatched_classifier=True)
        log.info("initialized from %s%s", cfg.pre_trained,
                 f"; classifier {dropped} dropped (class count differs), fc trained from "
                 f"scratch" if dropped else "")
    if cfg.linear_probe_epochs:
        log.info("linear_probe_epochs %d: only fc trains in the first %d epochs, every "
                 "BatchNorm frozen (LP-FT)", cfg.linear_probe_epochs, cfg.linear_probe_epochs)
        make_trainable(cfg, net, 0, True, device_num, log)
    else:
        make_trainable(cfg, net, cfg.trainable_layers, cfg.freeze_bn, device_num, log)
    return net


def make_trainable(cfg, net, trainable_layers, freeze_bn, device_num, log):
    """``src.models.freeze.set_trainable`` with the config's all-reduce fusion: the explicit
    ``all_reduce_fusion_config`` is for the configured ``trainable_layers``, not for LP-FT's
    probe (which gets the derived split)."""
    fusion = cfg.all_reduce_fusion_config if trainable_layers == cfg.trainable_layers else []
    set_trainable(net, trainable_layers, freeze_bn, log, device_num, fusion, cfg.net_name)


class FineTuning:
    """LP-FT's switch at step ``probe_end`` (``linear_probe_epochs`` done): the stages of
    ``trainable_layers`` train from there, with a fresh optimizer over them (Kumar et al.
    2022, "Fine-Tuning can Distort Pretrained Features and Underperform Out-of-Distribution",
    arXiv:2202.10054: the probe's head initializes the fine-tuning) whose step 0 is the run's
    step ``probe_end`` (its LR array the rest of the run's). A new training cell, so its graph
    is compiled once more. The overflow count carries over.

    Built once per run; called with the probe's ``Model`` (``src.training.loop.train_run``, or
    train.py for a run resumed after the switch).

    Args:
        cfg (Config): The resolved config (``trainable_layers``, ``freeze_bn``, fusion).
        recipe (StepRecipe): The run's (``step_recipe``).
        lr (numpy.ndarray): LR per optimizer step of the whole run.
        probe_end (int): The switch step.
        ema (WeightEma or None): The run's weight EMA.
        device_num (int): Devices of the run.
        log (logging.Logger): Gets the lines of what trains and of the switch.
    """

    def __init__(self, cfg, recipe, lr, probe_end, ema, device_num, log):
        self.cfg, self.recipe, self.lr, self.probe_end = cfg, recipe, lr, probe_end
        self.ema, self.device_num, self.log = ema, device_num, log

    def __call__(self, model, resume_path=""):
        """The fine-tuning ``Model`` (training the new cell, evaluating the same network);
        ``resume_path`` (a checkpoint after the switch) restores the new cell's optimizer
        state."""
        cfg, old = self.cfg, model.train_network
        net = old.network.backbone_network  # the cast network inside WithLossCell
        make_trainable(cfg, net, cfg.trainable_layers, cfg.freeze_bn, self.device_num, self.log)
        step = build_train_step(net, self.lr[self.probe_end:], self.recipe, self.ema)
        step.overflow_count.set_data(old.overflow_count.value())
        if resume_path:
            restore_training_state(step, resume_path)
        self.log.info("LP-FT: linear probe done after %d steps; fine-tuning with "
                      "trainable_layers %d from step %d", self.probe_end, cfg.trainable_layers,
                      self.probe_end)
        return with_train_step(net, step, self.recipe)


def build_evaluator(cfg, model, net, ema, shard, amp_level, confusion_of=None):
    """``Evaluator`` of the live network and, with an EMA, of the averages (in a second
    network of the same architecture), on ``shard`` (``eval_shard``: in data parallel this
    rank's part of the eval set; the counts are summed over the ranks). ``confusion_of``: the
    metric whose network's confusion matrix is kept (``Evaluator``)."""
    ema_model = None
    if ema is not None:
        ema_net = ms.amp.auto_mixed_precision(
            create_network(**network_kwargs(cfg)), amp_level)
        ema_model = eval_model(ema_net, amp_level, cfg.label_smoothing, cfg.class_num)
    return Evaluator(model, shard, net, ema=ema, ema_model=ema_model, class_num=cfg.class_num,
                     confusion_of=confusion_of)


# ---- the data ----

def held_out(cfg):
    """The fraction of ``data_path`` held out (``src.data.split.held_out_fraction``)."""
    return held_out_fraction(cfg.val_split, cfg.eval_data_path)


@dataclass
class TrainData:
    """The training data as a run sees it (``build_data``).

    Attributes:
        data_args (dict): ``create_dataset`` keywords of the eval pipeline of data_path.
        train_args (dict): ``create_dataset`` keywords of the training pipeline (with the
            augmentations, the ``val_split`` indices, the class-balanced sampler).
        eval_args (dict): ``create_dataset`` keywords of ``run_eval``'s pipeline.
        shards (dict): ``num_shards``/``shard_id`` in data parallel, else empty.
        steps_per_epoch (int): Optimizer steps per epoch (per device).
        batches_per_epoch (int): Batches of ``batch_size`` read per epoch
            (``grad_accumulation_steps`` per optimizer step).
        cut_epochs (bool): The pipeline gives more batches and is cut to
            ``batches_per_epoch``.
        class_names (list[str]): The class names, in label order.
        train_images (int): Training images of all devices (stored in the checkpoints,
            checked on resume).
    """

    data_args: dict
    train_args: dict
    eval_args: dict
    shards: dict
    steps_per_epoch: int
    batches_per_epoch: int
    cut_epochs: bool
    class_names: list
    train_images: int


def build_data(cfg, rank, device_num):
    """The training data as the run sees it (``TrainData``).
    With ``val_split`` the training pipeline reads the training part of data_path and
    ``eval_args`` the held-out part (``split_image_folder``); ``class_balance sampler`` draws
    class-balanced; ``aug_repeats`` reads each drawn image that many times, the epoch as long
    as without (``src.data.sampling.EpochSampler``), so ``steps_per_epoch`` is the cut
    epoch's.

    Raises:
        ConfigError: If an epoch has no full batch, the run has more steps than
            ``INT32_MAX`` (checked before the LR schedule, one value per step, is built), the
            class count is not ``class_num``,
            the eval folder's classes differ from the training folder's, or ``val_split``
            leaves a class without a training or validation image.
    """
    data_args = dict(dataset=cfg.dataset, batch_size=cfg.batch_size,
                     image_size=cfg.eval_image_size, eval_resize=cfg.eval_resize,
                     eval_interpolation=cfg.eval_interpolation, exif_transpose=cfg.exif_transpose,
                     num_parallel_workers=cfg.num_parallel_workers, check_images=cfg.check_images)
    train_args = train_data_args(cfg, data_args)
    eval_args = data_args
    if held_out(cfg):  # eval_data_path, if given, wins over val_split
        split = split_image_folder(cfg.data_path, cfg.val_split, cfg.seed)
        train_args["indices"], eval_args = split.train, dict(data_args, indices=split.val)
    if cfg.class_balance == "sampler":
        train_args["balance_classes"] = True
    shards = dict(num_shards=device_num, shard_id=rank) if device_num > 1 else {}
    train_set = create_dataset(cfg.data_path, is_training=True, **train_args, **shards)
    batches = train_set.get_dataset_size()
    train_images = count_images(cfg.data_path, is_training=True, dataset=cfg.dataset,
                                indices=train_args.get("indices"))
    steps_per_epoch = batches // cfg.grad_accumulation_steps
    if steps_per_epoch == 0:
        raise ConfigError(f"data_path {cfg.data_path} gives {batches} full batches of "
                          f"batch_size {cfg.batch_size} per device, fewer than the "
                          f"grad_accumulation_steps {cfg.grad_accumulation_steps} of one "
                          f"optimizer step: lower them")
    total_steps = cfg.epoch_size * steps_per_epoch
    if total_steps > INT32_MAX:  # before the LR schedule: one value per step
        raise ConfigError(f"epoch_size {cfg.epoch_size} x {steps_per_epoch} optimizer steps per "
                          f"epoch = {total_steps} steps: more than {INT32_MAX}, what MindSpore's "
                          f"int32 step counter holds; lower epoch_size")
    class_names = (class_names_of(cfg.data_path) if cfg.dataset == "imagefolder"
                   else CIFAR10_CLASSES)
    if len(class_names) != cfg.class_num:
        raise ConfigError(f"data_path {cfg.data_path} has {len(class_names)} classes but "
                          f"class_num is {cfg.class_num}")
    if cfg.run_eval and cfg.eval_data_path and cfg.dataset == "imagefolder" and class_names_of(
            cfg.eval_data_path) != class_names:
        raise ConfigError(f"eval_data_path {cfg.eval_data_path} has other class folders than "
                          f"data_path {cfg.data_path}: labels would not match")
    return TrainData(data_args=data_args, train_args=train_args, eval_args=eval_args,
                     shards=shards, steps_per_epoch=steps_per_epoch,
                     batches_per_epoch=steps_per_epoch * cfg.grad_accumulation_steps,
                     cut_epochs=batches % cfg.grad_accumulation_steps != 0,
                     class_names=class_names, train_images=train_images)


def train_data_args(cfg, data_args):
    """Keyword arguments of the training pipeline: batches of ``batch_size`` (one ``Model``
    step each; ``grad_accumulation_steps`` of them make an optimizer step), with the
    augmentations."""
    return dict(data_args, image_size=cfg.train_image_size, crop_scale=cfg.train_crop_scale,
                auto_augment=cfg.auto_augment, randaugment_num_ops=cfg.randaugment_num_ops,
                randaugment_magnitude=cfg.randaugment_magnitude,
                random_erasing=cfg.random_erasing, aug_repeats=cfg.aug_repeats)


def batch_mixer(cfg, seed):
    """The mixup/cutmix op of the training batches (None when both are off), its draws a
    function of (``seed``, batch number) only."""
    if not (cfg.mixup_alpha or cfg.cutmix_alpha):
        return None
    return BatchMixer(mixup_alpha=cfg.mixup_alpha, cutmix_alpha=cfg.cutmix_alpha,
                      mix_prob=cfg.mix_prob, mix_switch_prob=cfg.mix_switch_prob,
                      label_smoothing=cfg.label_smoothing, class_num=cfg.class_num, seed=seed)


def training_pipeline(cfg, data, seed):
    """A training pipeline seeded with ``seed``: batches of ``batch_size``, each epoch cut to
    ``data.batches_per_epoch`` (whole optimizer steps: the micro-batches of an optimizer
    step never straddle two epochs). The image check ran when the first pipeline was built
    (``src.data.image_check`` checks a folder once)."""
    ds.config.set_seed(seed)
    dataset = create_dataset(cfg.data_path, is_training=True, **data.train_args, **data.shards,
                             batch_transform=batch_mixer(cfg, seed))
    return dataset.take(data.batches_per_epoch) if data.cut_epochs else dataset


def epoch_dataset(cfg, epoch, skip_steps, data):
    """The training pipeline of ``epoch``, seeded from (seed, epoch), the batches of its
    first ``skip_steps`` optimizer steps skipped (they are still read, so random
    augmentation stays in step)."""
    dataset = training_pipeline(cfg, data, epoch_seed(cfg.seed, epoch))
    skip = skip_steps * cfg.grad_accumulation_steps
    return dataset.skip(skip) if skip else dataset


def run_dataset(cfg, data):
    """The one training pipeline of a sink-mode run: all its epochs, seeded once from
    (``seed``, 0). MindSpore's sampler reshuffles it every epoch, the order a function of the
    seed and the epoch number alone; ``Dataset.set_init_step`` starts it at any step with
    that order (``src.training.loop.train_in_sink_calls``)."""
    return training_pipeline(cfg, data, epoch_seed(cfg.seed, 0))


def train_plan(cfg, data, sink_size):
    """The loop's ``TrainPlan``: the run's epochs and steps, ``sink_size`` and the pipeline
    builders (``epoch_dataset``, ``run_dataset``) bound to the config and ``data``."""
    return TrainPlan(epoch_size=cfg.epoch_size, steps_per_epoch=data.steps_per_epoch,
                     grad_accumulation_steps=cfg.grad_accumulation_steps, sink_size=sink_size,
                     epoch_dataset=partial(epoch_dataset, cfg, data=data),
                     run_dataset=partial(run_dataset, cfg, data))


# ---- the val_split lists and class counts of a run; eval.py's split_file ----

def run_split(cfg, continues_here, write):
    """The ``val_split`` of the run, checked against the lists an earlier part of the same run
    wrote (``src.data.split.checked_split``; a check only, so train.py calls it before writing
    any file).

    Args:
        cfg (Config): The run's config.
        continues_here (bool): The run continues a run of ``output_dir``.
        write (bool): This process writes the run's files (rank 0): it compares the lists.

    Returns:
        tuple: ``(split, changed)``: the ``FolderSplit`` (None without ``val_split`` or
        class folders) and the names of the lists it changes (only with
        ``resume_ignore_config``).

    Raises:
        ConfigError: If the split changed, unless ``resume_ignore_config``.
    """
    val_split = held_out(cfg) if cfg.dataset == "imagefolder" else 0.0
    return checked_split(cfg.data_path, val_split, cfg.seed, cfg.output_dir,
                         write and continues_here, cfg.resume_ignore_config)


def record_run_images(cfg, continues_here, class_names, write, log, checked=None):
    """Class folders: the ``val_split`` lists and the training images per class, in the log
    and ``output_dir`` (``src.training.output_dir.record_training_images``); a warning when
    ``eval_data_path`` overrides ``val_split``.

    Args:
        checked (tuple, optional): What ``run_split`` returned for this run, if called
            already (train.py: before any file is written); else it is called here.

    Raises:
        ConfigError: As ``run_split``.
        WriteError: If a list cannot be written.
    """
    if cfg.dataset != "imagefolder":
        return
    if cfg.val_split and not held_out(cfg):
        log.warning("val_split %g not applied: eval_data_path %s is given and wins (every image "
                    "of data_path trains)", cfg.val_split, cfg.eval_data_path)
    split, changed = checked or run_split(cfg, continues_here, write)
    record_training_images(cfg.output_dir, cfg.data_path, class_names, log, split=split,
                           val_split=cfg.val_split, changed=changed, write=write,
                           for_eval=cfg.run_eval, suggest_balance=cfg.class_balance == "none")


def split_indices(cfg):
    """eval.py's ``--split_file``: the positions of the images it lists in data_path's reader
    order (``src.data.split.read_split_file``), None without one (every image).

    Raises:
        ConfigError: With dataset cifar10, or a file listing no image, paths twice or paths
            that are not in data_path.
        MissingFileError: If the file does not exist.
    """
    if not cfg.split_file:
        return None
    if cfg.dataset != "imagefolder":
        raise ConfigError(f"split_file {cfg.split_file} needs dataset imagefolder, got "
                          f"{cfg.dataset}")
    return read_split_file(cfg.split_file, cfg.data_path)
