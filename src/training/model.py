"""The training ``Model`` (``TrainStep`` and the eval network) from plain arguments
(``StepRecipe``, filled by ``src.recipe``); train.py and the benchmarks build the same cell."""
from dataclasses import dataclass, field

import mindspore as ms
import mindspore.nn as nn
import numpy as np
from mindspore.train import Model

from src.training.distill import Distillation
from src.training.loss import CrossEntropySmooth, create_loss
from src.training.optimizer import create_optimizer
from src.training.precision import loss_scale_setup
from src.training.train_step import TrainStep, WeightEma
from src.utils.tasks import DEFAULT_TASK, Task, get_task


@dataclass(frozen=True, eq=False)  # compared by identity: loss_kwargs may hold an array
class StepRecipe:
    """What a ``TrainStep`` is built from besides the network, the LR and the EMA: the
    resolved ``amp_level`` and ``device_target``, ``class_num`` and ``label_smoothing`` (training
    and eval loss), the keywords of ``create_optimizer`` and ``create_loss``, the loss scaling
    (``loss_scale_setup``'s arguments), ``grad_clip_norm`` (0 = off), the micro-batches per
    optimizer step and ``TrainStep``'s ``allreduce_per``; ``distill``: a teacher (None = none)."""

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
    distill: Distillation | None = None


def classification_metrics(class_num: int) -> dict[str, nn.Metric]:
    """``Model`` metrics: top-1 and top-5 (top-k with k = min(5, class_num)) on hard labels."""
    return {"top1": nn.Top1CategoricalAccuracy(),
            "top5": nn.TopKCategoricalAccuracy(min(5, class_num))}


def build_model(net: nn.Cell, lr: np.ndarray | float, recipe: StepRecipe, ema_decay: float = 0.0,
                ema_warmup: bool = False) -> tuple[Model, WeightEma | None]:
    """The training ``Model`` of ``net`` (fp32, cast here by ``auto_mixed_precision``)
    with ``lr`` per optimizer step (or a constant) and ``recipe``, and its ``WeightEma``
    (``ema_decay`` 0 = none).

    Returns:
        tuple: (``Model`` whose ``train_network`` is the ``TrainStep`` and whose eval network
        gives (loss, logits, label) with top-1/top-5 metrics, the ``WeightEma`` or None).
    """
    net = ms.amp.auto_mixed_precision(net, recipe.amp_level)
    ema = WeightEma(net, ema_decay, ema_warmup) if ema_decay else None
    return with_train_step(net, build_train_step(net, lr, recipe, ema), recipe), ema


def with_train_step(net: nn.Cell, train_step: TrainStep, recipe: StepRecipe) -> Model:
    """A ``Model`` training with ``train_step`` and evaluating ``net`` (already cast by
    ``auto_mixed_precision``): the eval cell gives (loss, logits, label), with top-1/top-5
    (``recipe``: ``amp_level``, ``label_smoothing``, ``class_num``)."""
    return eval_model(net, recipe.amp_level, recipe.label_smoothing, recipe.class_num,
                      train_network=train_step, loss_kwargs=recipe.loss_kwargs)


def build_train_step(net: nn.Cell, lr: np.ndarray | float, recipe: StepRecipe,
                     ema: WeightEma | None = None) -> TrainStep:
    """The ``TrainStep`` of cast ``net``: loss, loss scaling, an optimizer over
    the parameters trainable now, accumulation, clipping and ``ema``; ``lr`` per step of this
    optimizer. A second call (LP-FT's switch) gives a fresh optimizer.

    Raises:
        ConfigError: As ``loss_scale_setup``.
    """
    scale_sense, check_overflow, _ = loss_scale_setup(
        recipe.amp_level, recipe.device_target, recipe.loss_scale,
        loss_scale_type=recipe.loss_scale_type, scale_factor=recipe.scale_factor,
        scale_window=recipe.scale_window)
    loss_fn = create_loss(label_smoothing=recipe.label_smoothing, class_num=recipe.class_num,
                          **recipe.loss_kwargs)
    with_loss = (nn.WithLossCell(net, loss_fn) if recipe.distill is None
                 else recipe.distill.loss(net, loss_fn))
    # distilling: the student and the feature projection train, never the teacher
    optimizer = create_optimizer(net if recipe.distill is None else with_loss, lr,
                                 **recipe.optimizer_kwargs)
    return TrainStep(with_loss, optimizer, scale_sense=scale_sense,
                     check_overflow=check_overflow, grad_clip_norm=recipe.grad_clip_norm,
                     accumulation_steps=recipe.grad_accumulation_steps, ema=ema,
                     allreduce_per=recipe.allreduce_per)


def resolve_allreduce_per(value: str, device_target: str) -> str:
    """``grad_accumulation_allreduce`` as given, "auto" being "step" on CPU
    and "micro_batch" on GPU and Ascend (no collective inside a data-dependent branch; see
    docs/distributed.md)."""
    if value != "auto":
        return value
    return "step" if device_target == "CPU" else "micro_batch"


def eval_network(net: nn.Cell, amp_level: str, label_smoothing: float,
                 class_num: int, *, loss_kwargs: dict | None = None) -> nn.WithEvalCell:
    """Cast ``net`` in the evaluation cell: (per-image float32 loss (N,) of the
    training label smoothing's cross-entropy, logits (N, K) cast to float32 under O2/O3, label
    (N,)); unreduced so an evaluator can leave out a shard's padding. For ``Model(...,
    eval_indexes=[0, 1, 2])``. With ``loss_kwargs`` of task multilabel: the training loss per
    image (``create_loss``), targets (N, K)."""
    if loss_task(loss_kwargs).multi_hot:
        eval_loss = create_loss(label_smoothing=label_smoothing, class_num=class_num,
                                **dict(loss_kwargs, reduction="none"))
    else:
        eval_loss = CrossEntropySmooth(label_smoothing, class_num, reduction="none")
    return nn.WithEvalCell(net, eval_loss, add_cast_fp32=amp_level in ("O2", "O3"))


def eval_model(net: nn.Cell, amp_level: str, label_smoothing: float, class_num: int,
               train_network: nn.Cell | None = None, *, loss_kwargs: dict | None = None) -> Model:
    """A ``Model`` evaluating cast ``net`` as ``build_model`` evaluates the live
    network (``eval_network``, top-1/top-5); ``train_network`` defaults to ``net``. Its ``eval``
    gives {"top1", "top5", "loss"} ({"loss"} for a multi-label ``loss_kwargs``)."""
    return Model(net if train_network is None else train_network,
                 eval_network=eval_network(net, amp_level, label_smoothing, class_num,
                                           loss_kwargs=loss_kwargs),
                 metrics=({"loss": nn.Loss()} if loss_task(loss_kwargs).multi_hot
                          else classification_metrics(class_num)), eval_indexes=[0, 1, 2])


def loss_task(loss_kwargs: dict | None) -> Task:
    """The ``Task`` of ``create_loss`` keywords (``task``; the default task when absent)."""
    return get_task((loss_kwargs or {}).get("task", DEFAULT_TASK))
