"""The recipe: the one module below the entry points that reads the config (``Config``). Its
adapters turn config keys into the library's plain arguments (timm's ``optimizer_kwargs``
style): training-config checks, network, training ``Model``, data settings and pipelines,
evaluator, LP-FT's switch. Imported by the entry points, benchmarks and tests only.
"""
import logging
import os
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

import mindspore as ms
import mindspore.dataset as ds
import mindspore.nn as nn
import numpy as np

from src.data.class_names import (
    CIFAR10_CLASSES,
    CLASS_NAMES_FILE,
    model_class_names,
    read_class_names,
)
from src.data.mixing import BatchMixer
from src.data.multilabel import LabelTable, label_file_classes, multilabel_split, read_label_file
from src.data.pipeline import class_names_of, count_images, create_dataset
from src.data.sampling import balanced_class_weights, class_counts
from src.data.settings import EvalPreprocess, Sampling, TrainAugment
from src.data.split import (
    FolderSplit,
    checked_split,
    held_out_fraction,
    read_split_file,
    split_image_folder,
    training_labels,
    write_split_files,
)
from src.deploy.formats import TTA_KEY, recorded_outputs, recorded_tta
from src.models.freeze import set_trainable
from src.models.resnet import create_network, last_feature_map_side
from src.models.tta import TTA_MODES
from src.training.distill import (
    Distillation,
    build_teacher,
    feature_projection,
    loss_weights,
    tensors_digest,
)
from src.training.evaluator import EvalShard, Evaluator, MultiLabelEvaluator
from src.training.loop import TrainPlan
from src.training.loss import pos_weights
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
from src.training.train_step import WeightEma
from src.utils.architectures import ARCHITECTURES
from src.utils.checkpoint import load_into_network, pretrained_config
from src.utils.config import INT32_MAX, Config, ConfigError
from src.utils.hub import is_pretrained_source, resolve_weights

TRAIN_SECTIONS = ("network", "data", "training data", "optimization", "fine-tuning",
                  "knowledge distillation", "device",
                  "precision, distribution", "outputs", "performance", "training checkpoints")
"""The sections of train.py's ``--help``, in order."""


# ---- checks of a training config ----

def check_train_config(cfg: Config) -> None:
    """Reject training values that cannot work, naming the key (ranges: ``check_values``).

    Raises:
        ConfigError: Empty ``data_path``, ``run_eval`` without eval data, early stopping
            without ``run_eval``, a bad split, balance
            or ``profile_steps``, a linear probe as long as the run, or a last-stage BatchNorm
            seeing one value per channel.
    """
    if not cfg.data_path:
        raise ConfigError("data_path is empty: give --data_path, the training data folder")
    if cfg.run_eval and not (cfg.eval_data_path or cfg.val_split):
        raise ConfigError("run_eval is true but eval_data_path is empty (and val_split is 0: "
                          "no part of data_path is held out)")
    if cfg.early_stopping_patience and not cfg.run_eval:
        raise ConfigError(f"early_stopping_patience {cfg.early_stopping_patience} needs an "
                          f"evaluation during training: set run_eval true (with "
                          f"eval_data_path or val_split), or early_stopping_patience 0")
    check_split_and_balance(cfg)
    check_task(cfg)
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


