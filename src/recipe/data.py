"""The training data from the config: the data settings (``eval_preprocess``,
``train_augment``), what a run reads (``build_data``: ``TrainData``) and the loop's pipeline
builders (``epoch_dataset``, ``run_dataset``, ``train_plan``).
"""
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

import mindspore.dataset as ds

from src.data.class_names import CIFAR10_CLASSES
from src.data.mixing import BatchMixer
from src.data.pipeline import class_names_of, count_images, create_dataset
from src.data.settings import EvalPreprocess, Sampling, TrainAugment
from src.recipe.splits import check_positive_labels, data_split, held_out, label_tables
from src.training.loop import TrainPlan
from src.training.resume import epoch_seed
from src.utils.config import INT32_MAX, Config, ConfigError
from src.utils.tasks import get_task


def eval_preprocess(cfg: Config) -> EvalPreprocess:
    """The eval preprocessing of the config (``eval_image_size``, ``eval_resize``,
    ``eval_interpolation``, ``exif_transpose``)."""
    return EvalPreprocess(image_size=cfg.eval_image_size, resize=cfg.eval_resize,
                          interpolation=cfg.eval_interpolation,
                          exif_transpose=cfg.exif_transpose)


TRAIN_AUGMENT_KEYS = {"image_size": "train_image_size", "crop_scale": "train_crop_scale"}
"""``TrainAugment`` fields whose config key is named otherwise; the others are named alike."""


def train_augment(cfg: Config) -> TrainAugment:
    """The training crop and augmentations of the config: each ``TrainAugment`` field from
    its config key (``TRAIN_AUGMENT_KEYS``), those without one at their defaults."""
    keys = {f.name: TRAIN_AUGMENT_KEYS.get(f.name, f.name) for f in fields(TrainAugment)}
    return TrainAugment(**{name: cfg[key] for name, key in keys.items() if key in cfg})


@dataclass
class TrainData:
    """The training data as a run sees it (``build_data``): ``create_dataset`` keywords of
    data_path's eval pipeline, the training pipeline and ``run_eval``'s; the data-parallel
    ``shards``; per-device steps and batches per epoch (``cut_epochs``: the pipeline is cut to
    them); class names; training images over all devices (checked on resume)."""

    data_args: dict[str, Any]
    train_args: dict[str, Any]
    eval_args: dict[str, Any]
    shards: dict[str, int]
    steps_per_epoch: int
    batches_per_epoch: int
    cut_epochs: bool
    class_names: list[str]
    train_images: int


def build_data(cfg: Config, rank: int, device_num: int) -> TrainData:
    """The training data as the run sees it (``TrainData``; docs/data.md#sampling).

    Raises:
        ConfigError: If an epoch has no full batch, the run has more than ``INT32_MAX`` steps,
            the class count is not ``class_num``, the eval folder's classes differ, or
            ``val_split`` leaves a class without an image.
    """
    data_args = dict(settings=eval_preprocess(cfg), dataset=cfg.dataset,
                     batch_size=cfg.batch_size, num_parallel_workers=cfg.num_parallel_workers,
                     check_images=cfg.check_images)
    shards = dict(num_shards=device_num, shard_id=rank) if device_num > 1 else {}
    labels = label_tables(cfg) if get_task(cfg.task).label_file else None
    if labels is not None:
        data_args = dict(data_args, labels=labels[0])
    train_indices, eval_args = None, data_args
    if held_out(cfg):  # eval_data_path, if given, wins over val_split
        split = data_split(cfg)
        train_indices, eval_args = split.train, dict(data_args, sampling=Sampling(
            indices=split.val))
        if labels is not None and cfg.run_eval:
            check_positive_labels(labels[0].targets[split.val],
                                  f"val_split {cfg.val_split} of label_file {cfg.label_file}")
    elif labels is not None and labels[1] is not None:
        eval_args = dict(data_args, labels=labels[1])
        check_positive_labels(labels[1].targets, f"eval_label_file {cfg.eval_label_file}")
    train_args = dict(data_args, settings=train_augment(cfg), sampling=Sampling(
        indices=train_indices, balance_classes=cfg.class_balance == "sampler", **shards))
    train_set = create_dataset(cfg.data_path, **train_args)
    batches = train_set.get_dataset_size()
    train_images = count_images(cfg.data_path, is_training=True, dataset=cfg.dataset,
                                indices=train_indices, labels=data_args.get("labels"))
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
    if labels is not None:
        class_names = labels[0].class_names
    if len(class_names) != cfg.class_num:
        raise ConfigError(f"data_path {cfg.data_path} has {len(class_names)} classes but "
                          f"class_num is {cfg.class_num}")
    if cfg.run_eval and cfg.eval_data_path and labels is None and cfg.dataset == "imagefolder" \
            and class_names_of(cfg.eval_data_path) != class_names:
        raise ConfigError(f"eval_data_path {cfg.eval_data_path} has other class folders than "
                          f"data_path {cfg.data_path}: labels would not match")
    return TrainData(data_args=data_args, train_args=train_args, eval_args=eval_args,
                     shards=shards, steps_per_epoch=steps_per_epoch,
                     batches_per_epoch=steps_per_epoch * cfg.grad_accumulation_steps,
                     cut_epochs=batches % cfg.grad_accumulation_steps != 0,
                     class_names=class_names, train_images=train_images)


