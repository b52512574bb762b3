"""Train a ResNet image classifier with MindSpore.

    python train.py --data_path /data/imagenet/train                  # ResNet-50, config.yaml
    python train.py --config_path configs/resnet18_cifar10.yaml --data_path DIR --epoch_size 5

Reads top to bottom: config -> signals -> device -> output folder lock -> dataset -> network
-> LR -> Model (loss, optimizer, TrainStep, EMA) -> resume -> the last checks, callbacks ->
output folder (the first file written) -> training. Outputs in --output_dir: checkpoints,
metrics.jsonl (one JSON line per epoch), config.yaml (the resolved config), class_names.txt,
train.log. One run per folder: a second run into a folder in use fails at once, a fresh run
refuses a folder holding another run's files (--resume_ckpt auto continues it; --overwrite
true moves them aside); a run refused at start-up writes nothing there. Step by step (CPU)
each epoch's data pipeline is seeded from (seed, epoch), so a run resumed with --resume_ckpt
sees the same data as an uninterrupted one; in dataset sink mode (GPU/Ascend) one pipeline
serves the whole run and one Model.train call compiles the graph once. SIGINT/SIGTERM save
and stop (in data parallel every rank after the same step); a second Ctrl-C exits at once.
Exit status: 0 done, 2 bad input, 3 non-finite loss or parameters, or more than
max_overflow_fraction of the last 100 steps overflowed (loss scaling), 4 a checkpoint, record,
log or config file could not be written (disk full, permission), 128 + signal number when
stopped by SIGINT/SIGTERM (in data parallel on every rank, also those stopped with the
signalled one). In data parallel every rank stops after the same step and exits with the same
status, whichever rank stopped.
"""
import src.env  # noqa: F401  first: sets the oneDNN default before MindSpore loads
import src.startup  # noqa: F401  then: a stop signal while MindSpore loads exits with a line

# isort: split

import json
import logging
import os
from types import SimpleNamespace

import mindspore as ms
import mindspore.dataset as ds

from src.data.class_names import CIFAR10_CLASSES, CLASS_NAMES_FILE, write_class_names
from src.data.image_check import (
    ImageFolderError,
    readable_pipeline_errors,
    set_max_image_pixels,
)
from src.data.mixing import BatchMixer
from src.data.pipeline import class_names_of, count_images, create_dataset
from src.data.split import (
    split_image_folder,
)
from src.deploy.report import plot_confusion
from src.models.resnet import create_network
from src.training.best import BestCheckpoint, EvalKeepingBest
from src.training.callbacks import (
    NOT_WRITTEN,
    STOP_REASONS,
    OptimizerStepCallbacks,
    StepState,
    StopAtStep,
    TrainMonitor,
    loss_value,
)
from src.training.evaluator import Evaluator, eval_shard
from src.training.finetune import (
    check_split_and_balance,
    checked_split,
    fine_tuning_model,
    held_out_fraction,
    record_training_images,
    set_trainable,
)
from src.training.lr_schedule import LR_KEYS, create_lr
from src.training.model import build_model, eval_model
from src.training.optimizer import layer_ids, layer_lr_scales
from src.training.output_dir import (
    OutputDirLock,
    move_branch_aside,
    prepare_output_dir,
    trim_records,
)
from src.training.precision import resolve_amp_level, resolve_loss_scale_type
from src.training.profiler import ProfileSteps, parse_profile_steps
from src.training.resume import (
    agree_across_ranks,
    branch_files,
    epoch_seed,
    find_resume_checkpoint,
    folder_best,
    restore_training_state,
    resumable_names,
)
from src.training.saver import CheckpointSaver
from src.training.signals import StopSignals
from src.utils.checkpoint import (
    load_into_network,
    own_checkpoints,
    pretrained_config,
    remove_stale_partials,
)
from src.utils.cli import run_entry_point
from src.utils.config import INT32_MAX, ConfigError, parse_config
from src.utils.device import all_gather_int, init_distributed, setup_device
from src.utils.files import atomic_write_text, check_output_dir
from src.utils.hub import is_pretrained_source
from src.utils.logger import get_logger
from src.utils.throughput import as_tensors, synthetic_batch, throughput_report, time_calls
from src.utils.tracking import FOLDER as TENSORBOARD_FOLDER
from src.utils.tracking import TensorBoardLog

SECTIONS = ("network", "data", "training data", "optimization", "fine-tuning", "device",
            "precision, distribution", "outputs", "performance", "training checkpoints")
EXIT_NONFINITE, EXIT_SAVE_FAILED = 3, 4


