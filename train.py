"""Train a ResNet image classifier with MindSpore.

    python train.py --data_path /data/imagenet/train                  # ResNet-50, config.yaml
    python train.py --config_path configs/resnet18_cifar10.yaml --data_path DIR --epoch_size 5

Reads top to bottom: config -> signals -> device -> dataset -> network -> LR -> Model (loss,
optimizer, TrainStep, EMA) -> resume -> output folder -> callbacks -> model.train per epoch.
Outputs in --output_dir: checkpoints, metrics.jsonl (one JSON line per epoch), config.yaml
(the resolved config), class_names.txt, train.log. A fresh run refuses a folder holding
another run's files (--resume_ckpt auto continues it; --overwrite true moves them aside).
Each epoch's data pipeline is seeded from (seed, epoch), so a run resumed with --resume_ckpt
sees the same data as an uninterrupted one. SIGINT/SIGTERM save and stop; a second Ctrl-C
exits at once.
Exit status: 0 done, 2 bad input, 3 non-finite loss or parameters, or more than
max_overflow_fraction of the last 100 steps overflowed (loss scaling), 4 a checkpoint could
not be written (disk full, permission), 128 + signal number when stopped by SIGINT/SIGTERM.
"""
import src.env  # noqa: F401  first: sets the oneDNN default before MindSpore loads

# isort: split

import json
import logging
import os

import mindspore as ms
import mindspore.dataset as ds

from src.data.class_names import CIFAR10_CLASSES, CLASS_NAMES_FILE, write_class_names
from src.data.image_check import readable_pipeline_errors
from src.data.mixing import BatchMixer
from src.data.pipeline import class_names_of, create_dataset
from src.models.resnet import create_network
from src.training.callbacks import CheckpointSaver, StepState, StopSignals, TrainMonitor, loss_value
from src.training.evaluator import BestCheckpointEvaluator
from src.training.lr_schedule import LR_KEYS, create_lr
from src.training.model import build_model, eval_model
from src.training.output_dir import prepare_output_dir
from src.training.precision import resolve_amp_level, resolve_loss_scale_type
from src.training.profiler import ProfileSteps, parse_profile_steps
from src.training.resume import (
    NOT_REQUIRED,
    agree_across_ranks,
    check_same_recipe,
    epoch_seed,
    find_resume_checkpoint,
    restore_training_state,
)
from src.utils.checkpoint import load_into_network, own_checkpoints
from src.utils.cli import run_entry_point
from src.utils.config import ConfigError, parse_config
from src.utils.device import all_gather_int, check_fusion_config, init_distributed, setup_device
from src.utils.logger import get_logger
from src.utils.throughput import as_tensors, synthetic_batch, throughput_report, time_calls

SECTIONS = ("network", "data", "training data", "optimization", "device",
            "precision, distribution", "outputs", "performance", "training checkpoints")
EXIT_NONFINITE, EXIT_SAVE_FAILED = 3, 4


def check_train_config(cfg):
    """Reject training values that cannot work, naming the key (ranges: ``check_values``)."""
    if not cfg.data_path:
        raise ConfigError("data_path is empty: give --data_path, the training data folder")
    if cfg.run_eval and not cfg.eval_data_path:
        raise ConfigError("run_eval is true but eval_data_path is empty")
    parse_profile_steps(cfg.profile_steps)


def resume_checkpoint_path(cfg, train_network, steps_per_epoch, device_num, log):
    """``resume_ckpt`` resolved to a path ("" to start from scratch): as given, or for
    ``auto`` the newest usable checkpoint in ``output_dir``; in data parallel, rank 0's
    choice, which every rank must hold."""
    names = [p.name for p in train_network.get_parameters()
             if not p.name.startswith(NOT_REQUIRED)]
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
    """Keyword arguments of the training pipeline: one batch is one optimizer step
    (``grad_accumulation_steps`` micro-batches of ``batch_size``), with the augmentations."""
    return dict(data_args, batch_size=cfg.batch_size * cfg.grad_accumulation_steps,
                image_size=cfg.train_image_size, crop_scale=cfg.train_crop_scale,
                auto_augment=cfg.auto_augment, randaugment_num_ops=cfg.randaugment_num_ops,
                randaugment_magnitude=cfg.randaugment_magnitude,
                random_erasing=cfg.random_erasing)


def batch_mixer(cfg, seed):
    """The mixup/cutmix op of the training batches (None when both are off), its draws a
    function of (``seed``, batch number) only."""
    if not (cfg.mixup_alpha or cfg.cutmix_alpha):
        return None
    return BatchMixer(mixup_alpha=cfg.mixup_alpha, cutmix_alpha=cfg.cutmix_alpha,
                      mix_prob=cfg.mix_prob, mix_switch_prob=cfg.mix_switch_prob,
                      label_smoothing=cfg.label_smoothing, class_num=cfg.class_num, seed=seed)


