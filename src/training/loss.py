"""Training losses: label-smoothing cross-entropy (PyTorch convention), soft-target
cross-entropy and binary cross-entropy (timm), and ``create_loss`` to pick one by name.

Every loss takes optional per-class weights (``class_balance loss``:
``src.recipe.loss_class_weights``, scikit-learn's "balanced" weights of the training images),
applied as PyTorch applies its ``weight`` argument: ``cross_entropy(weight=w,
label_smoothing=eps)`` for hard labels (each target column weighted, the mean divided by the
sum of the batch's label weights),
``cross_entropy(weight=w)`` with probability targets for soft ones (each target column
weighted, the mean over the batch) and ``BCEWithLogitsLoss(weight=w)`` for binary
cross-entropy (each class column weighted, the mean over all elements).
"""
import mindspore as ms
import mindspore.nn as nn
import mindspore.ops as ops
import numpy as np


def smoothed_one_hot_values(smooth_factor, class_num):
    """(on, off) values of the smoothed one-hot target: 1 - eps + eps / K and eps / K, as
    float32 scalar Tensors.

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


def weights_tensor(class_weights, class_num):
    """``class_weights`` as a float32 (K,) Tensor constant of the loss cell (not a Parameter:
    checkpoints do not hold it), or None.

    Args:
        class_weights (array-like or None): One weight per class.
        class_num (int or None): K, checked against the length (None: any length).

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
    """Softmax cross-entropy against smoothed one-hot targets.

    Target = (1 - eps) * onehot + eps / K, as ``torch.nn.CrossEntropyLoss(label_smoothing=eps)``
    and Szegedy et al., "Rethinking the Inception Architecture" (2016). ModelZoo's
    ResNet spreads eps / (K - 1) over the wrong classes instead, which differs.

    With ``class_weights`` w, as ``torch.nn.functional.cross_entropy(weight=w,
    label_smoothing=eps)``: sample n's loss is ``-sum_k target_k * w_k * log_softmax_k``
    (the label's term weighted by w of the label, the smoothing spread over the classes by
    their weights), and ``mean`` divides the batch's sum by ``sum_n w[label_n]`` (a
    weighted mean: each micro-batch or device normalizes by its own weights, as PyTorch's
    DDP does).

    Args:
        smooth_factor (float): eps in [0, 1). 0 gives plain softmax cross-entropy.
        class_num (int): K, the number of classes.
        reduction (str): ``mean`` (over the batch), ``sum`` or ``none``.
        class_weights (array-like, optional): float (K,) positive weight of each class; None
            (default) for none.

    Inputs:
        - **logits** (Tensor) - float32 or float16, shape (N, K).
        - **label** (Tensor) - int32, shape (N,), class indices in [0, K).

    Outputs:
        float32 Tensor: scalar for ``mean``/``sum``, shape (N,) for ``none``.

    Raises:
        ValueError: If ``smooth_factor`` is outside [0, 1), ``class_num`` < 1 or
            ``class_weights`` is not K positive numbers.
    """

    def __init__(self, smooth_factor=0.1, class_num=1000, reduction="mean", class_weights=None):
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
    """Softmax cross-entropy against soft (probability) targets, as timm's
    ``SoftTargetCrossEntropy``: ``-sum_k target_k * log_softmax(logits)_k`` per sample.

    For the mixed targets of ``src.data.mixing.BatchMixer``, which already carry the label
    smoothing (as in timm, where ``Mixup`` smooths and this loss does not). Equals
    ``torch.nn.functional.cross_entropy(logits, target)`` with probability targets.

    With ``class_weights`` w, as ``cross_entropy(logits, target, weight=w)`` with probability
    targets: each target column k is weighted by w_k (a mixed sample of two classes weighs
    ``lam * w_a + (1 - lam) * w_b``, the smoothing by the classes' weights), and ``mean``
    stays the mean over the batch (PyTorch's rule for probability targets; with the
    "balanced" weights the mean weight over the training images is 1, so the scale matches
    the hard-label weighted mean in expectation).

    Args:
        reduction (str): ``mean`` (over the batch), ``sum`` or ``none``.
        class_weights (array-like, optional): float (K,) positive weight of each class.
        class_num (int, optional): K, checked against ``class_weights``' length.

    Inputs:
        - **logits** (Tensor) - float32 or float16, shape (N, K); cast to float32.
        - **target** (Tensor) - float32, shape (N, K), rows summing to 1.

    Outputs:
        float32 Tensor: scalar for ``mean``/``sum``, shape (N,) for ``none``.

    Raises:
        ValueError: If ``reduction`` is not one of the three, or ``class_weights`` is not
            ``class_num`` positive numbers.
    """

    def __init__(self, reduction="mean", class_weights=None, class_num=None):
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
    """Sigmoid binary cross-entropy of every (sample, class) pair, as timm's
    ``BinaryCrossEntropy`` (the loss of the "ResNet strikes back" recipes, Wightman, Touvron
    and Jegou, 2021).

    Hard labels become smoothed one-hot targets, off value eps / K and on value
    1 - eps + eps / K (timm's convention, the same values as ``CrossEntropySmooth``), each
    class then being an independent binary target. Soft targets (e.g.
    from ``src.data.mixing.BatchMixer``) are used as they are: their smoothing is already in.
    With ``target_threshold`` t, targets become ``1.0 if target > t else 0.0`` (timm's
    ``target.gt(t)``). The loss is ``binary_cross_entropy_with_logits`` without weights, the
    same as ``torch.nn.BCEWithLogitsLoss()``; ``mean`` averages over all N * K elements.
    With ``class_weights`` w, every element of class column k is multiplied by w_k before
    the mean, as ``torch.nn.BCEWithLogitsLoss(weight=w)`` (w broadcast over the batch) and
    timm's ``BinaryCrossEntropy(weight=w)``: the binary problem of a rare class counts more
    (its positives and its negatives alike; hard and soft targets alike).

    Args:
        smooth_factor (float): eps in [0, 1), used for hard labels only. Default 0.1.
        class_num (int): K, the number of classes. Default 1000.
        target_threshold (float, optional): t in [0, 1); None or 0 turns thresholding off
            (unlike timm, where only None does: t = 0 would turn every smoothed target into 1).
        soft_targets (bool): The cell receives float soft targets (N, K) instead of int32 class
            indices (N,). Fixed at construction so that the graph has static types.
        reduction (str): ``mean`` (over all N * K elements), ``sum`` or ``none``.
        class_weights (array-like, optional): float (K,) positive weight of each class.

    Inputs:
        - **logits** (Tensor) - float32 or float16, shape (N, K); cast to float32.
        - **target** (Tensor) - int32 class indices in [0, K), shape (N,), or, with
          ``soft_targets``, float32 of shape (N, K).

    Outputs:
        float32 Tensor: scalar for ``mean``/``sum``, shape (N, K) for ``none``.

    Raises:
        ValueError: If ``smooth_factor`` is outside [0, 1), ``class_num`` < 1,
            ``target_threshold`` is outside [0, 1) or ``class_weights`` is not K positive
            numbers.
    """

    def __init__(self, smooth_factor=0.1, class_num=1000, *, target_threshold=None,
                 soft_targets=False, reduction="mean", class_weights=None):
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


