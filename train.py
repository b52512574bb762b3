"""Train a ResNet image classifier with MindSpore.

    python train.py --data_path /data/imagenet/train                  # ResNet-50, config.yaml
    python train.py --config_path configs/resnet18_cifar10.yaml --data_path DIR --epoch_size 5

Reads top to bottom: config -> device -> dataset -> network -> LR -> optimizer -> loss ->
Model -> resume -> callbacks -> model.train per epoch. Outputs in --output_dir: checkpoints,
metrics.jsonl (one JSON line per epoch), config.yaml (the resolved config), class_names.txt,
train.log. Each epoch's data pipeline is seeded from (seed, epoch), so a run resumed with
--resume_ckpt sees the same data as an uninterrupted one. SIGINT/SIGTERM save and stop.
"""
from src.env import set_cpu_fast_path

set_cpu_fast_path()  # before MindSpore loads oneDNN

import os  # noqa: E402
import signal  # noqa: E402

import mindspore.dataset as ds  # noqa: E402
import mindspore.nn as nn  # noqa: E402
from mindspore.train import Model  # noqa: E402

from src.callbacks import BestCheckpointEvaluator, TrainMonitor  # noqa: E402
from src.checkpoint import load_into_network  # noqa: E402
from src.class_names import CIFAR10_CLASSES, CLASS_NAMES_FILE, write_class_names  # noqa: E402
from src.cli import run_entry_point  # noqa: E402
from src.config import ConfigError, parse_config  # noqa: E402
from src.dataset import class_names_of, create_dataset  # noqa: E402
from src.device import (check_fusion_config, init_distributed, loss_scale_setup,  # noqa: E402
                        resolve_amp_level, setup_device)
from src.image_check import readable_pipeline_errors  # noqa: E402
from src.logger import get_logger  # noqa: E402
from src.loss import CrossEntropySmooth  # noqa: E402
from src.lr_schedule import create_lr  # noqa: E402
from src.optimizer import create_optimizer  # noqa: E402
from src.resnet import create_network  # noqa: E402
from src.resume import (CheckpointSaver, epoch_seed, find_resume_checkpoint,  # noqa: E402
                        restore_training_state)


def check_train_config(cfg):
    """Reject values that cannot train, naming the key."""
    if not cfg.data_path:
        raise ConfigError("data_path is empty: give --data_path, the training data folder")
    for key in ("batch_size", "epoch_size", "class_num", "image_size", "log_interval",
                "save_checkpoint_epochs", "keep_checkpoint_max", "base_lr_batch_size"):
        if cfg[key] < 1:
            raise ConfigError(f"{key} must be a positive integer, got {cfg[key]}")
    if cfg.base_lr <= 0:
        raise ConfigError(f"base_lr must be positive, got {cfg.base_lr}")
    if cfg.run_eval and not cfg.eval_data_path:
        raise ConfigError("run_eval is true but eval_data_path is empty")
    for key in ("save_checkpoint_steps", "warmup_epochs"):
        if cfg[key] < 0:
            raise ConfigError(f"{key} must be 0 or positive, got {cfg[key]}")
    low, high = (cfg.train_crop_scale + [None, None])[:2]
    if len(cfg.train_crop_scale) != 2 or not 0 < low <= high <= 1:
        raise ConfigError(f"train_crop_scale must be [min, max] with 0 < min <= max <= 1, got "
                          f"{cfg.train_crop_scale}")


def resume_checkpoint_path(cfg, steps_per_epoch, log):
    """``resume_ckpt`` resolved: a path, the newest readable checkpoint for ``auto``, or ""."""
    if cfg.resume_ckpt != "auto":
        return cfg.resume_ckpt
    path = find_resume_checkpoint(cfg.output_dir, cfg.net_name, steps_per_epoch)
    if path is None:
        log.info("resume_ckpt auto: no checkpoint in %s, starting from scratch", cfg.output_dir)
    return path or ""


def epoch_dataset(cfg, epoch, skip_steps, data_args, shards):
    """The training pipeline of ``epoch``, seeded from (seed, epoch), first ``skip_steps``
    batches skipped (they are still read, so random augmentation stays in step). The image
    check ran when the first pipeline was built (``src.image_check`` checks a folder once)."""
    ds.config.set_seed(epoch_seed(cfg.seed, epoch))
    data = create_dataset(cfg.data_path, is_training=True, **data_args, **shards)
    return data.skip(skip_steps) if skip_steps else data