def check_split_and_balance(cfg: Config) -> None:
    """Raises:
        ConfigError: For a ``split_file`` (eval.py's key), or ``val_split`` / ``class_balance``
            with the cifar10 binaries.
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


MULTILABEL_DEFAULTS = {"loss": "bce", "label_smoothing": 0.0}
"""What ``task multilabel`` changes in the keys the user did not set."""


def check_task(cfg: Config) -> None:
    """The keys of ``task``: multiclass refuses the multi-label keys; multilabel takes
    ``MULTILABEL_DEFAULTS`` for the keys not set (logged) and refuses what it cannot train.

    Raises:
        ConfigError: Naming the key and value.
    """
    if cfg.task != "multilabel":
        for key in ("label_file", "eval_label_file"):
            if cfg[key]:
                raise ConfigError(f"{key} {cfg[key]} is read with task multilabel only (task is "
                                  f"{cfg.task}): set --task multilabel, or leave {key} empty")
        if cfg.loss == "asl":
            raise ConfigError("loss asl (the asymmetric loss of multi-label training) needs "
                              "task multilabel; multiclass takes ce or bce")
        return
    task_defaults(cfg)
    refusals = (
        (not cfg.label_file, "label_file is empty: give the CSV of data_path's images and their "
                             "labels (docs/multilabel.md)"),
        (cfg.dataset != "imagefolder", f"dataset {cfg.dataset} has one label per image: use "
                                       f"dataset imagefolder with label_file"),
        (cfg.loss not in ("bce", "asl"), f"loss {cfg.loss} is a softmax loss: task multilabel "
                                         f"takes bce or asl"),
        (cfg.label_smoothing != 0, f"label_smoothing {cfg.label_smoothing}: task multilabel "
                                   f"takes no label smoothing (set 0)"),
        (cfg.class_balance == "sampler", "class_balance sampler draws by class, which a "
                                         "multi-label image does not have: use class_balance "
                                         "loss (pos_weight) or none"),
        (bool(cfg.kd_teacher), f"kd_teacher {cfg.kd_teacher}: knowledge distillation (a softmax "
                               f"KL divergence) is for task multiclass"),
        (bool(cfg.run_eval and cfg.eval_data_path and not cfg.eval_label_file),
         f"eval_data_path {cfg.eval_data_path} needs eval_label_file with task multilabel"),
    )
    for refused, message in refusals:
        if refused:
            raise ConfigError(f"task multilabel: {message}")


def task_defaults(cfg: Config) -> None:
    """``task multilabel``: ``MULTILABEL_DEFAULTS`` for the keys the user did not set (logged)."""
    if cfg.task == "multilabel":
        cfg.fill_unset(MULTILABEL_DEFAULTS, "task multilabel")


def score_key(cfg: Config) -> str:
    """The score the best checkpoint and early stopping follow: top-1, or mAP for
    ``task multilabel``."""
    return "mAP" if cfg.task == "multilabel" else "top1"


def resolve_sink_size(cfg: Config, steps_per_epoch: int) -> int:
    """Steps per dataset-sink call, 0 for step-by-step training (``dataset_sink_mode`` auto: sink
    mode on GPU/Ascend in graph mode; ``sink_size`` 0: one epoch).

    Raises:
        ConfigError: For ``dataset_sink_mode true`` on CPU (MindSpore has no sink mode there) or
            in PyNative mode, or a ``sink_size`` above an epoch or not dividing it (epochs end
            on call boundaries; names the nearest divisors).
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

def optimizer_kwargs(cfg: Config) -> dict[str, Any]:
    """Keywords of ``create_optimizer`` from the config (timm's ``optimizer_kwargs``): every
    optimizer's hyperparameters (``HYPERPARAMETERS``), the chosen one takes its own."""
    return dict(optimizer=cfg.optimizer, weight_decay=cfg.weight_decay,
                layer_decay=cfg.layer_decay, head_lr_scale=cfg.head_lr_scale,
                **{key: cfg[key] for key in HYPERPARAMETERS})


def loss_kwargs(cfg: Config) -> dict[str, Any]:
    """Keywords of ``create_loss`` besides ``label_smoothing`` and ``class_num``: the loss, soft
    targets with mixup/CutMix, the ``class_balance loss`` weights (``loss_class_weights``)."""
    kwargs = dict(loss=cfg.loss, bce_target_threshold=cfg.bce_target_threshold,
                  soft_targets=bool(cfg.mixup_alpha or cfg.cutmix_alpha),
                  class_weights=loss_class_weights(cfg))
    if cfg.task == "multilabel":
        kwargs.update(task=cfg.task, asl_gamma_neg=cfg.asl_gamma_neg,
                      asl_gamma_pos=cfg.asl_gamma_pos, asl_clip=cfg.asl_clip)
    return kwargs


def loss_class_weights(cfg: Config) -> np.ndarray | None:
    """``class_balance loss``'s weights, float32 (class_num,): scikit-learn's "balanced"
    ``n / (K * count_c)`` over the images the run trains on; None for the other values; ones with
    ``benchmark_steps`` (no data read).

    Raises:
        ConfigError, ValueError: As ``split_image_folder``, or for a class without images.
    """
    if cfg.class_balance != "loss":
        return None
    if cfg.benchmark_steps:
        return np.ones(cfg.class_num, np.float32)
    if cfg.task == "multilabel":
        return multilabel_pos_weight(cfg)
    labels = training_labels(cfg.data_path, held_out(cfg), cfg.seed)
    return balanced_class_weights(class_counts(labels, cfg.class_num))