def create_loss(loss, label_smoothing, class_num, *, bce_target_threshold=0.0, soft_targets=False,
                class_weights=None):
    """The training loss by name.

    - ``ce`` with hard labels: ``CrossEntropySmooth(label_smoothing, class_num)``, the loss of
      the existing recipes, unchanged.
    - ``ce`` with soft targets: ``SoftTargetCrossEntropy()``; ``label_smoothing`` is not
      applied again (``BatchMixer`` folds it into the targets, as timm does).
    - ``bce``: ``BinaryCrossEntropy(label_smoothing, class_num, bce_target_threshold,
      soft_targets)``; the smoothing is used for hard labels only.

    Args:
        loss (str): A key of ``LOSSES``: ``ce`` or ``bce``.
        label_smoothing (float): eps in [0, 1).
        class_num (int): K, the number of classes.
        bce_target_threshold (float, optional): ``bce`` only; None or 0 = off. Default 0.
        soft_targets (bool): The label column holds float32 (N, K) soft targets (the batch
            mixer is on) instead of int32 (N,) class indices. Default False.
        class_weights (array-like, optional): float (K,) positive weight of each class
            (``src.recipe.loss_class_weights``), as the module docstring says; None (default):
            none.

    Returns:
        mindspore.nn.LossBase: The loss cell, ``(logits, label) -> float32 scalar``.

    Raises:
        KeyError: If ``loss`` is not a registered name; the message lists the valid ones.
        ValueError: From the loss for an out-of-range argument.
    """
    if loss not in LOSSES:
        raise KeyError(f"unknown loss {loss!r}; valid names: {', '.join(sorted(LOSSES))}")
    return LOSSES[loss](label_smoothing, class_num, bce_target_threshold, soft_targets,
                        class_weights)
