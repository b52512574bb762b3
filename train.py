"""Train a ResNet image classifier with MindSpore.

    python train.py --data_path /data/imagenet/train                  # ResNet-50, config.yaml
    python train.py --config_path configs/resnet18_cifar10.yaml --data_path DIR --epoch_size 5

Reads top to bottom: config -> signals -> device -> dataset -> network -> LR -> optimizer ->
loss -> Model -> resume -> output folder -> callbacks -> model.train per epoch. Outputs in
--output_dir: checkpoints, metrics.jsonl (one JSON line per epoch), config.yaml (the resolved
config), class_names.txt, train.log. A fresh run refuses a folder holding another run's files
(--resume_ckpt auto continues it; --overwrite true moves them aside). Each epoch's data
pipeline is seeded from (seed, epoch), so a run resumed with --resume_ckpt sees the same data
as an uninterrupted one. SIGINT/SIGTERM save and stop; a second Ctrl-C exits at once.
Exit status: 0 done, 2 bad input, 3 non-finite loss or parameters, 4 a checkpoint could not be
written (disk full, permission), 128 + signal number when stopped by SIGINT/SIGTERM.
"""
import src.env  # first: sets the oneDNN default before MindSpore loads
# isort: split

import json
import logging
import os

import mindspore.dataset as ds
import mindspore.nn as nn
from mindspore.train import Model

from src.callbacks import (BestCheckpointEvaluator, CheckpointSaver, StepState, StopSignals,
                           TrainMonitor)
from src.checkpoint import load_into_network, own_checkpoints
from src.class_names import CIFAR10_CLASSES, CLASS_NAMES_FILE, write_class_names
from src.cli import run_entry_point
from src.config import ConfigError, parse_config
from src.dataset import class_names_of, create_dataset
from src.device import all_gather_int, check_fusion_config, init_distributed, setup_device
from src.image_check import readable_pipeline_errors
from src.logger import get_logger
from src.loss import CrossEntropySmooth
from src.lr_schedule import LR_KEYS, create_lr
from src.optimizer import create_optimizer
from src.output_dir import prepare_output_dir
from src.precision import loss_scale_setup, resolve_amp_level
from src.resnet import create_network
from src.resume import (NOT_RESTORED, agree_across_ranks, check_same_recipe, epoch_seed,
                        find_resume_checkpoint, restore_training_state)

SECTIONS = ("network", "data", "training data", "optimization", "device",
            "precision, distribution", "outputs", "training checkpoints")
EXIT_NONFINITE, EXIT_SAVE_FAILED = 3, 4


def check_train_config(cfg):
    """Reject training values that cannot work, naming the key (ranges: ``check_values``)."""
    if not cfg.data_path:
        raise ConfigError("data_path is empty: give --data_path, the training data folder")
    if cfg.run_eval and not cfg.eval_data_path:
        raise ConfigError("run_eval is true but eval_data_path is empty")


def resume_checkpoint_path(cfg, train_network, steps_per_epoch, device_num, log):
    """``resume_ckpt`` resolved to a path ("" to start from scratch): as given, or for
    ``auto`` the newest usable checkpoint in ``output_dir``; in data parallel, rank 0's
    choice, which every rank must hold."""
    names = [p.name for p in train_network.get_parameters()
             if not p.name.startswith(NOT_RESTORED)]
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


def epoch_dataset(cfg, epoch, skip_steps, data_args, shards):
    """The training pipeline of ``epoch``, seeded from (seed, epoch), first ``skip_steps``
    batches skipped (they are still read, so random augmentation stays in step). The image
    check ran when the first pipeline was built (``src.image_check`` checks a folder once)."""
    ds.config.set_seed(epoch_seed(cfg.seed, epoch))
    data = create_dataset(cfg.data_path, is_training=True, **data_args, **shards)
    return data.skip(skip_steps) if skip_steps else data