def step_recipe(cfg: Config, amp_level: str) -> StepRecipe:
    """The ``StepRecipe`` of the config under ``amp_level`` (raises as ``loss_class_weights``)."""
    return StepRecipe(
        amp_level=amp_level, device_target=cfg.device_target, class_num=cfg.class_num,
        label_smoothing=cfg.label_smoothing, optimizer_kwargs=optimizer_kwargs(cfg),
        loss_kwargs=loss_kwargs(cfg), loss_scale=cfg.loss_scale,
        loss_scale_type=cfg.loss_scale_type, scale_factor=cfg.scale_factor,
        scale_window=cfg.scale_window, grad_clip_norm=cfg.grad_clip_norm,
        grad_accumulation_steps=cfg.grad_accumulation_steps,
        allreduce_per=resolve_allreduce_per(cfg.grad_accumulation_allreduce, cfg.device_target),
        distill=distillation(cfg, amp_level))


def distillation(cfg: Config, amp_level: str) -> Distillation | None:
    """The teacher of ``kd_teacher`` (None when empty) and the distillation loss's settings:
    ``loss_weights`` of the weights the user set (timm's three modes), a feature projection
    (student width -> teacher width) when they differ. Logged once per call.

    Raises:
        ConfigError: As ``build_teacher``, or for a negative derived weight. UserError: A
            source that does not load.
    """
    if not cfg.kd_teacher:
        return None
    try:
        task_weight, distill_weight = loss_weights(cfg.user_value("distill_loss_weight"),
                                                   cfg.user_value("task_loss_weight"))
    except ValueError as err:
        raise ConfigError(f"task_loss_weight {cfg.task_loss_weight}: {err}") from err
    # resolved: the run's config.yaml reads back the same weights
    cfg.update(task_loss_weight=task_weight, distill_loss_weight=distill_weight)
    features = cfg.kd_distill_type == "feature"
    teacher, arch, width = build_teacher(
        cfg.kd_teacher, net_name=cfg.kd_net_name, class_num=cfg.class_num, amp_level=amp_level,
        device_target=cfg.device_target, features=features)
    student_width = ARCHITECTURES[cfg.net_name].num_features
    projection = feature_projection(student_width, width) if features else None
    digest = tensors_digest(teacher)
    logging.getLogger("train").info(
        "knowledge distillation: teacher %s (%s), %s loss%s, task weight %g, distill weight "
        "%g%s; teacher sha256 %s", cfg.kd_teacher, arch, cfg.kd_distill_type,
        f" at temperature {cfg.kd_temperature}" if not features else "", task_weight,
        distill_weight, f", projection {student_width} -> {width}" if projection else "",
        digest[:16])
    return Distillation(teacher=teacher, distill_type=cfg.kd_distill_type,
                        temperature=cfg.kd_temperature, task_weight=task_weight,
                        distill_weight=distill_weight, projection=projection,
                        source=cfg.kd_teacher, digest=digest)


def training_model(cfg: Config, net: nn.Cell, lr: np.ndarray | float, amp_level: str,
                   recipe: StepRecipe | None = None) -> tuple:
    """The training ``Model`` of ``net`` and its ``WeightEma`` or None (``build_model``): ``lr`` per
    optimizer step or constant, ``recipe`` default ``step_recipe(cfg, amp_level)``."""
    return build_model(net, lr, recipe or step_recipe(cfg, amp_level), cfg.ema_decay,
                       cfg.ema_warmup)


# ---- the network ----

def network_kwargs(cfg: Config) -> dict[str, Any]:
    """``create_network``'s arguments of the configured architecture: ``net_name``,
    ``class_num``, ``zero_init_residual``, ``device_target``, ``stem_pool_pad_mode``."""
    return dict(net_name=cfg.net_name, class_num=cfg.class_num,
                zero_init_residual=cfg.zero_init_residual, device_target=cfg.device_target,
                stem_pool_pad_mode=cfg.stem_pool_pad_mode)


