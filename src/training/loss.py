"""Training losses: label-smoothing cross-entropy (PyTorch's convention), soft-target
and binary cross-entropy (timm's), optional per-class weights applied as PyTorch's
``weight`` argument; multi-label sigmoid BCE (``pos_weight``) and the asymmetric loss (ASL);
``create_loss``. See docs/training.md#losses."""
from collections.abc import Sequence
from dataclasses import dataclass

import mindspore as ms
import mindspore.nn as nn
import mindspore.ops as ops
import numpy as np

from src.utils.tasks import MULTICLASS, MULTILABEL


def smoothed_one_hot_values(smooth_factor: float, class_num: int) -> tuple[ms.Tensor, ms.Tensor]:
    """(on, off) of the smoothed one-hot target, 1 - eps + eps / K and
    eps / K, as float32 scalar Tensors.

    Raises:
        ValueError: If ``smooth_factor`` is outside [0, 1) or ``class_num`` < 1.
    """
    if not 0.0 <= smooth_factor < 1.0:
        raise ValueError(f"smooth_factor (label_smoothing) must be in [0, 1), "
                         f"got {smooth_factor}")
    if class_num < 1:
        raise ValueError(f"class_num must be positive, got {class_num}")
    return (ms.Tensor(1.0 - smooth_factor + smooth_factor / class_num, ms.float32),
            ms.Tensor(smooth_factor / class_num, ms.float32))


def weights_tensor(class_weights: Sequence[float] | np.ndarray | None,
                   class_num: int | None, *, name: str = "class_weights") -> ms.Tensor | None:
    """``class_weights`` (one per class) as a float32 (K,) Tensor constant (not
    checkpointed), or None; ``class_num`` None accepts any length.

    Raises:
        ValueError: If it does not hold ``class_num`` finite positive numbers.
    """
    if class_weights is None:
        return None
    weights = np.asarray(class_weights, np.float32)
    if (weights.ndim != 1 or (class_num is not None and len(weights) != class_num)
            or not np.isfinite(weights).all() or (weights <= 0).any()):
        raise ValueError(f"{name} must be {class_num or 'K'} finite positive numbers "
                         f"(one per class), got {weights.tolist()}")
    return ms.Tensor(weights)


class CrossEntropySmooth(nn.LossBase):
    """Softmax cross-entropy against (1 - eps) onehot + eps / K, as
    ``torch.nn.CrossEntropyLoss(label_smoothing=eps, weight=w)`` (Szegedy et al. 2016); see
    docs/training.md#losses. ``smooth_factor`` eps in [0, 1), ``class_num`` K, ``reduction``
    mean/sum/none, ``class_weights`` float (K,) or None.

    Inputs:
        - **logits** (Tensor) - float32/float16 (N, K); **label** int32 (N,) in [0, K).

    Outputs:
        float32 Tensor: scalar, or (N,) for ``none``.
    """

    def __init__(self, smooth_factor: float = 0.1, class_num: int = 1000, reduction: str = "mean",
                 class_weights: Sequence[float] | np.ndarray | None = None):
        super().__init__(reduction)
        self.class_num = class_num
        self.on_value, self.off_value = smoothed_one_hot_values(smooth_factor, class_num)
        self.log_softmax = nn.LogSoftmax(axis=-1)
        self.class_weights = weights_tensor(class_weights, class_num)
        self.weighted = self.class_weights is not None
        self.weighted_mean = self.weighted and self.reduce and self.average

    def construct(self, logits, label):
        target = ops.one_hot(label, self.class_num, self.on_value, self.off_value)
        if self.weighted:
            target = target * self.class_weights
        per_sample = -(target * self.log_softmax(logits.astype(ms.float32))).sum(axis=-1)
        if self.weighted_mean:
            return per_sample.sum() / ops.gather(self.class_weights, label, 0).sum()
        return self.get_loss(per_sample)