def main(argv=None):
    """Train as configured by ``argv`` (default: the command line); returns the exit status
    (see the module docstring)."""
    # ---- config, signals (caught from here on), device ----
    cfg = parse_config(argv, description=__doc__.split("\n")[0], sections=SECTIONS)
    check_train_config(cfg)
    stop = StopSignals(logging.getLogger("train"))
    stop.install()
    setup_device(cfg.mode, cfg.device_target, cfg.device_id, cfg.seed, cfg.run_distribute)
    rank, device_num = init_distributed(cfg.run_distribute, cfg.device_num,
                                        cfg.all_reduce_fusion_config)
    is_main = rank == 0
    log = get_logger("train", None, rank)

    # ---- data ----
    data_args = dict(dataset=cfg.dataset, batch_size=cfg.batch_size, image_size=cfg.image_size,
                     eval_resize=cfg.eval_resize, crop_scale=cfg.train_crop_scale,
                     num_parallel_workers=cfg.num_parallel_workers, check_images=cfg.check_images)
    shards = dict(num_shards=device_num, shard_id=rank) if device_num > 1 else {}
    train_set = create_dataset(cfg.data_path, is_training=True, **data_args, **shards)
    steps_per_epoch = train_set.get_dataset_size()
    if steps_per_epoch == 0:
        raise ConfigError(f"data_path {cfg.data_path} gives 0 full batches of batch_size "
                          f"{cfg.batch_size} per device: lower batch_size")
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
        dropped = load_into_network(net, cfg.pre_trained, drop_mismatched_classifier=True)
        log.info("initialized from %s%s", cfg.pre_trained,
                 f"; classifier {dropped} dropped (class count differs), fc trained from "
                 f"scratch" if dropped else "")

    # ---- LR, optimizer, loss ----
    global_batch = cfg.batch_size * device_num
    lr, peak_lr = create_lr(**{k: cfg[k] for k in LR_KEYS}, global_batch_size=global_batch,
                            steps_per_epoch=steps_per_epoch)
    amp_level = resolve_amp_level(cfg.amp_level, cfg.device_target)
    scale_manager, optimizer_loss_scale = loss_scale_setup(amp_level, cfg.device_target,
                                                           cfg.loss_scale)
    optimizer = create_optimizer(net, lr, cfg.momentum, cfg.weight_decay, optimizer_loss_scale)
    loss_fn = CrossEntropySmooth(cfg.label_smoothing, cfg.class_num)

    # ---- model: on GPU/Ascend, steps whose scaled gradients overflow are skipped and counted ----
    model = Model(net, loss_fn=loss_fn, optimizer=optimizer, amp_level=amp_level,
                  loss_scale_manager=scale_manager,
                  metrics={"top1": nn.Top1CategoricalAccuracy(),
                           "top5": nn.TopKCategoricalAccuracy(min(5, cfg.class_num))})

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
    log.info("global batch %d (%d per device x %d devices): effective peak LR %.6g "
             "(base_lr %g per %d images); %d steps per epoch, %d in all",
             global_batch, cfg.batch_size, device_num, peak_lr, cfg.base_lr,
             cfg.base_lr_batch_size, steps_per_epoch, len(lr))
    log.info("amp_level %s, loss scale %s, device %s", amp_level,
             cfg.loss_scale if scale_manager else "none", cfg.device_target)
    if resume_path:
        log.info("resumed from %s: %d steps done (epoch %d, step %d of %d)", resume_path,
                 start_step, start_step // steps_per_epoch + 1,
                 start_step % steps_per_epoch, steps_per_epoch)

    # ---- callbacks: the step state first, then the ones that read it ----
    evaluator = None
    if cfg.run_eval:
        eval_set = create_dataset(cfg.eval_data_path, is_training=False, **data_args)
        evaluator = BestCheckpointEvaluator(model, eval_set, os.path.join(
            cfg.output_dir, f"{cfg.net_name}-best.ckpt"))
    state = StepState(start_step)
    monitor = TrainMonitor(state, lr, global_batch, steps_per_epoch, cfg.log_interval,
                           os.path.join(cfg.output_dir, "metrics.jsonl") if is_main else None,
                           log, evaluator, cfg.eval_interval)
    own = own_checkpoints(cfg.output_dir, cfg.net_name, steps_per_epoch,
                          start_step) if continues_here else []
    saver = CheckpointSaver(state, stop, cfg.output_dir, cfg.net_name, steps_per_epoch, len(lr),
                            json.dumps(run_config), cfg.save_checkpoint_epochs,
                            cfg.save_checkpoint_steps, cfg.keep_checkpoint_max, own,
                            write=is_main)

    # ---- train, one Model.train call per epoch ----
    try:
        with readable_pipeline_errors():
            for epoch in range(start_step // steps_per_epoch, cfg.epoch_size):
                if stop.received or state.nonfinite_step or saver.error:
                    break
                skip = max(0, start_step - epoch * steps_per_epoch)
                data = epoch_dataset(cfg, epoch, skip, data_args, shards)
                model.train(epoch + 1, data, callbacks=[state, stop, monitor, saver],
                            dataset_sink_mode=False, initial_epoch=epoch)
    finally:
        stop.restore()
    return finish(state, stop, saver, len(lr), cfg.output_dir, log)


def finish(state, stop, saver, total_steps, output_dir, log):
    """Exit status and the closing message: done, a checkpoint not written, a non-finite loss
    or stopped by a signal (a signal after the last step still ends "done")."""
    if saver.error:
        log.error("stopped: %s; last good checkpoint: %s", saver.error,
                  saver.last_saved or "none")
        return EXIT_NONFINITE if saver.diverged else EXIT_SAVE_FAILED
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