def training_network(cfg: Config, rank: int = 0) -> nn.Cell:
    """The configured ResNet as it trains on data-parallel rank ``rank``: with its stochastic
    depth (``drop_path_rate``, drawn from ``seed`` and the rank)."""
    return create_network(**network_kwargs(cfg), drop_path_rate=cfg.drop_path_rate,
                          drop_path_seed=cfg.seed, shard_id=rank)


def build_network(cfg: Config, device_num: int, log: logging.Logger, rank: int = 0) -> nn.Cell:
    """The configured ResNet (``training_network``), initialized from ``pre_trained`` (a classifier
    of another class count trains from scratch), trainable as configured (only ``fc`` during
    LP-FT's probe). Raises as ``create_network`` and ``load_into_network``."""
    net = training_network(cfg, rank)
    if cfg.pre_trained:
        dropped, _ = load_into_network(net, cfg.pre_trained, drop_mismatched_classifier=True)
        log.info("initialized from %s%s", cfg.pre_trained,
                 f"; classifier {dropped} dropped (class count differs), fc trained from "
                 f"scratch" if dropped else "")
    if cfg.linear_probe_epochs:
        log.info("linear_probe_epochs %d: only fc trains in the first %d epochs, every "
                 "BatchNorm frozen (LP-FT)", cfg.linear_probe_epochs, cfg.linear_probe_epochs)
        make_trainable(cfg, net=net, trainable_layers=0, freeze_bn=True, device_num=device_num,
                       log=log)
    else:
        make_trainable(cfg, net=net, trainable_layers=cfg.trainable_layers,
                       freeze_bn=cfg.freeze_bn, device_num=device_num, log=log)
    return net


def make_trainable(cfg: Config, *, net: nn.Cell, trainable_layers: int, freeze_bn: bool,
                   device_num: int, log: logging.Logger) -> None:
    """``set_trainable`` with the config's all-reduce fusion (LP-FT's probe gets the derived
    split, not ``all_reduce_fusion_config``)."""
    fusion = cfg.all_reduce_fusion_config if trainable_layers == cfg.trainable_layers else []
    set_trainable(net, trainable_layers=trainable_layers, freeze_bn=freeze_bn, log=log,
                  device_num=device_num, fusion_config=fusion, net_name=cfg.net_name)


class FineTuning:
    """LP-FT's switch at step ``probe_end`` (Kumar et al. 2022, arXiv:2202.10054): a new training
    cell over the ``trainable_layers`` stages, with a fresh optimizer whose step 0 is the run's
    ``probe_end``; the overflow count carries over. Called with the probe's ``Model``."""

    def __init__(self, cfg: Config, *, recipe: StepRecipe, lr: np.ndarray, probe_end: int,
                 ema: WeightEma | None, device_num: int, log: logging.Logger):
        self.cfg, self.recipe, self.lr, self.probe_end = cfg, recipe, lr, probe_end
        self.ema, self.device_num, self.log = ema, device_num, log

    def __call__(self, model, resume_path=""):
        """The fine-tuning ``Model``; ``resume_path`` (a checkpoint after the switch) restores
        its optimizer state."""
        cfg, old = self.cfg, model.train_network
        net = old.network.backbone_network  # the cast network inside WithLossCell
        make_trainable(cfg, net=net, trainable_layers=cfg.trainable_layers,
                       freeze_bn=cfg.freeze_bn, device_num=self.device_num, log=self.log)
        step = build_train_step(net, self.lr[self.probe_end:], self.recipe, self.ema)
        step.overflow_count.set_data(old.overflow_count.value())
        if resume_path:
            restore_training_state(step, resume_path)
        self.log.info("LP-FT: linear probe done after %d steps; fine-tuning with "
                      "trainable_layers %d from step %d", self.probe_end, cfg.trainable_layers,
                      self.probe_end)
        return with_train_step(net, step, self.recipe)