class SoftTargetCrossEntropy(nn.LossBase):
    """Softmax cross-entropy against soft targets (timm's
    ``SoftTargetCrossEntropy``; torch's ``cross_entropy`` with probability targets and
    ``weight``): for ``BatchMixer``'s targets, which carry the label smoothing already.
    ``class_num`` checks ``class_weights``' length.

    Inputs:
        - **logits** (Tensor) - float32/float16 (N, K); **target** float32 (N, K).

    Outputs:
        float32 Tensor: scalar, or (N,) for ``none``.
    """

    def __init__(self, reduction: str = "mean",
                 class_weights: Sequence[float] | np.ndarray | None = None,
                 class_num: int | None = None):
        super().__init__(reduction)
        self.log_softmax = nn.LogSoftmax(axis=-1)
        self.class_weights = weights_tensor(class_weights, class_num)
        self.weighted = self.class_weights is not None

    def construct(self, logits, target):
        log_probs = self.log_softmax(logits.astype(ms.float32))
        target = target.astype(ms.float32)
        if self.weighted:
            target = target * self.class_weights
        per_sample = -(target * log_probs).sum(axis=-1)
        return self.get_loss(per_sample)


class BinaryCrossEntropy(nn.LossBase):
    """Sigmoid binary cross-entropy of every (sample, class), as timm's
    ``BinaryCrossEntropy`` ("ResNet strikes back") and ``torch.nn.BCEWithLogitsLoss(weight=w)``:
    hard labels smoothed by ``smooth_factor`` as ``CrossEntropySmooth``'s, ``soft_targets``
    (float32 (N, K)) as given, then ``target > target_threshold`` when set (None or 0 = off);
    ``mean`` over N * K. See docs/training.md#losses.

    Outputs:
        float32 Tensor: scalar, or (N, K) for ``none``.
    """

    def __init__(self, smooth_factor: float = 0.1, class_num: int = 1000, *,
                 target_threshold: float | None = None, soft_targets: bool = False,
                 reduction: str = "mean",
                 class_weights: Sequence[float] | np.ndarray | None = None):
        super().__init__(reduction)
        if target_threshold is not None and not 0.0 <= target_threshold < 1.0:
            raise ValueError(f"target_threshold (bce_target_threshold) must be None or in "
                             f"[0, 1), got {target_threshold}")
        self.class_num = class_num
        self.soft_targets = bool(soft_targets)
        self.use_threshold = bool(target_threshold)
        self.threshold = ms.Tensor(float(target_threshold or 0.0), ms.float32)
        self.on_value, self.off_value = smoothed_one_hot_values(smooth_factor, class_num)
        self.class_weights = weights_tensor(class_weights, class_num)
        self.weighted = self.class_weights is not None

    def construct(self, logits, target):
        if self.soft_targets:
            target = target.astype(ms.float32)
        else:
            target = ops.one_hot(target, self.class_num, self.on_value, self.off_value)
        if self.use_threshold:
            target = (target > self.threshold).astype(ms.float32)
        per_element = ops.binary_cross_entropy_with_logits(
            logits.astype(ms.float32), target, reduction="none")
        if self.weighted:
            per_element = per_element * self.class_weights
        return self.get_loss(per_element)


class MultiLabelBCE(nn.LossBase):
    """Sigmoid binary cross-entropy of every (image, class) against multi-hot or mixed targets,
    as ``torch.nn.BCEWithLogitsLoss(pos_weight=w)``: ``-(w y log s(x) + (1 - y) log(1 - s(x)))``.
    ``pos_weight`` float (K,) or None; ``reduction`` ``mean`` over N * K, ``sum`` of all, or
    ``none``: the (N,) mean over classes of each image.

    Inputs:
        - **logits** (Tensor) - float32/float16 (N, K); **target** float32 (N, K) in [0, 1].

    Outputs:
        float32 Tensor: scalar, or (N,) for ``none``.
    """

    def __init__(self, class_num: int, *,
                 pos_weight: Sequence[float] | np.ndarray | None = None,
                 reduction: str = "mean"):
        super().__init__(reduction)
        self.pos_weight = weights_tensor(pos_weight, class_num, name="pos_weight")
        self.per_image = reduction == "none"

    def construct(self, logits, target):
        per_element = ops.binary_cross_entropy_with_logits(
            logits.astype(ms.float32), target.astype(ms.float32), pos_weight=self.pos_weight,
            reduction="none")
        if self.per_image:
            return per_element.mean(axis=-1)
        return self.get_loss(per_element)


