"""The training ``Model`` of a recipe: ``TrainStep`` (loss, loss scaling, gradient
accumulation and clipping, optimizer, weight EMA) and the eval network on hard labels.

Used by train.py and by the benchmarks, so both time the same training cell.
"""
import mindspore as ms
import mindspore.nn as nn
from mindspore.train import Model

from src.training.loss import CrossEntropySmooth, create_loss, loss_class_weights
from src.training.optimizer import create_optimizer
from src.training.precision import loss_scale_setup
from src.training.train_step import TrainStep, WeightEma


def classification_metrics(class_num):
    """``Model`` metrics: top-1 and top-5 (top-k with k = min(5, class_num)) on hard labels."""
    return {"top1": nn.Top1CategoricalAccuracy(),
            "top5": nn.TopKCategoricalAccuracy(min(5, class_num))}


def build_model(cfg, net, lr, amp_level):
    """The training ``Model`` of ``net`` under the recipe ``cfg``.

    Args:
        cfg (Config): The resolved config (optimizer, loss, mixing, EMA, clipping,
            accumulation, loss-scale and label-smoothing keys).
        net (nn.Cell): The network (fp32 parameters).
        lr (numpy.ndarray or float): LR per optimizer step (``create_lr``) or a constant.
        amp_level (str): The resolved AMP level (``src.training.precision.resolve_amp_level``).

    Returns:
        tuple: (``Model`` whose ``train_network`` is the ``TrainStep`` and whose eval network
        gives (loss, logits, label) with top-1/top-5 metrics; the ``WeightEma`` or None).
    """
    net = ms.amp.auto_mixed_precision(net, amp_level)
    ema = WeightEma(net, cfg.ema_decay, cfg.ema_warmup) if cfg.ema_decay else None
    return with_train_step(cfg, net, build_train_step(cfg, net, lr, amp_level, ema),
                           amp_level), ema


def with_train_step(cfg, net, train_step, amp_level):
    """A ``Model`` training with ``train_step`` and evaluating ``net`` (already cast by
    ``auto_mixed_precision``): the eval cell gives (loss, logits, label), with top-1/top-5."""
    return Model(train_step, eval_network=eval_network(cfg, net, amp_level),
                 metrics=classification_metrics(cfg.class_num), eval_indexes=[0, 1, 2])


def build_train_step(cfg, net, lr, amp_level, ema=None):
    """The ``TrainStep`` of ``net`` (already cast by ``auto_mixed_precision``) under ``cfg``:
    loss, loss scaling, an optimizer over the parameters that train now
    (``net.trainable_params()``, with ``layer_decay`` and ``head_lr_scale``), accumulation,
    clipping and ``ema``. A second call on the same network (LP-FT's switch) gives a new
    cell with a fresh optimizer over the parameters trainable then.

    Args:
        cfg (Config): The resolved config.
        net (nn.Cell): The cast network.
        lr (numpy.ndarray or float): LR per step of this cell's optimizer (its step 0 first).
        amp_level (str): The resolved AMP level.
        ema (WeightEma, optional): Updated after every optimizer step.

    Returns:
        TrainStep: The training cell.
    """
    scale_sense, check_overflow, _ = loss_scale_setup(
        amp_level, cfg.device_target, cfg.loss_scale, cfg.loss_scale_type, cfg.scale_factor,
        cfg.scale_window)
    optimizer = create_optimizer(net, lr, optimizer=cfg.optimizer, momentum=cfg.momentum,
                                 weight_decay=cfg.weight_decay, beta1=cfg.beta1,
                                 beta2=cfg.beta2, eps=cfg.eps, layer_decay=cfg.layer_decay,
                                 head_lr_scale=cfg.head_lr_scale, trust_coeff=cfg.trust_coeff)
    loss_fn = create_loss(cfg.loss, cfg.label_smoothing, cfg.class_num,
                          bce_target_threshold=cfg.bce_target_threshold,
                          soft_targets=bool(cfg.mixup_alpha or cfg.cutmix_alpha),
                          class_weights=loss_class_weights(cfg))
    return TrainStep(nn.WithLossCell(net, loss_fn), optimizer, scale_sense, check_overflow,
                     cfg.grad_clip_norm, cfg.grad_accumulation_steps, ema,
                     resolve_allreduce_per(cfg.grad_accumulation_allreduce, cfg.device_target))


def resolve_allreduce_per(value, device_target):
    """``grad_accumulation_allreduce``: "step" or "micro_batch" as given; "auto" is "step"
    on CPU (where the all-reduce inside the branch that steps the optimizer is compiled and
    run by the tests) and "micro_batch" on GPU and Ascend (no collective inside a
    data-dependent branch, as MindSpore's own ``boost`` accumulation; ``docs/distributed.md``).

    Returns:
        str: ``TrainStep``'s ``allreduce_per``.
    """
    if value != "auto":
        return value
    return "step" if device_target == "CPU" else "micro_batch"


def eval_network(cfg, net, amp_level):
    """``net`` (already cast by ``auto_mixed_precision``) in the evaluation cell: (loss float32
    (N,) per image, logits (N, K), label (N,)), the logits cast to float32 under O2/O3 as
    MindSpore's ``Model`` does. The loss is the training label smoothing's cross-entropy, not
    reduced, so an evaluator can leave out a shard's padding rows (the ``loss`` metric still
    takes each batch's mean).

    Returns:
        nn.WithEvalCell: For ``Model(..., eval_network=..., eval_indexes=[0, 1, 2])``.
    """
    eval_loss = CrossEntropySmooth(cfg.label_smoothing, cfg.class_num, reduction="none")
    return nn.WithEvalCell(net, eval_loss, add_cast_fp32=amp_level in ("O2", "O3"))


def eval_model(cfg, net, amp_level):
    """A ``Model`` that only evaluates ``net`` (e.g. the EMA weights' network), measured as
    ``build_model``'s evaluation of the live network: same cell, same top-1/top-5 metrics.

    Args:
        cfg (Config): The resolved config (label_smoothing, class_num).
        net (nn.Cell): The network, already cast by ``auto_mixed_precision``.
        amp_level (str): The resolved AMP level.

    Returns:
        Model: Its ``eval`` gives {"top1", "top5", "loss"}.
    """
    return Model(net, eval_network=eval_network(cfg, net, amp_level),
                 metrics=classification_metrics(cfg.class_num), eval_indexes=[0, 1, 2])