def build_evaluator(cfg: Config, *, model: ms.train.Model, net: nn.Cell, ema: WeightEma | None,
                    shard: EvalShard, amp_level: str,
                    confusion_of: str | None = None) -> Evaluator:
    """``Evaluator`` of the live network and, with an EMA, of the averages (a second network),
    on ``shard`` (``eval_shard``); ``confusion_of``: the metric whose confusion matrix is kept."""
    ema_model = None
    if ema is not None:
        ema_net = ms.amp.auto_mixed_precision(
            create_network(**network_kwargs(cfg)), amp_level)
        ema_model = eval_model(ema_net, amp_level, cfg.label_smoothing, cfg.class_num,
                               loss_kwargs=loss_kwargs(cfg) if cfg.task == "multilabel"
                               else None)
    if cfg.task == "multilabel":
        return MultiLabelEvaluator(model, shard, net, ema=ema, ema_model=ema_model)
    return Evaluator(model, shard, net, ema=ema, ema_model=ema_model, class_num=cfg.class_num,
                     confusion_of=confusion_of)


# ---- the data ----

def held_out(cfg: Config) -> float:
    """The fraction of ``data_path`` held out (``src.data.split.held_out_fraction``)."""
    return held_out_fraction(cfg.val_split, cfg.eval_data_path)


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


def fill_from_weights(cfg: Config, source: str, eval_settings: bool = True) -> None:
    """Hub weights ``source``: the keys the user did not set take the weights' values
    (``pretrained_config``), logged by ``Config.fill_unset``; other sources: nothing."""
    if is_pretrained_source(source):
        cfg.fill_unset(pretrained_config(source, cfg.user_value("net_name"),
                                         eval_settings=eval_settings), source)


def resolve_eval_preprocess(cfg: Config, source: str) -> EvalPreprocess:
    """The eval preprocessing of a run of the weights ``source``: the config's, the keys the
    user left unset taken from Hub weights' ``config.json`` (``fill_from_weights``), as
    timm's ``resolve_data_config``. Once per entry point (eval, predict, export)."""
    fill_from_weights(cfg, source)
    return eval_preprocess(cfg)


def resolve_tta(cfg: Config) -> str:
    """``cfg.tta`` for a run of ``cfg.checkpoint_path`` (eval, predict, export), after the
    model's own record: Hub weights' ``config.json`` ``tta`` is taken unless the user set
    ``tta``; an exported graph runs as exported (``recorded_tta``), taken unless set, and a
    different value set is refused. docs/deployment.md#test-time-augmentation.

    Raises:
        ConfigError: If the user set another ``tta`` than an exported graph holds.
        WeightsConfigError: If the weights' ``config.json`` has a ``tta`` not in ``TTA_MODES``.
    """
    source = cfg.checkpoint_path
    if is_pretrained_source(source):
        weights = resolve_weights(source)
        recorded = weights.config.get(TTA_KEY, TTA_MODES[0])
        if recorded not in TTA_MODES:
            raise weights.field_error(TTA_KEY, recorded, f"one of {', '.join(TTA_MODES)}")
    else:
        recorded = recorded_tta(source)
        user = cfg.user_value("tta")
        if recorded is not None and user not in (None, recorded):
            raise ConfigError(f"tta {user}: {source} was exported with tta {recorded}, which "
                              f"is in its graph and cannot be changed; run it with tta "
                              f"{recorded}, or export the checkpoint again with --tta {user}")
    if recorded is not None and recorded != cfg.tta:
        cfg.fill_unset({"tta": recorded}, source)
    return cfg.tta


def resolve_task(cfg: Config) -> str:
    """``cfg.task`` for a run of ``cfg.checkpoint_path`` (eval, predict, export): the user's
    ``task`` if set, else the model's record (``recorded_outputs``: an exported graph's
    metadata, Hub weights' ``problem_type``, ``thresholds.json`` beside a ``.ckpt`` or its
    stored run config). docs/deployment.md#multi-label-models.

    Raises:
        ConfigError: If the user set another ``task`` than the model records (names both).
    """
    record = recorded_outputs(cfg.checkpoint_path, cfg.class_num)
    if record is None or record.task is None:
        return cfg.task
    user = cfg.user_value("task")
    if user not in (None, record.task):
        raise ConfigError(f"task {user}: {record.source} is a {record.task} model (its "
                          f"record says so); pass --task {record.task}, or give a "
                          f"{user} model")
    if record.task != cfg.task:
        cfg.fill_unset({"task": record.task}, record.source)
    return cfg.task


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
    labels = label_tables(cfg) if cfg.task == "multilabel" else None
    if labels is not None:
        data_args = dict(data_args, labels=labels[0])
    train_indices, eval_args = None, data_args
    if held_out(cfg):  # eval_data_path, if given, wins over val_split
        split = data_split(cfg)
        train_indices, eval_args = split.train, dict(data_args, sampling=Sampling(
            indices=split.val))
    elif labels is not None and labels[1] is not None:
        eval_args = dict(data_args, labels=labels[1])
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