class AsymmetricLoss(nn.LossBase):
    """The asymmetric loss of Ridnik et al. 2021 (arXiv:2009.14119) as the authors'
    ``AsymmetricLoss`` computes it per element: p = sigmoid(x), p_neg = min(1 - p + clip, 1),
    ``-(y log max(p, eps) + (1 - y) log max(p_neg, eps)) * (1 - pt) ** g`` with
    pt = y p + (1 - y) p_neg, g = y gamma_pos + (1 - y) gamma_neg. The focusing weight is
    detached from the gradient (the authors' default) unless ``focus_grad``. ``reduction``:
    ``mean`` sums over classes and averages over images, ``none`` the (N,) per-image sums,
    ``sum`` the authors' total. See docs/training.md#losses.

    Inputs:
        - **logits** (Tensor) - float32/float16 (N, K); **target** float32 (N, K) in [0, 1].

    Outputs:
        float32 Tensor: scalar, or (N,) for ``none``.

    Raises:
        ValueError: For a negative gamma, ``clip`` outside [0, 1) or ``eps`` outside (0, 1).
    """

    def __init__(self, *, gamma_neg: float = 4.0, gamma_pos: float = 1.0, clip: float = 0.05,
                 eps: float = 1e-8, reduction: str = "mean", focus_grad: bool = False):
        super().__init__(reduction)
        for name, value in (("gamma_neg (asl_gamma_neg)", gamma_neg),
                            ("gamma_pos (asl_gamma_pos)", gamma_pos)):
            if not value >= 0.0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if not 0.0 <= clip < 1.0:
            raise ValueError(f"clip (asl_clip) must be in [0, 1), got {clip}")
        if not 0.0 < eps < 1.0:
            raise ValueError(f"eps must be in (0, 1), got {eps}")
        self.gamma_neg, self.gamma_pos = float(gamma_neg), float(gamma_pos)
        self.clip, self.eps = float(clip), float(eps)
        self.clipped = clip > 0.0
        self.focus_grad = bool(focus_grad)

    def construct(self, logits, target):
        target = target.astype(ms.float32)
        prob = ops.sigmoid(logits.astype(ms.float32))
        prob_neg = 1.0 - prob
        if self.clipped:
            prob_neg = ops.minimum(prob_neg + self.clip, 1.0)
        log_likelihood = (target * ops.log(ops.maximum(prob, self.eps))
                          + (1.0 - target) * ops.log(ops.maximum(prob_neg, self.eps)))
        base = 1.0 - (target * prob + (1.0 - target) * prob_neg)
        gamma = self.gamma_pos * target + self.gamma_neg * (1.0 - target)
        # (1 - pt) ** g with 0 ** g as torch.pow (1 for g = 0, else 0) and no NaN gradient there
        inside = base > 0.0
        weight = ops.select(inside, ops.pow(ops.select(inside, base, ops.ones_like(base)), gamma),
                            (gamma == 0.0).astype(ms.float32))
        if not self.focus_grad:
            weight = ops.stop_gradient(weight)
        return self.get_loss(-(log_likelihood * weight).sum(axis=-1))


def pos_weights(targets: np.ndarray) -> np.ndarray:
    """Per-class ``pos_weight`` as torch documents it: negatives / positives of each class.

    Args:
        targets: (N, K) multi-hot 0/1 array (any numeric dtype).

    Returns:
        np.ndarray: float32 (K,).

    Raises:
        ValueError: If ``targets`` is not a 2-D 0/1 array, or a class has no positive or no
            negative image (the message names the class indices).
    """
    targets = np.asarray(targets)
    if targets.ndim != 2 or not np.isin(targets, (0, 1)).all():
        raise ValueError(f"targets must be a 2-D array of 0/1 (images x classes), got shape "
                         f"{targets.shape}")
    positives = targets.sum(axis=0, dtype=np.int64)
    negatives = len(targets) - positives
    for count, what in ((positives, "positive"), (negatives, "negative")):
        empty = np.flatnonzero(count == 0)
        if len(empty):
            raise ValueError(f"pos_weight is undefined for class(es) {empty.tolist()}: no "
                             f"{what} image among the {len(targets)} training images")
    return (negatives / positives).astype(np.float32)


@dataclass(frozen=True, kw_only=True)
class LossSettings:
    """``create_loss``'s arguments, given to the registry's factories."""
    label_smoothing: float
    class_num: int
    bce_target_threshold: float | None = 0.0
    soft_targets: bool = False
    class_weights: Sequence[float] | np.ndarray | None = None
    asl_gamma_neg: float = 4.0
    asl_gamma_pos: float = 1.0
    asl_clip: float = 0.05
    reduction: str = "mean"


def _make_ce(s: LossSettings) -> nn.LossBase:
    if s.soft_targets:
        return SoftTargetCrossEntropy(s.reduction, class_weights=s.class_weights,
                                      class_num=s.class_num)
    return CrossEntropySmooth(s.label_smoothing, s.class_num, s.reduction,
                              class_weights=s.class_weights)