def check_train_config(cfg):
    """Reject training values that cannot work, naming the key (ranges: ``check_values``)."""
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


def last_feature_map_side(image_size):
    """Side of ResNet's last feature map (``layer4``) for square inputs of ``image_size``
    pixels: the stem convolution, the max-pool and ``layer2``-``layer4`` each halve it,
    rounding up (stride 2, "same"-like padding)."""
    side = image_size
    for _ in range(5):
        side = -(-side // 2)
    return side


def resume_checkpoint_path(cfg, train_network, steps_per_epoch, device_num, log):
    """``resume_ckpt`` resolved to a path ("" to start from scratch): as given, or for
    ``auto`` the newest usable checkpoint in ``output_dir``; in data parallel, rank 0's
    choice, which every rank must hold."""
    names = resumable_names(train_network)
    path = cfg.resume_ckpt
    if path == "auto":
        path = find_resume_checkpoint(cfg.output_dir, cfg.net_name, steps_per_epoch, names) or ""
    if device_num > 1:
        path = agree_across_ranks(path, cfg.output_dir, cfg.net_name, steps_per_epoch, names,
                                  all_gather_int)
    if cfg.resume_ckpt == "auto" and not path:
        log.info("resume_ckpt auto: no checkpoint in %s, starting from scratch", cfg.output_dir)
    return path


def in_folder(path, folder):
    """Whether ``path`` lies directly in ``folder``."""
    return os.path.isdir(folder) and os.path.samefile(os.path.dirname(os.path.abspath(path)),
                                                      folder)


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


def build_evaluator(cfg, model, net, ema, shard, amp_level, confusion_of=None):
    """``Evaluator`` of the live network and, with an EMA, of the averages (in a second
    network of the same architecture), on ``shard`` (``eval_shard``: in data parallel this
    rank's part of the eval set; the counts are summed over the ranks). ``confusion_of``: the
    metric whose network's confusion matrix is kept (``Evaluator``)."""
    ema_model = None
    if ema is not None:
        ema_net = ms.amp.auto_mixed_precision(
            create_network(cfg.net_name, cfg.class_num, cfg.zero_init_residual,
                           device_target=cfg.device_target,
                           stem_pool_pad_mode=cfg.stem_pool_pad_mode), amp_level)
        ema_model = eval_model(cfg, ema_net, amp_level)
    return Evaluator(model, shard, net, ema, ema_model, cfg.class_num, confusion_of)


def main(argv=None):
    """Train as configured by ``argv`` (default: the command line); returns the exit status
    (see the module docstring)."""
    # ---- config, signals (caught from here on), device ----
    cfg = parse_config(argv, description=__doc__.split("\n")[0], sections=SECTIONS)
    set_max_image_pixels(cfg.max_image_pixels)
    if not cfg.benchmark_steps:
        check_train_config(cfg)
    stop = StopSignals(logging.getLogger("train"))
    stop.install()
    setup_device(cfg.mode, cfg.device_target, cfg.device_id, cfg.seed, cfg.run_distribute)
    rank, device_num = init_distributed(cfg.run_distribute, cfg.device_num)
    log = get_logger("train", None, rank)
    if is_pretrained_source(cfg.pre_trained):  # Hub weights: their network unless net_name set
        cfg.fill_unset(pretrained_config(cfg.pre_trained, cfg.user_value("net_name"),
                                         eval_settings=False), cfg.pre_trained)
    if cfg.benchmark_steps:
        return benchmark_training(cfg, device_num, log)
    lock = lock_output_dir(cfg, rank, log)  # one run per folder, before anything is written

    # ---- data: the training pipeline's shape, class names ----
    data = build_data(cfg, rank, device_num)

    # ---- network, LR (per optimizer step), model: loss, optimizer, TrainStep, EMA ----
    net = build_network(cfg, device_num, log, rank)
    global_batch = cfg.batch_size * cfg.grad_accumulation_steps * device_num
    lr, peak_lr = create_lr(**{k: cfg[k] for k in LR_KEYS}, global_batch_size=global_batch,
                            steps_per_epoch=data.steps_per_epoch)
    amp_level = resolve_amp_level(cfg.amp_level, cfg.device_target)
    # on GPU/Ascend, steps whose scaled gradients overflow are skipped and counted
    model, ema = build_model(cfg, net, lr, amp_level)
    probe_end = cfg.linear_probe_epochs * data.steps_per_epoch  # LP-FT: fc alone until then

    # ---- resume (the same recipe, step of the data and of the LR) ----
    run = resume_run(cfg, model.train_network, data.steps_per_epoch, len(lr), device_num, log,
                     data.train_images)
    if probe_end and run.start_step >= probe_end:
        model = fine_tuning_model(cfg, model, lr, probe_end, amp_level, ema, device_num, log,
                                  run.resume_path if run.start_step > probe_end else "")

    # ---- the last checks (nothing is written before they pass), callbacks: the step state
    # first, then the ones that read it; then the output folder ----
    sink_size = resolve_sink_size(cfg, data.steps_per_epoch)
    split = checked_split(cfg, run, rank == 0)
    callbacks = build_callbacks(cfg, run, data, model, net, ema, lr, global_batch, amp_level, stop,
                          rank, log)
    log = prepare_run_folder(cfg, run, data.class_names, rank, log, split)
    log_run_summary(cfg, run, data.steps_per_epoch, global_batch, device_num, peak_lr, len(lr),
                    amp_level, ema, log)
    log.info("dataset sink mode: %s", f"{sink_size} steps per call" if sink_size else "off")

    # ---- train: step by step (each epoch its own pipeline) or in sink calls (one pipeline) ----
    try:
        with readable_pipeline_errors():
            train_run(cfg, model, data, callbacks, run.start_step, sink_size, stop, probe_end,
                      lambda: fine_tuning_model(cfg, model, lr, probe_end, amp_level, ema,
                                                device_num, log))
    except ImageFolderError as err:  # an image the decoder rejects (check_images false)
        raise ImageFolderError(f"{err}; last good checkpoint: "
                               f"{callbacks.saver.last_saved or run.resume_path or 'none'} (resume "
                               f"from it with --resume_ckpt auto once the image is replaced)"
                               ) from err
    finally:
        stop.restore()
        if callbacks.profiler:
            callbacks.profiler.close()  # analyses the steps recorded before a stop
    status = finish(callbacks, stop, len(lr), cfg.output_dir, log)
    track_run_end(cfg, callbacks, run)
    if lock:
        lock.release()
    return status


def lock_output_dir(cfg, rank, log):
    """Take the run's output folder (rank 0: the ranks share it and only rank 0 writes):
    checked writable, then locked for the run (``OutputDirLock``), so a second run into it
    fails at once. Returns the lock (None on other ranks).

    Raises:
        OutputDirError: If the folder is a file, not writable, or held by another run.
    """
    if rank != 0:
        return None
    check_output_dir(cfg.output_dir)
    lock = OutputDirLock(cfg.output_dir)
    ended = lock.acquire()
    if ended:
        log.info("output_dir %s: took over the lock of an ended run (host and process id "
                 "%s)", cfg.output_dir, ended)
    return lock


def build_data(cfg, rank, device_num):
    """The training data as the run sees it: pipeline arguments (``data_args`` for eval,
    ``train_args`` for training, ``eval_args`` for run_eval), data-parallel ``shards``,
    optimizer steps per epoch (``steps_per_epoch``), the batches of ``batch_size`` read per
    epoch (``batches_per_epoch``: ``grad_accumulation_steps`` per optimizer step; with
    ``cut_epochs`` the pipeline gives more and is cut), the class names (label order) and
    the training images of all devices (``train_images``: stored in the checkpoints, checked
    on resume).
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
    if held_out_fraction(cfg):  # eval_data_path, if given, wins over val_split
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
    return SimpleNamespace(data_args=data_args, train_args=train_args, eval_args=eval_args,
                           shards=shards, steps_per_epoch=steps_per_epoch,
                           batches_per_epoch=steps_per_epoch * cfg.grad_accumulation_steps,
                           cut_epochs=batches % cfg.grad_accumulation_steps != 0,
                           class_names=class_names, train_images=train_images)


def training_network(cfg, rank=0):
    """The configured ResNet as it trains on data-parallel rank ``rank``: with its stochastic
    depth (``drop_path_rate``, drawn from ``seed`` and the rank)."""
    return create_network(cfg.net_name, cfg.class_num, cfg.zero_init_residual,
                          device_target=cfg.device_target,
                          stem_pool_pad_mode=cfg.stem_pool_pad_mode,
                          drop_path_rate=cfg.drop_path_rate, drop_path_seed=cfg.seed,
                          shard_id=rank)


def build_network(cfg, device_num, log, rank=0):
    """The configured ResNet (``training_network``), initialized from ``pre_trained`` if given
    (a classifier of another class count is dropped and trained from scratch), with the
    stages that train now (``trainable_layers``, only ``fc`` during LP-FT's linear probe) and
    ``freeze_bn``."""
    net = training_network(cfg, rank)
    if cfg.pre_trained:
        dropped, _ = load_into_network(net, cfg.pre_trained, drop_mismatched_classifier=True)
        log.info("initialized from %s%s", cfg.pre_trained,
                 f"; classifier {dropped} dropped (class count differs), fc trained from "
                 f"scratch" if dropped else "")
    if cfg.linear_probe_epochs:
        log.info("linear_probe_epochs %d: only fc trains in the first %d epochs, every "
                 "BatchNorm frozen (LP-FT)", cfg.linear_probe_epochs, cfg.linear_probe_epochs)
        set_trainable(cfg, net, 0, True, device_num, log)
    else:
        set_trainable(cfg, net, cfg.trainable_layers, cfg.freeze_bn, device_num, log)
    return net


def stopped(callbacks, stop):
    """Whether training must not go on: a signal, a non-finite loss or too many overflowed
    steps, or a checkpoint or record not written (in data parallel: as the ranks agreed, so
    every rank returns the same)."""
    return bool(stop.received or callbacks.state.must_stop)


def train_run(cfg, model, data, callbacks, start_step, sink_size, stop, probe_end=0,
              fine_tune=None, **kwargs):
    """Train from ``start_step`` to the end of ``epoch_size`` epochs, or until a stop, step by
    step (``train_step_by_step``) or in sink calls (``train_in_sink_calls``; ``kwargs`` go to
    it). With LP-FT (``probe_end`` > ``start_step``, the step at which the linear probe ends):
    the linear probe up to step ``probe_end``, then, unless stopped before, the model
    ``fine_tune()`` returns from there (a second ``Model.train`` call, on a pipeline of its
    own in sink mode)."""
    if probe_end and start_step < probe_end:
        train_until(cfg, model, data, callbacks, start_step, probe_end, sink_size, stop, **kwargs)
        if stopped(callbacks, stop) or callbacks.state.global_step < probe_end:
            return
        model, start_step = fine_tune(), probe_end
    train_until(cfg, model, data, callbacks, start_step, cfg.epoch_size * data.steps_per_epoch,
                sink_size, stop, **kwargs)


def train_until(cfg, model, data, callbacks, start_step, end_step, sink_size, stop, **kwargs):
    """Train from ``start_step`` to ``end_step`` (an epoch boundary), step by step or in sink
    calls."""
    if sink_size:
        train_in_sink_calls(cfg, model, data, callbacks, start_step, sink_size, stop,
                            end_step=end_step, **kwargs)
    else:
        train_step_by_step(cfg, model, data, callbacks, start_step, stop, end_step=end_step)


def resume_run(cfg, train_network, steps_per_epoch, total_steps, device_num, log,
               train_images=None):
    """Restore the training state of ``resume_ckpt`` (if any) into ``train_network``.

    Returns:
        SimpleNamespace: ``resume_path`` ("" for a fresh start), ``start_step`` (optimizer
        steps done), ``best`` (the best score stored in the checkpoint, or None),
        ``folder_best`` (for a run that continues its folder, the score stored in its
        ``NET-best.ckpt``, or None; ``BestCheckpoint.restore`` takes the higher),
        ``config`` (the run's config as stored in its checkpoints), ``data`` (the training
        data as stored in them: ``{"images", "steps_per_epoch"}``),
        ``continues_here`` (the checkpoint lies in ``output_dir``: this run continues that
        folder's run) and ``later_files`` (a resume from an earlier step than the folder's
        newest checkpoint, with ``overwrite``: the files of the later steps, to move aside).

    Raises:
        ConfigError: If the checkpoint was trained with another recipe or on other data
            (unless ``resume_ignore_config``), has already trained every step, or is older
            than the folder's newest usable checkpoint (a branch; unless ``overwrite``).
    """
    run_config = dict(cfg, device_num=device_num)
    data = {"images": train_images, "steps_per_epoch": steps_per_epoch}
    start_step, best, folder_score, later = 0, None, None, []
    resume_path = resume_checkpoint_path(cfg, train_network, steps_per_epoch, device_num, log)
    if resume_path:
        start_step, _, best = restore_training_state(
            train_network, resume_path, None if cfg.resume_ignore_config else run_config,
            None if train_images is None else data)
        if start_step >= total_steps:
            raise ConfigError(f"{resume_path} has already trained all {total_steps} steps of "
                              f"epoch_size {cfg.epoch_size}")
    continues_here = bool(resume_path) and in_folder(resume_path, cfg.output_dir)
    if continues_here:
        if cfg.resume_ckpt != "auto":  # auto takes the newest usable one: never a branch
            later = branch_files(cfg.output_dir, cfg.net_name, resume_path, start_step,
                                 steps_per_epoch, resumable_names(train_network),
                                 cfg.overwrite)
        best_path = os.path.join(cfg.output_dir, f"{cfg.net_name}-best.ckpt")
        if best_path not in later:  # a best chosen after a crash, e.g. (auto falls back)
            folder_score = folder_best(best_path)
    return SimpleNamespace(resume_path=resume_path, start_step=start_step, best=best,
                           folder_best=folder_score, config=run_config, data=data,
                           continues_here=continues_here, later_files=later)


def prepare_run_folder(cfg, run, class_names, rank, log, split=None):
    """One run per folder (rank 0 only: the other ranks write no files and may share the
    folder, locked by ``lock_output_dir``): refuse or move aside another run's files (and,
    for a resume from an older checkpoint with ``overwrite``, the later checkpoints and
    records: ``move_branch_aside``), remove temporary files of saves that did not finish,
    then write the resolved config, the class names and the ``val_split`` lists
    (``record_training_images``). Returns the logger, now also writing ``train.log`` on
    rank 0. Called once every check has passed (``split``:
    ``checked_split``'s result): a refused run leaves the folder as it was.

    Raises:
        OutputDirError: If the folder holds another run's files.
        WriteError: If the config, class names or split lists cannot be written.
        ConfigError: If a resumed run's split differs from its earlier one (when ``split``
            is not given).
    """
    is_main = rank == 0
    moved = branched = None
    if is_main:
        moved = prepare_output_dir(cfg.output_dir, not run.continues_here, cfg.overwrite,
                                   resume_auto=cfg.resume_ckpt == "auto")
        if run.later_files:
            branched = move_branch_aside(cfg.output_dir, run.later_files, run.start_step)
        for path in remove_stale_partials(cfg.output_dir, cfg.net_name):
            log.info("removed %s, left by a checkpoint save that did not finish", path)
        dropped = trim_records(cfg.output_dir, run.start_step) if run.continues_here else 0
        if dropped:
            log.info("metrics.jsonl: dropped %d record(s) after step %d, the resumed "
                     "checkpoint's (they are trained again)", dropped, run.start_step)
    os.makedirs(cfg.output_dir, exist_ok=True)
    log = get_logger("train", os.path.join(cfg.output_dir, "train.log") if is_main else None,
                     rank)
    log.info("resolved config:\n%s", cfg.to_yaml())
    if moved:
        log.warning("overwrite: the earlier run's files in %s were moved to %s",
                    cfg.output_dir, moved)
    if branched:
        log.warning("overwrite: resumed from step %d, before the run's newest checkpoint; its "
                    "later checkpoints and records were moved to %s", run.start_step, branched)
    if is_main:
        atomic_write_text(os.path.join(cfg.output_dir, "config.yaml"), cfg.to_yaml())
        write_class_names(os.path.join(cfg.output_dir, CLASS_NAMES_FILE), class_names)
    record_training_images(cfg, run, class_names, is_main, log, split)
    return log


def log_run_summary(cfg, run, steps_per_epoch, global_batch, device_num, peak_lr, total_steps,
                    amp_level, ema, log):
    """The run's batch, LR, precision and resume position, in the log."""
    accumulated = cfg.grad_accumulation_steps
    log.info("global batch %d (%d per device x %d devices%s): effective peak LR %.6g (base_lr "
             "%g per %d images); %d optimizer steps per epoch, %d in all", global_batch,
             cfg.batch_size, device_num, f" x {accumulated} accumulated micro-batches"
             if accumulated > 1 else "", peak_lr, cfg.base_lr, cfg.base_lr_batch_size,
             steps_per_epoch, total_steps)
    log.info("amp_level %s, loss scale %s, device %s; optimizer %s, loss %s%s", amp_level,
             f"{resolve_loss_scale_type(cfg.loss_scale_type, cfg.device_target)} "
             f"{cfg.loss_scale}" if amp_level != "O0" else "none", cfg.device_target,
             cfg.optimizer, cfg.loss, f", weight EMA decay {cfg.ema_decay}" if ema else "")
    if cfg.aug_repeats > 1:
        images = run.data["images"]
        log.info("aug_repeats %d: every image drawn is read %d times, each copy augmented on "
                 "its own; an epoch reads %d samples (%d per device), about %d distinct "
                 "images of the %d", cfg.aug_repeats, cfg.aug_repeats,
                 -(-images // device_num) * device_num, -(-images // device_num),
                 -(-images // cfg.aug_repeats), images)
    if run.resume_path:
        log.info("resumed from %s: %d steps done (epoch %d, step %d of %d)", run.resume_path,
                 run.start_step, run.start_step // steps_per_epoch + 1,
                 run.start_step % steps_per_epoch, steps_per_epoch)


def build_callbacks(cfg, run, data, model, net, ema, lr, global_batch, amp_level, stop, rank,
                    log):
    """The callbacks of ``Model.train``, in order: the step state first, then the ones that read
    it (signals, progress and metrics with the evaluator and the best checkpoint, checkpoints,
    profiler).

    Returns:
        SimpleNamespace: ``state``, ``monitor``, ``saver``, ``profiler`` (or None) and ``all``
        (the list).
    """
    is_main = rank == 0
    steps_per_epoch = data.steps_per_epoch
    evaluator = best = None
    if cfg.run_eval:
        best = BestCheckpoint(os.path.join(cfg.output_dir, f"{cfg.net_name}-best.ckpt"),
                              on_ema=cfg.best_on_ema and ema is not None, write=is_main)
        best.restore(run.best, run.folder_best)  # the checkpoints' best, not metrics.jsonl's
        shard = eval_shard(cfg.eval_data_path or cfg.data_path, data.eval_args, **data.shards)
        evaluator = build_evaluator(cfg, model, net, ema, shard, amp_level,
                                    best.metric if cfg.tensorboard else None)
    state = StepState(run.start_step, cfg.max_overflow_fraction, cfg.grad_accumulation_steps)
    tracker = (TensorBoardLog(os.path.join(cfg.output_dir, TENSORBOARD_FOLDER),
                              purge_step=run.start_step + 1, logger=log)
               if cfg.tensorboard and is_main else None)
    monitor = TrainMonitor(state, lr, global_batch, steps_per_epoch, cfg.log_interval,
                           os.path.join(cfg.output_dir, "metrics.jsonl") if is_main else None,
                           log, EvalKeepingBest(evaluator, best) if best is not None else None,
                           cfg.eval_interval, tracker, lr_group_tags(cfg, net),
                           confusion_at_best(tracker, evaluator, best, data.class_names))
    prunable = own_checkpoints(cfg.output_dir, cfg.net_name, steps_per_epoch,
                          run.start_step) if run.continues_here else []
    saver = CheckpointSaver(state, stop, cfg.output_dir, cfg.net_name, steps_per_epoch, len(lr),
                            json.dumps(run.config), cfg.save_checkpoint_epochs,
                            cfg.save_checkpoint_steps, cfg.keep_checkpoint_max, prunable,
                            write=is_main, best=best.score if best is not None else None,
                            train_data=json.dumps(run.data))
    profile = parse_profile_steps(cfg.profile_steps)
    profiler = ProfileSteps(state, *profile, os.path.join(cfg.output_dir, "profiler"), log,
                            total_steps=len(lr)) if profile else None
    on_steps = [stop, monitor, saver] + ([profiler] if profiler else [])
    agreement = stop.watch(state)  # after the saver: failures agreed at each epoch end
    return SimpleNamespace(state=state, monitor=monitor, saver=saver, profiler=profiler,
                           all=[state, OptimizerStepCallbacks(state, on_steps, [stop.install]),
                                agreement])


def lr_group_tags(cfg, net):
    """``{TensorBoard tag: LR multiple}`` of the layers whose LR is a multiple of the
    scheduled one (``layer_decay``, ``head_lr_scale``; ``train/lr/layerNN``, NN the layer's
    index, 0 = the stem, the last = ``fc``); empty without them."""
    if cfg.layer_decay == 1.0 and cfg.head_lr_scale == 1.0:
        return {}
    names = [p.name for p in net.get_parameters()]
    ids, _ = layer_ids(names)
    return {f"train/lr/layer{ids[name]:02d}": scale
            for name, scale in layer_lr_scales(names, cfg.layer_decay,
                                               cfg.head_lr_scale).items()}


def confusion_at_best(tracker, evaluator, best, class_names):
    """``TrainMonitor``'s ``after_eval`` for TensorBoard: after an evaluation that set a new
    best (``best``, a ``BestCheckpoint``), the chosen network's confusion matrix (kept by
    ``evaluator``) as image ``eval/confusion_matrix`` (eval.py's ``--plot`` picture) at that
    step; None without tracking or evaluation."""
    if tracker is None or evaluator is None:
        return None

    def after_eval(step, epoch):
        if best.is_new and evaluator.confusion is not None:
            tracker.drawn_image("eval/confusion_matrix", step, lambda path: plot_confusion(
                evaluator.confusion, class_names, path))
    return after_eval


def track_run_end(cfg, callbacks, run):
    """TensorBoard at the end of a run: the resolved config as hyperparameters with the last
    epoch record's numbers, then the file closed."""
    tracker = callbacks.monitor.tracker
    if tracker is None:
        return
    last = {}
    records = os.path.join(cfg.output_dir, "metrics.jsonl")
    if os.path.isfile(records):
        with open(records, encoding="utf-8") as f:
            lines = [line for line in f if line.strip()]
        last = json.loads(lines[-1]) if lines else {}
    metrics = {f"hparams/{key}": last[key] for key in ("loss", "top1", "top5", "best_top1",
                                                       "ema_top1") if key in last}
    tracker.hparams(run.config, metrics, callbacks.state.global_step)
    tracker.close()


def train_step_by_step(cfg, model, data, callbacks, start_step, stop, end_step=None):
    """Train from ``start_step`` to ``end_step`` (an epoch boundary; default: the end of
    ``epoch_size`` epochs), or until a stop, one batch per call (with
    ``grad_accumulation_steps`` k, k calls per optimizer step): each epoch its own pipeline
    (``epoch_dataset``), the batches a resumed run has already trained skipped, so a resumed
    run sees the same augmented images in the same order as an uninterrupted one. One
    ``Model.train`` call per epoch; the graph is compiled once (step-by-step calls reuse
    it)."""
    steps_per_epoch = data.steps_per_epoch
    end_epoch = cfg.epoch_size if end_step is None else end_step // steps_per_epoch
    callbacks.state.set_call_size(1)
    for epoch in range(start_step // steps_per_epoch, end_epoch):
        if stopped(callbacks, stop):
            return
        skip = max(0, start_step - epoch * steps_per_epoch)
        dataset = epoch_dataset(cfg, epoch, skip, data)
        model.train(epoch + 1, dataset, callbacks=callbacks.all, dataset_sink_mode=False,
                    initial_epoch=epoch)


def run_dataset(cfg, data):
    """The one training pipeline of a sink-mode run: all its epochs, seeded once from
    (``seed``, 0). MindSpore's sampler reshuffles it every epoch, the order a function of the
    seed and the epoch number alone; ``Dataset.set_init_step`` starts it at any step with
    that order (``train_in_sink_calls``)."""
    return training_pipeline(cfg, data, epoch_seed(cfg.seed, 0))


def train_in_sink_calls(cfg, model, data, callbacks, start_step, sink_size, stop,
                        build_dataset=run_dataset, end_step=None):
    """Train from ``start_step`` to ``end_step`` (an epoch boundary; default: the end of
    ``epoch_size`` epochs), or until a stop, in
    dataset sink mode (GPU/Ascend): one pipeline and one ``Model.train`` call for the run, so
    the sunk training graph is compiled once (``connect_network_with_dataset`` keeps one
    graph per dataset object: a new pipeline per epoch would compile the graph again).

    A resumed run starts the pipeline at its step (``set_init_step``): the same images in the
    same order and the same LR as an uninterrupted run; MindSpore's fast recovery (on by
    default) skips the random augmentation of the skipped batches, so the augmentation draws
    from there on differ from the uninterrupted run's. A run resumed off a call boundary (a
    checkpoint of step-by-step training or of ``save_checkpoint_steps``) first trains step by
    step up to the next boundary, on its own copy of the run pipeline: one more pipeline, one
    more ``Model.train`` call and the step-by-step graph compiled once more.

    With LP-FT each phase is one such call on its own pipeline (started at the switch step
    for the second), so the run compiles two training graphs.

    Steps are optimizer steps: with ``grad_accumulation_steps`` k a call of ``sink_size``
    steps feeds the device k x ``sink_size`` batches and the pipeline starts at batch
    k x ``start_step``.

    Args:
        build_dataset (callable): ``(cfg, data) -> Dataset`` of the whole run (``run_dataset``).
        end_step (int, optional): Step after which to stop (a multiple of ``sink_size``).
    """
    total = cfg.epoch_size * data.steps_per_epoch if end_step is None else end_step
    k = cfg.grad_accumulation_steps  # Model steps (batches) per optimizer step
    to_boundary = -start_step % sink_size  # steps before the next sink-call boundary
    if to_boundary:
        dataset = build_dataset(cfg, data)
        dataset.set_init_step(start_step * k)
        callbacks.state.set_call_size(1)
        model.train(cfg.epoch_size, dataset, callbacks=callbacks.all + [StopAtStep(
            callbacks.state, start_step + to_boundary)], dataset_sink_mode=False,
                    initial_epoch=start_step // data.steps_per_epoch)
        start_step += to_boundary
        if stopped(callbacks, stop) or callbacks.state.global_step < start_step:
            return
    dataset = build_dataset(cfg, data)
    if start_step:
        dataset.set_init_step(start_step * k)
    callbacks.state.set_call_size(sink_size * k)
    model.train(total // sink_size, dataset, callbacks=callbacks.all, dataset_sink_mode=True,
                sink_size=sink_size * k, initial_epoch=start_step // sink_size)


def benchmark_training(cfg, device_num, log):
    """``--benchmark_steps N``: N optimizer steps of the configured recipe on one synthetic
    batch of ``batch_size`` that stays on the device (``src.utils.throughput``), fed
    ``grad_accumulation_steps`` times per step; no dataset, no files. Returns 0."""
    net = training_network(cfg)
    amp_level = resolve_amp_level(cfg.amp_level, cfg.device_target)
    step = build_model(cfg, net, cfg.base_lr, amp_level)[0].train_network
    step.set_train()
    images_per_step = cfg.batch_size * cfg.grad_accumulation_steps
    images, labels = as_tensors(*synthetic_batch(
        cfg.batch_size, cfg.train_image_size, cfg.class_num,
        soft_targets=bool(cfg.mixup_alpha or cfg.cutmix_alpha)))
    log.info("benchmark_steps %d: %s, %d images per step per device at %d px, amp_level %s, "
             "%d device(s); data_path not read, nothing written", cfg.benchmark_steps,
             cfg.net_name, images_per_step, cfg.train_image_size, amp_level, device_num)
    def optimizer_step():
        for _ in range(cfg.grad_accumulation_steps - 1):
            step(images, labels)
        return loss_value(step(images, labels))

    warmup, timed = time_calls(optimizer_step, cfg.benchmark_steps)
    record, line = throughput_report("train", images_per_step, device_num, warmup, timed)
    record["optimizer_steps"] = int(step.optimizer.global_step.asnumpy().reshape(-1)[0])
    log.info("%s", line)
    print(json.dumps(record))
    return 0


def finish(callbacks, stop, total_steps, output_dir, log):
    """Exit status and the closing message: done, a checkpoint, record or log line not
    written, a non-finite loss, too many overflowed steps or stopped by a signal (a signal
    after the last step still ends "done"). In data parallel every rank exits with the status
    of the failure the ranks agreed on (``StepState.stopped_by``); a rank other than the one
    that stopped says which rank stopped and why."""
    state, saver = callbacks.state, callbacks.saver
    last = saver.last_saved or ("none" if saver.write else "named by rank 0")
    own = own_failure(callbacks)
    if own:
        log.error("stopped: %s; last good checkpoint: %s", own[0], last)
    if state.stopped_by:
        rank, reason, step = state.stopped_by
        if not own or reason != state.failure:
            log.error("stopped: rank %d stopped training (%s), every rank after global step "
                      "%d; last good checkpoint: %s", rank, STOP_REASONS[reason], step, last)
        return EXIT_SAVE_FAILED if reason == NOT_WRITTEN else EXIT_NONFINITE
    if own:
        return own[1]
    if stop.received and state.global_step < total_steps:
        log.warning("stopped by %s at global step %d, saved %s; resume with the same command "
                    "plus --resume_ckpt auto", stop.received, state.global_step,
                    saver.last_saved or "nothing (no step trained yet)")
        return 128 + stop.signum
    if stop.received:
        log.info("%s came after the last step: the run is complete", stop.received)
    log.info("done; outputs in %s; curves: python tools/plot_metrics.py %s -o %s", output_dir,
             os.path.join(output_dir, "metrics.jsonl"), os.path.join(output_dir, "curves.png"))
    return 0


def own_failure(callbacks):
    """This process's reason to stop, as (message, exit status), or None."""
    state, saver, monitor = callbacks.state, callbacks.saver, callbacks.monitor
    if monitor.error and not saver.error:
        return monitor.error, EXIT_SAVE_FAILED
    if saver.error:
        return saver.error, EXIT_NONFINITE if saver.diverged else EXIT_SAVE_FAILED
    if state.overflow_stop:
        return state.overflow_stop, EXIT_NONFINITE
    if state.nonfinite_step:
        return f"non-finite loss at global step {state.nonfinite_step}", EXIT_NONFINITE
    return None


if __name__ == "__main__":
    run_entry_point(main)
