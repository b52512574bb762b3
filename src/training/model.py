"""The training ``Model``: ``TrainStep`` (loss, loss scaling, gradient accumulation and
clipping, optimizer, weight EMA) and the eval network on hard labels, from plain arguments
(``StepRecipe``); ``src.recipe`` fills them from the config.

Used by train.py and by the benchmarks, so both time the same training cell.
"""
from dataclasses import dataclass, field

import mindspore as ms
import mindspore.nn as nn
from mindspore.train import Model

from src.training.loss import CrossEntropySmooth, create_loss
from src.training.optimizer import create_optimizer
from src.training.precision import loss_scale_setup
from src.training.train_step import TrainStep, WeightEma


@dataclass(frozen=True, eq=False)  # compared by identity: loss_kwargs may hold an array
class StepRecipe:
    """What a ``TrainStep`` is built from besides the network, the LR and the EMA.

    Attributes:
        amp_level (str): The resolved AMP level (``resolve_amp_level``): O0, O1, O2 or O3.
        device_target (str): ``CPU``, ``GPU`` or ``Ascend``.
        class_num (int): K, the number of classes (loss and metrics).
        label_smoothing (float): eps in [0, 1) of the training loss and the eval loss.
        optimizer_kwargs (dict): Keywords of ``create_optimizer`` (``optimizer``,
            ``momentum``, ``weight_decay``, ...; timm's ``optimizer_kwargs``).
        loss_kwargs (dict): The other keywords of ``create_loss`` (``loss``,
            ``bce_target_threshold``, ``soft_targets``, ``class_weights``).
        loss_scale (float): Fixed scale or the dynamic scale's initial value
            (``loss_scale_setup``).
        loss_scale_type (str): ``auto``, ``fixed`` or ``dynamic``.
        scale_factor (float): Dynamic loss scale: the factor of each change.
        scale_window (int): Dynamic loss scale: overflow-free steps before it grows.
        grad_clip_norm (float): Global-norm clipping threshold; 0 = off.
        grad_accumulation_steps (int): Micro-batches (``Model`` steps) per optimizer step.
        allreduce_per (str): ``TrainStep``'s ``allreduce_per``: ``step`` or ``micro_batch``
            (``resolve_allreduce_per``).
    """

    amp_level: str
    device_target: str
    class_num: int
    label_smoothing: float = 0.0
    optimizer_kwargs: dict = field(default_factory=dict)
    loss_kwargs: dict = field(default_factory=dict)
    loss_scale: float = 1024.0
    loss_scale_type: str = "auto"
    scale_factor: float = 2.0
    scale_window: int = 1000
    grad_clip_norm: float = 0.0
    grad_accumulation_steps: int = 1
    allreduce_per: str = "step"


def classification_metrics(class_num):
    """``Model`` metrics: top-1 and top-5 (top-k with k = min(5, class_num)) on hard labels."""
    return {"top1": nn.Top1CategoricalAccuracy(),
            "top5": nn.TopKCategoricalAccuracy(min(5, class_num))}


def build_model(net, lr, recipe, ema_decay=0.0, ema_warmup=False):
    """The training ``Model`` of ``net``.

    Args:
        net (nn.Cell): The network (fp32 parameters); cast here by ``auto_mixed_precision``.
        lr (numpy.ndarray or float): LR per optimizer step (``create_lr``) or a constant.
        recipe (StepRecipe): Loss, optimizer, precision, clipping and accumulation.
        ema_decay (float): Weight EMA decay; 0 = no EMA (``WeightEma``).
        ema_warmup (bool): ``WeightEma``'s warmup of the decay.

    Returns:
        tuple: (``Model`` whose ``train_network`` is the ``TrainStep`` and whose eval network
        gives (loss, logits, label) with top-1/top-5 metrics; the ``WeightEma`` or None).
    """
    net = ms.amp.auto_mixed_precision(net, recipe.amp_level)
    ema = WeightEma(net, ema_decay, ema_warmup) if ema_decay else None
    return with_train_step(net, build_train_step(net, lr, recipe, ema), recipe), ema