def _make_bce(s: LossSettings) -> nn.LossBase:
    return BinaryCrossEntropy(s.label_smoothing, s.class_num,
                              target_threshold=s.bce_target_threshold,
                              soft_targets=s.soft_targets, reduction=s.reduction,
                              class_weights=s.class_weights)


def _refuse_multiclass_options(s: LossSettings, loss: str) -> None:
    """Settings that have no multi-label meaning here: refused by name, never ignored."""
    if s.label_smoothing:
        raise ValueError(f"label_smoothing {s.label_smoothing} is not supported with task "
                         f"multilabel (loss {loss}); set label_smoothing 0")
    if s.bce_target_threshold:
        raise ValueError(f"bce_target_threshold {s.bce_target_threshold} is not supported with "
                         f"task multilabel (loss {loss}); set bce_target_threshold 0")


def _make_multilabel_bce(s: LossSettings) -> nn.LossBase:
    _refuse_multiclass_options(s, "bce")
    return MultiLabelBCE(s.class_num, pos_weight=s.class_weights, reduction=s.reduction)


def _make_asl(s: LossSettings) -> nn.LossBase:
    _refuse_multiclass_options(s, "asl")
    if s.class_weights is not None:
        raise ValueError("class_weights (class_balance loss) are not supported with loss asl; "
                         "use loss bce, whose pos_weight they become")
    return AsymmetricLoss(gamma_neg=s.asl_gamma_neg, gamma_pos=s.asl_gamma_pos, clip=s.asl_clip,
                          reduction=s.reduction)


LOSSES = {"ce": _make_ce, "bce": _make_bce}
"""Multi-class loss name -> factory ``(LossSettings) -> nn.LossBase``."""

MULTILABEL_LOSSES = {"bce": _make_multilabel_bce, "asl": _make_asl}
"""Multi-label loss name -> factory ``(LossSettings) -> nn.LossBase``."""

TASK_LOSSES = {MULTICLASS.name: LOSSES, MULTILABEL.name: MULTILABEL_LOSSES}
"""Task name -> its loss registry (``src.utils.tasks.TASKS``)."""


def create_loss(loss: str, label_smoothing: float, class_num: int, *,
                bce_target_threshold: float | None = 0.0, soft_targets: bool = False,
                class_weights: Sequence[float] | np.ndarray | None = None,
                task: str = MULTICLASS.name, asl_gamma_neg: float = 4.0,
                asl_gamma_pos: float = 1.0, asl_clip: float = 0.05,
                reduction: str = "mean") -> nn.LossBase:
    """The training loss ``loss`` of ``task`` (``TASK_LOSSES``). Multi-class: ``ce`` is
    ``CrossEntropySmooth`` for hard labels and ``SoftTargetCrossEntropy`` for ``soft_targets``
    (the mixer smooths them), ``bce`` is ``BinaryCrossEntropy``. Multi-label: ``bce`` is
    ``MultiLabelBCE`` (``class_weights`` its ``pos_weight``), ``asl`` is ``AsymmetricLoss``.
    ``class_weights``: float (K,) or None.

    Returns:
        nn.LossBase: ``(logits, label) -> float32 scalar`` (or per image for ``none``).

    Raises:
        KeyError: If ``loss`` is unknown to every task (the message lists the names).
        ValueError: For an unknown task, a loss of the other task, label smoothing or
            ``bce_target_threshold`` with multilabel, class weights with asl, or an
            out-of-range argument (the message names the key and value).
    """
    if task not in TASK_LOSSES:
        raise ValueError(f"task must be one of {', '.join(TASK_LOSSES)}, got {task!r}")
    losses = TASK_LOSSES[task]
    if loss not in losses:
        known = sorted({name for registry in TASK_LOSSES.values() for name in registry})
        if loss not in known:
            raise KeyError(f"unknown loss {loss!r}; valid names: {', '.join(known)}")
        raise ValueError(f"loss {loss!r} is not defined for task {task}; task {task} takes "
                         f"loss {' or '.join(sorted(losses))}")
    return losses[loss](LossSettings(
        label_smoothing=label_smoothing, class_num=class_num,
        bce_target_threshold=bce_target_threshold, soft_targets=soft_targets,
        class_weights=class_weights, asl_gamma_neg=asl_gamma_neg, asl_gamma_pos=asl_gamma_pos,
        asl_clip=asl_clip, reduction=reduction))