def epoch_dataset(cfg, epoch, skip_steps, train_args, shards):
    """The training pipeline of ``epoch``, seeded from (seed, epoch), first ``skip_steps``
    batches skipped (they are still read, so random augmentation stays in step). The image
    check ran when the first pipeline was built (``src.data.image_check`` checks a folder once)."""
    seed = epoch_seed(cfg.seed, epoch)
    ds.config.set_seed(seed)
    data = create_dataset(cfg.data_path, is_training=True, **train_args, **shards,
                          batch_transform=batch_mixer(cfg, seed))
    return data.skip(skip_steps) if skip_steps else data


def resolve_sink_size(cfg, steps_per_epoch):
    """Steps per dataset-sink call, 0 for step-by-step training: ``dataset_sink_mode`` auto is
    sink mode on GPU/Ascend in graph mode; ``sink_size`` 0 is one epoch.

    Raises:
        ConfigError: For ``dataset_sink_mode true`` on CPU: MindSpore 2.10's ``Model.train``
            runs no sink mode there (it logs that and trains step by step, each "epoch" a
            whole pass of the data), so the sink calls would not be what they claim. Also in
            PyNative mode, where ``Model.train`` calls the step callbacks once per step even
            in sink mode, so a callback would not end ``sink_size`` steps.
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
    return (cfg.sink_size or steps_per_epoch) if sink else 0


def epoch_calls(remaining, sink_size):
    """How the ``remaining`` steps of an epoch run: a list of (steps, sink size or 0 for step
    by step). In sink mode the steps short of a whole sink call (a ``sink_size`` that does not
    divide the epoch, or a run resumed from a checkpoint of step-by-step training) run step by
    step first, so every later call ends on the same steps as in an uninterrupted run."""
    if not sink_size:
        return [(remaining, 0)]
    head = remaining % sink_size
    return ([(head, 0)] if head else []) + ([(remaining - head, sink_size)]
                                            if remaining > head else [])


def build_evaluator(cfg, model, net, ema, eval_set, amp_level):
    """``BestCheckpointEvaluator`` of the live network and, with an EMA, of the averages (in a
    second network of the same architecture)."""
    ema_model = None
    if ema is not None:
        ema_net = ms.amp.auto_mixed_precision(
            create_network(cfg.net_name, cfg.class_num, cfg.zero_init_residual), amp_level)
        ema_model = eval_model(cfg, ema_net, amp_level)
    return BestCheckpointEvaluator(model, eval_set, os.path.join(
        cfg.output_dir, f"{cfg.net_name}-best.ckpt"), net, ema, ema_model, cfg.best_on_ema)


def main(argv=None):
    """Train as configured by ``argv`` (default: the command line); returns the exit status
    (see the module docstring)."""
    # ---- config, signals (caught from here on), device ----
    cfg = parse_config(argv, description=__doc__.split("\n")[0], sections=SECTIONS)
    if not cfg.benchmark_steps:
        check_train_config(cfg)
    stop = StopSignals(logging.getLogger("train"))
    stop.install()
    setup_device(cfg.mode, cfg.device_target, cfg.device_id, cfg.seed, cfg.run_distribute)
    rank, device_num = init_distributed(cfg.run_distribute, cfg.device_num,
                                        cfg.all_reduce_fusion_config)
    is_main = rank == 0
    log = get_logger("train", None, rank)
    if cfg.benchmark_steps:
        return benchmark_training(cfg, device_num, log)

    # ---- data ----
    data_args = dict(dataset=cfg.dataset, batch_size=cfg.batch_size,
                     image_size=cfg.eval_image_size, eval_resize=cfg.eval_resize,
                     num_parallel_workers=cfg.num_parallel_workers, check_images=cfg.check_images)
    train_args = train_data_args(cfg, data_args)
    shards = dict(num_shards=device_num, shard_id=rank) if device_num > 1 else {}
    train_set = create_dataset(cfg.data_path, is_training=True, **train_args, **shards)
    steps_per_epoch = train_set.get_dataset_size()
    if steps_per_epoch == 0:
        raise ConfigError(f"data_path {cfg.data_path} gives 0 full batches of batch_size "
                          f"{cfg.batch_size} x grad_accumulation_steps "
                          f"{cfg.grad_accumulation_steps} per device: lower them")
    class_names = (class_names_of(cfg.data_path) if cfg.dataset == "imagefolder"
                   else CIFAR10_CLASSES)
    if len(class_names) != cfg.class_num:
        raise ConfigError(f"data_path {cfg.data_path} has {len(class_names)} classes but "
                          f"class_num is {cfg.class_num}")
    if cfg.run_eval and cfg.dataset == "imagefolder" and class_names_of(
            cfg.eval_data_path) != class_names:
        raise ConfigError(f"eval_data_path {cfg.eval_data_path} has other class folders than "
                          f"data_path {cfg.data_path}: labels would not match")

    # ---- network ----
    net = create_network(cfg.net_name, cfg.class_num, cfg.zero_init_residual)
    if device_num > 1:
        check_fusion_config(cfg.all_reduce_fusion_config, len(net.trainable_params()),
                            cfg.net_name)
    if cfg.pre_trained:
        dropped, _ = load_into_network(net, cfg.pre_trained, drop_mismatched_classifier=True)
        log.info("initialized from %s%s", cfg.pre_trained,
                 f"; classifier {dropped} dropped (class count differs), fc trained from "
                 f"scratch" if dropped else "")

    # ---- LR (per optimizer step), then the model: loss, optimizer, TrainStep ----
    global_batch = cfg.batch_size * cfg.grad_accumulation_steps * device_num
    lr, peak_lr = create_lr(**{k: cfg[k] for k in LR_KEYS}, global_batch_size=global_batch,
                            steps_per_epoch=steps_per_epoch)
    amp_level = resolve_amp_level(cfg.amp_level, cfg.device_target)
    # on GPU/Ascend, steps whose scaled gradients overflow are skipped and counted
    model, ema = build_model(cfg, net, lr, amp_level)

    # ---- resume: the same recipe, the same step of the data and of the LR schedule ----
    run_config = dict(cfg, device_num=device_num)
    start_step = 0
    resume_path = resume_checkpoint_path(cfg, model.train_network, steps_per_epoch, device_num,
                                         log)
    if resume_path:
        start_step, stored = restore_training_state(model.train_network, resume_path)
        if not cfg.resume_ignore_config:
            check_same_recipe(resume_path, stored, run_config)
        if start_step >= len(lr):
            raise ConfigError(f"{resume_path} has already trained all {len(lr)} steps of "
                              f"epoch_size {cfg.epoch_size}")

    # ---- output folder: one run per folder; logs, resolved config, class names ----
    continues_here = bool(resume_path) and in_folder(resume_path, cfg.output_dir)
    moved = None
    if is_main:  # other ranks write no files (and may share the folder)
        moved = prepare_output_dir(cfg.output_dir, not continues_here, cfg.overwrite)
    os.makedirs(cfg.output_dir, exist_ok=True)
    log = get_logger("train", os.path.join(cfg.output_dir, "train.log") if is_main else None,
                     rank)
    log.info("resolved config:\n%s", cfg.to_yaml())
    if moved:
        log.warning("overwrite: the earlier run's files in %s were moved to %s",
                    cfg.output_dir, moved)
    if is_main:
        with open(os.path.join(cfg.output_dir, "config.yaml"), "w", encoding="utf-8") as f:
            f.write(cfg.to_yaml())
        write_class_names(os.path.join(cfg.output_dir, CLASS_NAMES_FILE), class_names)
    accumulated = cfg.grad_accumulation_steps
    log.info("global batch %d (%d per device x %d devices%s): effective peak LR %.6g (base_lr "
             "%g per %d images); %d optimizer steps per epoch, %d in all", global_batch,
             cfg.batch_size, device_num, f" x {accumulated} accumulated micro-batches"
             if accumulated > 1 else "", peak_lr, cfg.base_lr, cfg.base_lr_batch_size,
             steps_per_epoch, len(lr))
    log.info("amp_level %s, loss scale %s, device %s; optimizer %s, loss %s%s", amp_level,
             f"{resolve_loss_scale_type(cfg.loss_scale_type, cfg.device_target)} "
             f"{cfg.loss_scale}" if amp_level != "O0" else "none", cfg.device_target,
             cfg.optimizer, cfg.loss, f", weight EMA decay {cfg.ema_decay}" if ema else "")
    if resume_path:
        log.info("resumed from %s: %d steps done (epoch %d, step %d of %d)", resume_path,
                 start_step, start_step // steps_per_epoch + 1,
                 start_step % steps_per_epoch, steps_per_epoch)

    sink_size = resolve_sink_size(cfg, steps_per_epoch)
    log.info("dataset sink mode: %s", f"{sink_size} steps per call" if sink_size else "off")

    # ---- callbacks: the step state first, then the ones that read it ----
    evaluator = None
    if cfg.run_eval:
        eval_set = create_dataset(cfg.eval_data_path, is_training=False, **data_args)
        evaluator = build_evaluator(cfg, model, net, ema, eval_set, amp_level)
    state = StepState(start_step, cfg.max_overflow_fraction)
    monitor = TrainMonitor(state, lr, global_batch, steps_per_epoch, cfg.log_interval,
                           os.path.join(cfg.output_dir, "metrics.jsonl") if is_main else None,
                           log, evaluator, cfg.eval_interval)
    own = own_checkpoints(cfg.output_dir, cfg.net_name, steps_per_epoch,
                          start_step) if continues_here else []
    saver = CheckpointSaver(state, stop, cfg.output_dir, cfg.net_name, steps_per_epoch, len(lr),
                            json.dumps(run_config), cfg.save_checkpoint_epochs,
                            cfg.save_checkpoint_steps, cfg.keep_checkpoint_max, own,
                            write=is_main)
    profile = parse_profile_steps(cfg.profile_steps)
    profiler = ProfileSteps(state, *profile, os.path.join(cfg.output_dir, "profiler"), log,
                            total_steps=len(lr)) if profile else None
    callbacks = [state, stop, monitor, saver] + ([profiler] if profiler else [])

    # ---- train: each epoch's own pipeline, step by step or in sink calls ----
    try:
        with readable_pipeline_errors():
            for epoch in range(start_step // steps_per_epoch, cfg.epoch_size):
                skip = max(0, start_step - epoch * steps_per_epoch)
                for steps, sink in epoch_calls(steps_per_epoch - skip, sink_size):
                    if stop.received or state.must_stop or saver.error:
                        break
                    data = epoch_dataset(cfg, epoch, skip, train_args, shards).take(steps)
                    state.steps_per_call = sink or 1
                    if sink:
                        model.train(steps // sink, data, callbacks=callbacks,
                                    dataset_sink_mode=True, sink_size=sink)
                    else:
                        model.train(epoch + 1, data, callbacks=callbacks,
                                    dataset_sink_mode=False, initial_epoch=epoch)
                    skip += steps
    finally:
        stop.restore()
        if profiler:
            profiler.close()  # analyses the steps recorded before a stop
    return finish(state, stop, saver, len(lr), cfg.output_dir, log)


def benchmark_training(cfg, device_num, log):
    """``--benchmark_steps N``: N training steps of the configured recipe on one synthetic
    batch that stays on the device (``src.utils.throughput``); no dataset, no files. Returns 0."""
    net = create_network(cfg.net_name, cfg.class_num, cfg.zero_init_residual)
    amp_level = resolve_amp_level(cfg.amp_level, cfg.device_target)
    step = build_model(cfg, net, cfg.base_lr, amp_level)[0].train_network
    step.set_train()
    images_per_step = cfg.batch_size * cfg.grad_accumulation_steps
    images, labels = as_tensors(*synthetic_batch(
        images_per_step, cfg.train_image_size, cfg.class_num,
        soft_targets=bool(cfg.mixup_alpha or cfg.cutmix_alpha)))
    log.info("benchmark_steps %d: %s, %d images per step per device at %d px, amp_level %s, "
             "%d device(s); data_path not read, nothing written", cfg.benchmark_steps,
             cfg.net_name, images_per_step, cfg.train_image_size, amp_level, device_num)
    warmup, timed = time_calls(lambda: loss_value(step(images, labels)), cfg.benchmark_steps)
    record, line = throughput_report("train", images_per_step, device_num, warmup, timed)
    log.info("%s", line)
    print(json.dumps(record))
    return 0


def finish(state, stop, saver, total_steps, output_dir, log):
    """Exit status and the closing message: done, a checkpoint not written, a non-finite loss,
    too many overflowed steps or stopped by a signal (a signal after the last step still ends
    "done")."""
    if saver.error:
        log.error("stopped: %s; last good checkpoint: %s", saver.error,
                  saver.last_saved or "none")
        return EXIT_NONFINITE if saver.diverged else EXIT_SAVE_FAILED
    if state.overflow_stop:
        log.error("stopped: %s; last good checkpoint: %s", state.overflow_stop,
                  saver.last_saved or "none")
        return EXIT_NONFINITE
    if state.nonfinite_step:
        log.error("stopped: non-finite loss at global step %d; last good checkpoint: %s",
                  state.nonfinite_step, saver.last_saved or "none")
        return EXIT_NONFINITE
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


if __name__ == "__main__":
    run_entry_point(main)