# ---- the val_split lists and class counts of a run; eval.py's split_file ----

def run_split(cfg: Config, continues_here: bool, write: bool) -> tuple:
    """``(split, changed)``: the run's ``val_split`` (None without one or class folders), checked
    against the lists an earlier part of the run wrote (``checked_split``; ``write``: rank 0
    compares), and the lists it changes (``resume_ignore_config`` only).

    Raises:
        ConfigError: If the split changed, unless ``resume_ignore_config``.
    """
    val_split = held_out(cfg) if cfg.dataset == "imagefolder" else 0.0
    return checked_split(cfg.data_path, val_split, cfg.seed, output_dir=cfg.output_dir,
                         compare=write and continues_here,
                         allow_change=cfg.resume_ignore_config,
                         split=data_split(cfg) if val_split and cfg.task == "multilabel"
                         else None)


def record_run_images(cfg: Config, *, continues_here: bool, class_names: list[str], write: bool,
                      log: logging.Logger, checked: tuple | None = None) -> None:
    """Class folders: the ``val_split`` lists and training images per class, in the log and
    ``output_dir`` (``record_training_images``); ``checked``: ``run_split``'s result if called
    already. Raises as ``run_split``, or ``WriteError``."""
    if cfg.dataset != "imagefolder":
        return
    if cfg.task == "multilabel":
        record_label_file_images(cfg, write=write, log=log,
                                 checked=checked or run_split(cfg, continues_here, write))
        return
    if cfg.val_split and not held_out(cfg):
        log.warning("val_split %g not applied: eval_data_path %s is given and wins (every image "
                    "of data_path trains)", cfg.val_split, cfg.eval_data_path)
    split, changed = checked or run_split(cfg, continues_here, write)
    record_training_images(cfg.output_dir, cfg.data_path, class_names, log, split=split,
                           val_split=cfg.val_split, changed=changed, write=write,
                           for_eval=cfg.run_eval, suggest_balance=cfg.class_balance == "none")


def split_indices(cfg: Config) -> list[int] | None:
    """eval.py's ``--split_file``: positions of the images it lists in data_path's reader order
    (``read_split_file``); None without one.

    Raises:
        ConfigError: With dataset cifar10, or a bad list. MissingFileError: No such file.
    """
    if not cfg.split_file:
        return None
    if cfg.dataset != "imagefolder":
        raise ConfigError(f"split_file {cfg.split_file} needs dataset imagefolder, got "
                          f"{cfg.dataset}")
    if cfg.task == "multilabel":
        return read_split_file(cfg.split_file, cfg.data_path,
                               listed=eval_label_table(cfg).paths)
    return read_split_file(cfg.split_file, cfg.data_path)


# ---- multi-label data (task multilabel): label files, their split and class weights ----

_TABLES = {}  # (label_file, data_path, check_images, class names) -> (file's mtime, LabelTable)


def label_table(label_file: str, data_path: str, class_names: list[str],
                check_images: bool) -> LabelTable:
    """``read_label_file`` of ``label_file``, read once per process while the file is
    unchanged."""
    key = (label_file, data_path, check_images, tuple(class_names))
    mtime = os.stat(label_file).st_mtime_ns if os.path.isfile(label_file) else None
    cached = _TABLES.get(key)
    if cached is None or cached[0] != mtime:
        cached = _TABLES[key] = (mtime, read_label_file(
            label_file, data_path, class_names=class_names, check_images=check_images))
    return cached[1]