def main(argv=None):
    """Train as configured by ``argv`` (default: the command line); returns the exit status
    (0 done, 3 non-finite loss, 128 + signal number when stopped by SIGINT/SIGTERM)."""
    # ---- config and device ----
    cfg = parse_config(argv, description=__doc__.split("\n")[0])
    check_train_config(cfg)
    setup_device(cfg)
    rank, device_num = init_distributed(cfg)
    os.makedirs(cfg.output_dir, exist_ok=True)
    is_main = rank == 0
    log = get_logger("train", os.path.join(cfg.output_dir, "train.log") if is_main else None,
                     rank)
    log.info("resolved config:\n%s", cfg.to_yaml())
    if is_main:
        with open(os.path.join(cfg.output_dir, "config.yaml"), "w", encoding="utf-8") as f:
            f.write(cfg.to_yaml())

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
    if is_main:
        write_class_names(os.path.join(cfg.output_dir, CLASS_NAMES_FILE), class_names)

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
    lr, peak_lr = create_lr(cfg, steps_per_epoch, global_batch)
    log.info("global batch %d (%d per device x %d devices): effective peak LR %.6g "
             "(base_lr %g per %d images); %d steps per epoch, %d in all",
             global_batch, cfg.batch_size, device_num, peak_lr, cfg.base_lr,
             cfg.base_lr_batch_size, steps_per_epoch, len(lr))
    amp_level = resolve_amp_level(cfg)
    scale_manager, optimizer_loss_scale = loss_scale_setup(cfg, amp_level)
    optimizer = create_optimizer(net, lr, cfg.momentum, cfg.weight_decay, optimizer_loss_scale)
    loss_fn = CrossEntropySmooth(cfg.label_smoothing, cfg.class_num)

    # ---- model: on GPU/Ascend, steps whose scaled gradients overflow are skipped and counted ----
    model = Model(net, loss_fn=loss_fn, optimizer=optimizer, amp_level=amp_level,
                  loss_scale_manager=scale_manager,
                  metrics={"top1": nn.Top1CategoricalAccuracy(),
                           "top5": nn.TopKCategoricalAccuracy(min(5, cfg.class_num))})
    log.info("amp_level %s, loss scale %s, device %s", amp_level,
             cfg.loss_scale if scale_manager else "none", cfg.device_target)

    # ---- resume ----
    start_step = 0
    resume_path = resume_checkpoint_path(cfg, steps_per_epoch, log)
    if resume_path:
        start_step = restore_training_state(net, optimizer, resume_path)
        if start_step >= len(lr):
            raise ConfigError(f"{resume_path} has already trained all {len(lr)} steps of "
                              f"epoch_size {cfg.epoch_size}")
        log.info("resumed from %s: %d steps done (epoch %d, step %d of %d)", resume_path,
                 start_step, start_step // steps_per_epoch + 1,
                 start_step % steps_per_epoch, steps_per_epoch)

    # ---- callbacks ----
    evaluator = None
    if cfg.run_eval:
        eval_set = create_dataset(cfg.eval_data_path, is_training=False, **data_args)
        evaluator = BestCheckpointEvaluator(model, eval_set, os.path.join(
            cfg.output_dir, f"{cfg.net_name}-best.ckpt"))
    metrics_path = os.path.join(cfg.output_dir, "metrics.jsonl") if is_main else None
    if metrics_path and start_step == 0 and os.path.exists(metrics_path):
        os.remove(metrics_path)  # a fresh run starts a fresh record; a resumed one appends
    monitor = TrainMonitor(lr, global_batch, steps_per_epoch, cfg.log_interval, metrics_path,
                           log, evaluator, cfg.eval_interval, start_step)
    saver = CheckpointSaver(cfg.output_dir, cfg.net_name, steps_per_epoch, len(lr), start_step,
                            cfg.save_checkpoint_epochs, cfg.save_checkpoint_steps,
                            cfg.keep_checkpoint_max, write=is_main)

    # ---- train, one Model.train call per epoch ----
    try:
        with readable_pipeline_errors():
            for epoch in range(start_step // steps_per_epoch, cfg.epoch_size):
                skip = max(0, start_step - epoch * steps_per_epoch)
                data = epoch_dataset(cfg, epoch, skip, data_args, shards)
                model.train(epoch + 1, data, callbacks=[monitor, saver], dataset_sink_mode=False,
                            initial_epoch=epoch)
                if monitor.nonfinite_step or saver.signal_received:
                    break
    finally:
        saver.restore_signal_handlers()
    return finish(monitor, saver, cfg, log)


def finish(monitor, saver, cfg, log):
    """Exit status and the closing message: done, stopped by a signal, or a non-finite loss."""
    if monitor.nonfinite_step:
        log.error("stopped: non-finite loss at global step %d; newest good checkpoint: %s",
                  monitor.nonfinite_step, saver.last_saved or "none")
        return 3
    if saver.signal_received:
        log.warning("stopped by %s at global step %d, saved %s; resume with the same command "
                    "plus --resume_ckpt auto", saver.signal_received, saver.global_step,
                    saver.last_saved)
        return 128 + getattr(signal, saver.signal_received)
    log.info("done; outputs in %s", cfg.output_dir)
    return 0


if __name__ == "__main__":
    run_entry_point(main)
