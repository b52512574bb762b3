"""The training ``Model`` from the config: the optimizer's and the loss's keywords (timm's
``optimizer_kwargs`` style), ``class_balance loss``'s weights, the ``StepRecipe`` with knowledge
distillation's teacher, and the run's ``Evaluator``.
"""
import logging
from typing import Any

import mindspore as ms
import mindspore.nn as nn
import numpy as np

from src.data.sampling import balanced_class_weights, class_counts
from src.data.split import training_labels
from src.models.resnet import create_network
from src.recipe.checks import check_optimizer_keys
from src.recipe.network import network_kwargs
from src.recipe.splits import held_out, multilabel_pos_weight
from src.training.distill import (
    Distillation,
    build_teacher,
    feature_projection,
    loss_weights,
    tensors_digest,
)
from src.training.evaluator import EvalShard, Evaluator, MultiLabelEvaluator
from src.training.model import StepRecipe, build_model, eval_model, resolve_allreduce_per
from src.training.optimizer import OPTIMIZERS
from src.training.train_step import WeightEma
from src.utils.architectures import ARCHITECTURES
from src.utils.config import Config, ConfigError
from src.utils.tasks import get_task


def optimizer_kwargs(cfg: Config) -> dict[str, Any]:
    """Keywords of ``create_optimizer`` from the config (timm's ``optimizer_kwargs``): the
    chosen optimizer's hyperparameters that are set (not null; ``create_optimizer`` takes the
    optimizer's declared defaults for the others).

    Raises:
        ConfigError: As ``check_optimizer_keys``.
    """
    check_optimizer_keys(cfg)
    return dict(optimizer=cfg.optimizer, weight_decay=cfg.weight_decay,
                layer_decay=cfg.layer_decay, head_lr_scale=cfg.head_lr_scale,
                **{key: cfg[key] for key in OPTIMIZERS[cfg.optimizer].hyperparameters
                   if cfg[key] is not None})


def loss_kwargs(cfg: Config) -> dict[str, Any]:
    """Keywords of ``create_loss`` besides ``label_smoothing`` and ``class_num``: the loss, soft
    targets with mixup/CutMix, the ``class_balance loss`` weights (``loss_class_weights``)."""
    kwargs = dict(loss=cfg.loss, bce_target_threshold=cfg.bce_target_threshold,
                  soft_targets=bool(cfg.mixup_alpha or cfg.cutmix_alpha),
                  class_weights=loss_class_weights(cfg))
    if get_task(cfg.task).multi_hot:
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
    if get_task(cfg.task).multi_hot:
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


def distill_loss_weights(cfg: Config) -> tuple[float, float]:
    """(task weight, distillation weight) of the loss from the ones the user set
    (``loss_weights``: timm's three modes).

    Raises:
        ConfigError: For a negative derived weight, naming ``task_loss_weight``.
    """
    try:
        return loss_weights(cfg.user_value("distill_loss_weight"),
                            cfg.user_value("task_loss_weight"))
    except ValueError as err:
        raise ConfigError(f"task_loss_weight {cfg.task_loss_weight}: {err}") from err


def distill_config(cfg: Config) -> Config:
    """A new config with ``kd_teacher``'s loss weights resolved (``distill_loss_weights``), so
    the run's config.yaml reads back the weights it trained with; ``cfg`` itself without a
    teacher. ``cfg`` is unchanged.

    Raises:
        ConfigError: As ``distill_loss_weights``.
    """
    if not cfg.kd_teacher:
        return cfg
    task_weight, distill_weight = distill_loss_weights(cfg)
    return cfg.replaced(task_loss_weight=task_weight, distill_loss_weight=distill_weight)


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
    task_weight, distill_weight = distill_loss_weights(cfg)
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
                               loss_kwargs=loss_kwargs(cfg) if get_task(cfg.task).multi_hot
                               else None)
    if get_task(cfg.task).multi_hot:
        return MultiLabelEvaluator(model, shard, net, ema=ema, ema_model=ema_model)
    return Evaluator(model, shard, net, ema=ema, ema_model=ema_model, class_num=cfg.class_num,
                     confusion_of=confusion_of)