def label_classes(cfg: Config) -> list[str]:
    """The class list of ``label_file``: ``class_names.txt`` beside it when present, else the
    sorted set of its names (``label_file_classes``).

    Raises:
        ConfigError: If they are not ``class_num``. LabelFileError: An unreadable file.
    """
    names_file = os.path.join(os.path.dirname(cfg.label_file), CLASS_NAMES_FILE)
    from_file = os.path.isfile(names_file)
    names = read_class_names(names_file) if from_file else label_file_classes(cfg.label_file)
    if len(names) != cfg.class_num:
        source = names_file if from_file else f"the names used in label_file {cfg.label_file}"
        raise ConfigError(f"{source}: {len(names)} classes but class_num is {cfg.class_num}")
    return names


def label_tables(cfg: Config) -> tuple[LabelTable, LabelTable | None]:
    """The training label table of ``label_file`` over ``data_path`` and, with ``run_eval``
    and ``eval_data_path``, the eval one of ``eval_label_file`` (same classes).

    Raises:
        ConfigError: As ``label_classes``. LabelFileError: As ``read_label_file``.
    """
    names = label_classes(cfg)
    train = label_table(cfg.label_file, cfg.data_path, names, cfg.check_images)
    evaluated = None
    if cfg.run_eval and cfg.eval_data_path:
        evaluated = label_table(cfg.eval_label_file, cfg.eval_data_path, names,
                                cfg.check_images)
    return train, evaluated


def data_split(cfg: Config) -> FolderSplit:
    """The ``val_split`` of ``data_path``: stratified by class folder, or for ``task
    multilabel`` by iterative stratification of the label file's rows (``multilabel_split``)."""
    if cfg.task != "multilabel":
        return split_image_folder(cfg.data_path, cfg.val_split, cfg.seed)
    table = label_tables(cfg)[0]
    try:
        train, val = multilabel_split(table.targets, cfg.val_split, cfg.seed)
    except ValueError as err:
        raise ConfigError(f"val_split {cfg.val_split} of label_file {cfg.label_file}: {err}"
                          ) from err
    return FolderSplit([(path, -1) for path in table.paths], train, val)


def multilabel_pos_weight(cfg: Config) -> np.ndarray:
    """``class_balance loss`` of ``task multilabel``: each class's negatives / positives over
    the images the run trains on (``pos_weights``; torch's ``BCEWithLogitsLoss`` rule).

    Raises:
        ConfigError: For a class with no positive or no negative training image.
    """
    targets = label_tables(cfg)[0].targets
    if held_out(cfg):
        targets = targets[data_split(cfg).train]
    try:
        return pos_weights(targets)
    except ValueError as err:
        raise ConfigError(f"class_balance loss of label_file {cfg.label_file}: {err}") from err


def record_label_file_images(cfg: Config, *, write: bool, log: logging.Logger,
                             checked: tuple) -> None:
    """``task multilabel``: the ``val_split`` lists (``checked``: ``run_split``'s result) written
    when ``write``, and the training images' positives per class in the log."""
    split, changed = checked
    table = label_tables(cfg)[0]
    targets = table.targets
    if split is not None:
        if changed:
            log.warning("resume_ignore_config: the split changed; %s rewritten", ", ".join(changed))
        if write:
            write_split_files(cfg.output_dir, cfg.data_path, split)
        log.info("val_split %g: %d images train, %d held out (iterative stratification)",
                 cfg.val_split, len(split.train), len(split.val))
        targets = targets[split.train]
    positives = targets.sum(axis=0)
    log.info("training images %d, labels per image %.2f; positives per class: %s",
             len(targets), float(targets.sum()) / max(1, len(targets)),
             ", ".join(f"{name} {int(n)}" for name, n in zip(table.class_names, positives)))


def eval_label_table(cfg: Config) -> LabelTable:
    """eval.py's ``task multilabel`` data: ``label_file`` over ``data_path`` in the model's class
    order (``model_class_names``: ``class_names_path``, Hub weights' label names, the
    ``class_names.txt`` beside the checkpoint), else the label file's (``label_classes``).

    Raises:
        ConfigError: Without ``label_file``; as ``label_classes``. LabelFileError: As
            ``read_label_file``.
    """
    if not cfg.label_file:
        raise ConfigError("task multilabel: label_file is empty: give the CSV of data_path's "
                          "images and their labels (docs/multilabel.md)")
    names = (model_class_names(cfg.checkpoint_path, cfg.class_num, cfg.class_names_path)
             or label_classes(cfg))
    return label_table(cfg.label_file, cfg.data_path, names, cfg.check_images)