def batch_mixer(cfg: Config, seed: int) -> BatchMixer | None:
    """The mixup/cutmix op of the training batches (None when both are off), its draws a
    function of (``seed``, batch number) only."""
    if not (cfg.mixup_alpha or cfg.cutmix_alpha):
        return None
    return BatchMixer(mixup_alpha=cfg.mixup_alpha, cutmix_alpha=cfg.cutmix_alpha,
                      mix_prob=cfg.mix_prob, mix_switch_prob=cfg.mix_switch_prob,
                      label_smoothing=cfg.label_smoothing, class_num=cfg.class_num, seed=seed)


def training_pipeline(cfg: Config, data: TrainData, seed: int) -> ds.Dataset:
    """The training pipeline seeded with ``seed``, each epoch cut to ``data.batches_per_epoch``
    (whole optimizer steps)."""
    ds.config.set_seed(seed)
    dataset = create_dataset(cfg.data_path, **data.train_args,
                             batch_transform=batch_mixer(cfg, seed))
    return dataset.take(data.batches_per_epoch) if data.cut_epochs else dataset


def epoch_dataset(cfg: Config, epoch: int, skip_steps: int, data: TrainData) -> ds.Dataset:
    """The training pipeline of ``epoch``, seeded from (seed, epoch), its first ``skip_steps``
    optimizer steps read and skipped (random augmentation stays in step)."""
    dataset = training_pipeline(cfg, data, epoch_seed(cfg.seed, epoch))
    skip = skip_steps * cfg.grad_accumulation_steps
    return dataset.skip(skip) if skip else dataset


def run_dataset(cfg: Config, data: TrainData) -> ds.Dataset:
    """A sink-mode run's one training pipeline, seeded once from (seed, 0); MindSpore reshuffles it
    every epoch (``src.training.loop.train_in_sink_calls``)."""
    return training_pipeline(cfg, data, epoch_seed(cfg.seed, 0))


def train_plan(cfg: Config, data: TrainData, sink_size: int) -> TrainPlan:
    """The loop's ``TrainPlan``: the run's epochs and steps, ``sink_size`` and the pipeline
    builders (``epoch_dataset``, ``run_dataset``) bound to the config and ``data``."""
    return TrainPlan(epoch_size=cfg.epoch_size, steps_per_epoch=data.steps_per_epoch,
                     grad_accumulation_steps=cfg.grad_accumulation_steps, sink_size=sink_size,
                     epoch_dataset=partial(epoch_dataset, cfg, data=data),
                     run_dataset=partial(run_dataset, cfg, data))
