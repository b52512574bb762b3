"""Training losses: label-smoothing cross-entropy (PyTorch's convention), soft-target
and binary cross-entropy (timm's), optional per-class weights applied as PyTorch's
``weight`` argument, and ``create_loss``. See docs/training.md#losses."""
from collections.abc import Sequence

import mindspore as ms
import mindspore.nn as nn
import mindspore.ops as ops
import numpy as np


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
                   class_num: int | None) -> ms.Tensor | None:
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
        raise ValueError(f"class_weights must be {class_num or 'K'} finite positive numbers "
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


def _make_ce(label_smoothing, class_num, bce_target_threshold, soft_targets, class_weights):
    if soft_targets:
        return SoftTargetCrossEntropy(class_weights=class_weights, class_num=class_num)
    return CrossEntropySmooth(label_smoothing, class_num, class_weights=class_weights)


def _make_bce(label_smoothing, class_num, bce_target_threshold, soft_targets, class_weights):
    return BinaryCrossEntropy(label_smoothing, class_num, target_threshold=bce_target_threshold,
                              soft_targets=soft_targets, class_weights=class_weights)


LOSSES = {"ce": _make_ce, "bce": _make_bce}
"""Loss name -> factory ``(label_smoothing, class_num, bce_target_threshold, soft_targets,
class_weights)``."""


def create_loss(loss: str, label_smoothing: float, class_num: int, *,
                bce_target_threshold: float | None = 0.0, soft_targets: bool = False,
                class_weights: Sequence[float] | np.ndarray | None = None) -> nn.LossBase:
    """The training loss ``loss`` (a key of ``LOSSES``): ``ce`` is
    ``CrossEntropySmooth`` for hard labels and ``SoftTargetCrossEntropy`` for ``soft_targets``
    (the mixer smooths them), ``bce`` is ``BinaryCrossEntropy``. ``class_weights``: float (K,)
    (``src.recipe.loss_class_weights``) or None.

    Returns:
        nn.LossBase: ``(logits, label) -> float32 scalar``.

    Raises:
        KeyError: If ``loss`` is unknown (the message lists the names).
        ValueError: From the loss, for an out-of-range argument.
    """
    if loss not in LOSSES:
        raise KeyError(f"unknown loss {loss!r}; valid names: {', '.join(sorted(LOSSES))}")
    return LOSSES[loss](label_smoothing, class_num, bce_target_threshold, soft_targets,
                        class_weights)
