"""Training losses: label-smoothing cross-entropy (PyTorch convention), soft-target
cross-entropy and binary cross-entropy (timm), and ``create_loss`` to pick one by name."""
import mindspore as ms
import mindspore.nn as nn
import mindspore.ops as ops


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


class CrossEntropySmooth(nn.LossBase):
    """Softmax cross-entropy against smoothed one-hot targets.

    Target = (1 - eps) * onehot + eps / K, as ``torch.nn.CrossEntropyLoss(label_smoothing=eps)``
    and Szegedy et al., "Rethinking the Inception Architecture" (2016). ModelZoo's
    ResNet spreads eps / (K - 1) over the wrong classes instead, which differs.

    Args:
        smooth_factor (float): eps in [0, 1). 0 gives plain softmax cross-entropy.
        class_num (int): K, the number of classes.
        reduction (str): ``mean`` (over the batch), ``sum`` or ``none``.

    Inputs:
        - **logits** (Tensor) - float32 or float16, shape (N, K).
        - **label** (Tensor) - int32, shape (N,), class indices in [0, K).

    Outputs:
        float32 Tensor: scalar for ``mean``/``sum``, shape (N,) for ``none``.

    Raises:
        ValueError: If ``smooth_factor`` is outside [0, 1) or ``class_num`` < 1.
    """

    def __init__(self, smooth_factor=0.1, class_num=1000, reduction="mean"):
        super().__init__(reduction)
        self.class_num = class_num
        self.on_value, self.off_value = smoothed_one_hot_values(smooth_factor, class_num)
        self.log_softmax = nn.LogSoftmax(axis=-1)

    def construct(self, logits, label):
        target = ops.one_hot(label, self.class_num, self.on_value, self.off_value)
        per_sample = -(target * self.log_softmax(logits.astype(ms.float32))).sum(axis=-1)
        return self.get_loss(per_sample)


class SoftTargetCrossEntropy(nn.LossBase):
    """Softmax cross-entropy against soft (probability) targets, as timm's
    ``SoftTargetCrossEntropy``: ``-sum_k target_k * log_softmax(logits)_k`` per sample.

    For the mixed targets of ``src.data.mixing.BatchMixer``, which already carry the label
    smoothing (as in timm, where ``Mixup`` smooths and this loss does not). Equals
    ``torch.nn.functional.cross_entropy(logits, target)`` with probability targets.

    Args:
        reduction (str): ``mean`` (over the batch), ``sum`` or ``none``.

    Inputs:
        - **logits** (Tensor) - float32 or float16, shape (N, K); cast to float32.
        - **target** (Tensor) - float32, shape (N, K), rows summing to 1.

    Outputs:
        float32 Tensor: scalar for ``mean``/``sum``, shape (N,) for ``none``.

    Raises:
        ValueError: If ``reduction`` is not one of the three.
    """

    def __init__(self, reduction="mean"):
        super().__init__(reduction)
        self.log_softmax = nn.LogSoftmax(axis=-1)

    def construct(self, logits, target):
        log_probs = self.log_softmax(logits.astype(ms.float32))
        per_sample = -(target.astype(ms.float32) * log_probs).sum(axis=-1)
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

    Args:
        smooth_factor (float): eps in [0, 1), used for hard labels only. Default 0.1.
        class_num (int): K, the number of classes. Default 1000.
        target_threshold (float, optional): t in [0, 1); None or 0 turns thresholding off
            (unlike timm, where only None does: t = 0 would turn every smoothed target into 1).
        soft_targets (bool): The cell receives float soft targets (N, K) instead of int32 class
            indices (N,). Fixed at construction so that the graph has static types.
        reduction (str): ``mean`` (over all N * K elements), ``sum`` or ``none``.

    Inputs:
        - **logits** (Tensor) - float32 or float16, shape (N, K); cast to float32.
        - **target** (Tensor) - int32 class indices in [0, K), shape (N,), or, with
          ``soft_targets``, float32 of shape (N, K).

    Outputs:
        float32 Tensor: scalar for ``mean``/``sum``, shape (N, K) for ``none``.

    Raises:
        ValueError: If ``smooth_factor`` is outside [0, 1), ``class_num`` < 1 or
            ``target_threshold`` is outside [0, 1).
    """

    def __init__(self, smooth_factor=0.1, class_num=1000, target_threshold=None,
                 soft_targets=False, reduction="mean"):
        super().__init__(reduction)
        if target_threshold is not None and not 0.0 <= target_threshold < 1.0:
            raise ValueError(f"target_threshold (bce_target_threshold) must be None or in "
                             f"[0, 1), got {target_threshold}")
        self.class_num = class_num
        self.soft_targets = bool(soft_targets)
        self.use_threshold = bool(target_threshold)
        self.threshold = ms.Tensor(float(target_threshold or 0.0), ms.float32)
        self.on_value, self.off_value = smoothed_one_hot_values(smooth_factor, class_num)

    def construct(self, logits, target):
        if self.soft_targets:
            target = target.astype(ms.float32)
        else:
            target = ops.one_hot(target, self.class_num, self.on_value, self.off_value)
        if self.use_threshold:
            target = (target > self.threshold).astype(ms.float32)
        per_element = ops.binary_cross_entropy_with_logits(
            logits.astype(ms.float32), target, reduction="none")
        return self.get_loss(per_element)


def _make_ce(label_smoothing, class_num, bce_target_threshold, soft_targets):
    if soft_targets:
        return SoftTargetCrossEntropy()
    return CrossEntropySmooth(label_smoothing, class_num)


def _make_bce(label_smoothing, class_num, bce_target_threshold, soft_targets):
    return BinaryCrossEntropy(label_smoothing, class_num, bce_target_threshold, soft_targets)


LOSSES = {"ce": _make_ce, "bce": _make_bce}
"""Loss name -> factory ``(label_smoothing, class_num, bce_target_threshold, soft_targets)``."""


def create_loss(loss, label_smoothing, class_num, bce_target_threshold=0.0, soft_targets=False):
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

    Returns:
        mindspore.nn.LossBase: The loss cell, ``(logits, label) -> float32 scalar``.

    Raises:
        KeyError: If ``loss`` is not a registered name; the message lists the valid ones.
        ValueError: From the loss for an out-of-range argument.
    """
    if loss not in LOSSES:
        raise KeyError(f"unknown loss {loss!r}; valid names: {', '.join(sorted(LOSSES))}")
    return LOSSES[loss](label_smoothing, class_num, bce_target_threshold, soft_targets)