def with_train_step(net, train_step, recipe):
    """A ``Model`` training with ``train_step`` and evaluating ``net`` (already cast by
    ``auto_mixed_precision``): the eval cell gives (loss, logits, label), with top-1/top-5
    (``recipe``: ``amp_level``, ``label_smoothing``, ``class_num``)."""
    return eval_model(net, recipe.amp_level, recipe.label_smoothing, recipe.class_num,
                      train_network=train_step)


def build_train_step(net, lr, recipe, ema=None):
    """The ``TrainStep`` of ``net`` (already cast by ``auto_mixed_precision``): loss, loss
    scaling, an optimizer over the parameters that train now (``net.trainable_params()``,
    with ``layer_decay`` and ``head_lr_scale``), accumulation, clipping and ``ema``. A second
    call on the same network (LP-FT's switch) gives a new cell with a fresh optimizer over the
    parameters trainable then.

    Args:
        net (nn.Cell): The cast network.
        lr (numpy.ndarray or float): LR per step of this cell's optimizer (its step 0 first).
        recipe (StepRecipe): Loss, optimizer, precision, clipping and accumulation.
        ema (WeightEma, optional): Updated after every optimizer step.

    Returns:
        TrainStep: The training cell.

    Raises:
        ConfigError: As ``loss_scale_setup``.
    """
    scale_sense, check_overflow, _ = loss_scale_setup(
        recipe.amp_level, recipe.device_target, recipe.loss_scale,
        loss_scale_type=recipe.loss_scale_type, scale_factor=recipe.scale_factor,
        scale_window=recipe.scale_window)
    optimizer = create_optimizer(net, lr, **recipe.optimizer_kwargs)
    loss_fn = create_loss(label_smoothing=recipe.label_smoothing, class_num=recipe.class_num,
                          **recipe.loss_kwargs)
    return TrainStep(nn.WithLossCell(net, loss_fn), optimizer, scale_sense=scale_sense,
                     check_overflow=check_overflow, grad_clip_norm=recipe.grad_clip_norm,
                     accumulation_steps=recipe.grad_accumulation_steps, ema=ema,
                     allreduce_per=recipe.allreduce_per)


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


def eval_network(net, amp_level, label_smoothing, class_num):
    """``net`` (already cast by ``auto_mixed_precision``) in the evaluation cell: (loss float32
    (N,) per image, logits (N, K), label (N,)), the logits cast to float32 under O2/O3 as
    MindSpore's ``Model`` does. The loss is the training label smoothing's cross-entropy
    (``label_smoothing`` eps over ``class_num`` K classes), not reduced, so an evaluator can
    leave out a shard's padding rows (the ``loss`` metric still takes each batch's mean).

    Returns:
        nn.WithEvalCell: For ``Model(..., eval_network=..., eval_indexes=[0, 1, 2])``.
    """
    eval_loss = CrossEntropySmooth(label_smoothing, class_num, reduction="none")
    return nn.WithEvalCell(net, eval_loss, add_cast_fp32=amp_level in ("O2", "O3"))


def eval_model(net, amp_level, label_smoothing, class_num, train_network=None):
    """A ``Model`` evaluating ``net`` (e.g. the EMA weights' network) as ``build_model``'s
    evaluation of the live network: same cell (``eval_network``), same top-1/top-5 metrics.

    Args:
        net (nn.Cell): The network, already cast by ``auto_mixed_precision``.
        amp_level (str): The resolved AMP level.
        label_smoothing (float): eps of the eval loss.
        class_num (int): K, the number of classes.
        train_network (nn.Cell, optional): The training cell (``TrainStep``); default:
            ``net`` (a Model that only evaluates).

    Returns:
        Model: Its ``eval`` gives {"top1", "top5", "loss"}.
    """
    return Model(net if train_network is None else train_network,
                 eval_network=eval_network(net, amp_level, label_smoothing, class_num),
                 metrics=classification_metrics(class_num), eval_indexes=[0, 1, 2])
