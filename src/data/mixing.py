"""Batch-level mixup / CutMix for the training pipeline, timm's ``Mixup`` in batch mode.

Run as the ``per_batch_map`` of ``mindspore.dataset`` batching, after the images are
normalized and in CHW layout::

    mixer = BatchMixer(mixup_alpha=0.2, cutmix_alpha=1.0, label_smoothing=0.1,
                       class_num=1000, seed=epoch_seed(seed, epoch))
    data = data.batch(batch_size, drop_remainder=True, per_batch_map=mixer,
                      input_columns=["image", "label"], output_columns=["image", "label"])

The ``label`` column then holds float32 soft targets (N, class_num) instead of int32 class
indices, so the loss must take soft targets (``create_loss(..., soft_targets=True)``) and
top-1 must be computed elsewhere on hard labels.

Every random draw of a batch comes from a generator seeded with (seed, epoch number, batch
number) alone, so the result depends neither on global RNG state nor on call order: parallel
workers, ``.skip()`` after ``.batch()`` (a resumed epoch) and a fresh run give bit-identical
batches.
"""
import numbers

import numpy as np


def _check_range(name, value, low, high=None):
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not np.isfinite(value) \
            or value < low or (high is not None and value > high):
        where = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be a number {where}, got {value!r}")
    return float(value)


def smooth_one_hot(labels, class_num, smoothing):
    """Smoothed one-hot targets as timm's ``mixup_target`` builds them.

    Args:
        labels (numpy.ndarray): int, shape (N,), class indices in [0, class_num).
        class_num (int): K.
        smoothing (float): eps; off value eps / K, on value 1 - eps + eps / K.

    Returns:
        numpy.ndarray: float64, shape (N, K); each row sums to 1.
    """
    off = smoothing / class_num
    on = 1.0 - smoothing + off
    target = np.full((len(labels), class_num), off, dtype=np.float64)
    target[np.arange(len(labels)), labels] = on
    return target


class BatchMixer:
    """Mixup or CutMix of a whole batch with its reversed self, and the mixed soft targets.

    Follows timm's ``timm.data.mixup.Mixup`` in ``mode='batch'`` with ``correct_lam=True``
    (Wightman, pytorch-image-models):

    - with probability ``mix_prob`` the batch is mixed at all; otherwise lam = 1;
    - when both alphas are > 0, CutMix is chosen with probability ``mix_switch_prob``, else
      mixup; when only one is > 0 that one is used;
    - lam ~ Beta(alpha, alpha) of the chosen method;
    - each sample i is paired with sample N-1-i (the batch reversed, ``x.flip(0)``; with an odd
      N the middle sample is paired with itself and stays unchanged);
    - mixup (Zhang et al., "mixup: Beyond Empirical Risk Minimization", ICLR 2018):
      ``lam * x + (1 - lam) * x_flipped``;
    - CutMix (Yun et al., "CutMix: Regularization Strategy to Train Strong Classifiers with
      Localizable Features", ICCV 2019): a box of side ``int(H * sqrt(1 - lam))`` by
      ``int(W * sqrt(1 - lam))`` centred at a uniform random pixel (the half sides are
      floored, then the box is clipped to the image) is pasted from ``x_flipped``, and lam is
      corrected to ``1 - box_area / (H * W)``, the share of pixels kept;
    - targets ``lam * smooth(y) + (1 - lam) * smooth(y_flipped)``, with smoothing off value
      eps / K and on value 1 - eps + eps / K (timm's ``mixup_target``). An unmixed batch gets
      ``smooth(y)``.

    torchvision's recipe (``references/classification/transforms.py``, ``RandomMixup`` /
    ``RandomCutmix`` under ``RandomChoice``) differs: it picks one of the two with p = 0.5 per
    batch and applies it always (no ``mix_prob``/``mix_switch_prob``), pairs sample i with
    sample i-1 (``roll(1, 0)``) rather than the reversed batch, builds the box from
    ``int(0.5 * sqrt(1 - lam) * side)`` half sides, and leaves label smoothing to the loss
    (``CrossEntropyLoss(label_smoothing=...)``) instead of folding it into the targets. We
    follow timm, so the loss for these targets takes no further smoothing.

    Determinism: the draws of a batch use ``numpy.random.default_rng([seed, epoch_num,
    batch_num])`` with the numbers from ``BatchInfo``. ``batch_num`` restarts at 0 every
    epoch of an iterator, and a pipeline built afresh each epoch is always in its epoch 0, so
    give each epoch's pipeline its own ``seed`` (e.g. the epoch's data seed), or every epoch
    repeats the same lam/box sequence.

    Args:
        mixup_alpha (float): Beta parameter of mixup; 0 turns mixup off. Default 1 (timm).
        cutmix_alpha (float): Beta parameter of CutMix; 0 turns CutMix off. Default 0.
        mix_prob (float): Probability in [0, 1] that a batch is mixed at all. Default 1.
        mix_switch_prob (float): Probability in [0, 1] of CutMix instead of mixup when both
            alphas are > 0. Default 0.5.
        label_smoothing (float): eps in [0, 1). Default 0.1.
        class_num (int): K, the number of classes. Default 1000.
        seed (int): Non-negative seed of the per-batch generators. Default 0.

    Inputs (``__call__(images, labels, batch_info)``):
        - **images** (numpy.ndarray or list) - float32, shape (N, 3, H, W) (normalized), or the
          list of N (3, H, W) arrays that ``per_batch_map`` hands over.
        - **labels** (numpy.ndarray or list) - int, shape (N,), class indices in [0, K).
        - **batch_info** (mindspore.dataset.BatchInfo) - gives ``get_batch_num()`` and
          ``get_epoch_num()``.

    Outputs:
        tuple(numpy.ndarray, numpy.ndarray): images float32 (N, 3, H, W) (a new array; the
        inputs are not modified) and targets float32 (N, K), each row summing to 1.

    Raises:
        ValueError: At construction, if an alpha is negative or both are 0, a probability is
            outside [0, 1], ``label_smoothing`` is outside [0, 1), ``class_num`` < 1 or
            ``seed`` is not a non-negative integer; when called, if the images are not 4-D,
            the label count differs from the image count, or a label is outside [0, K).
    """

    def __init__(self, mixup_alpha=1.0, cutmix_alpha=0.0, mix_prob=1.0, mix_switch_prob=0.5,
                 label_smoothing=0.1, class_num=1000, seed=0):
        self.mixup_alpha = _check_range("mixup_alpha", mixup_alpha, 0.0)
        self.cutmix_alpha = _check_range("cutmix_alpha", cutmix_alpha, 0.0)
        if self.mixup_alpha == 0.0 and self.cutmix_alpha == 0.0:
            raise ValueError(f"at least one of mixup_alpha and cutmix_alpha must be > 0, got "
                             f"mixup_alpha={mixup_alpha!r}, cutmix_alpha={cutmix_alpha!r}")
        self.mix_prob = _check_range("mix_prob", mix_prob, 0.0, 1.0)
        self.mix_switch_prob = _check_range("mix_switch_prob", mix_switch_prob, 0.0, 1.0)
        self.label_smoothing = _check_range("label_smoothing", label_smoothing, 0.0)
        if self.label_smoothing >= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
        if not isinstance(class_num, numbers.Integral) or isinstance(class_num, bool) \
                or class_num < 1:
            raise ValueError(f"class_num must be an integer >= 1, got {class_num!r}")
        if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.class_num = int(class_num)
        self.seed = int(seed)

    def __repr__(self):
        return (f"BatchMixer(mixup_alpha={self.mixup_alpha}, cutmix_alpha={self.cutmix_alpha}, "
                f"mix_prob={self.mix_prob}, mix_switch_prob={self.mix_switch_prob}, "
                f"label_smoothing={self.label_smoothing}, class_num={self.class_num}, "
                f"seed={self.seed})")

    def __call__(self, images, labels, batch_info):
        return self.mix(images, labels, batch_info.get_batch_num(), batch_info.get_epoch_num())

    def draw(self, batch_num, epoch_num=0):
        """The random parameters of one batch (timm's ``_params_per_batch``).

        Args:
            batch_num (int): Batch number within the epoch (``BatchInfo.get_batch_num()``).
            epoch_num (int): Epoch number of the iterator (``BatchInfo.get_epoch_num()``).

        Returns:
            tuple: (generator, lam, use_cutmix): the batch's ``numpy.random.Generator`` (for the
            CutMix centre), lam (float, 1.0 when the batch is not mixed) and whether CutMix
            is used.
        """
        rng = np.random.default_rng([self.seed, int(epoch_num), int(batch_num)])
        lam, use_cutmix = 1.0, False
        if rng.random() < self.mix_prob:
            if self.mixup_alpha > 0.0 and self.cutmix_alpha > 0.0:
                use_cutmix = bool(rng.random() < self.mix_switch_prob)
            else:
                use_cutmix = self.cutmix_alpha > 0.0
            alpha = self.cutmix_alpha if use_cutmix else self.mixup_alpha
            lam = float(rng.beta(alpha, alpha))
        return rng, lam, use_cutmix

    def mix(self, images, labels, batch_num, epoch_num=0):
        """Mix one batch; ``__call__`` without the ``BatchInfo``.

        Args:
            images, labels: As the inputs of the class.
            batch_num (int): Batch number within the epoch.
            epoch_num (int): Epoch number of the iterator.

        Returns:
            tuple(numpy.ndarray, numpy.ndarray): As the outputs of the class.
        """
        x = np.asarray(np.stack(images) if isinstance(images, (list, tuple)) else images,
                       dtype=np.float32)
        y = np.asarray(np.stack(labels) if isinstance(labels, (list, tuple)) else labels)
        y = y.reshape(-1).astype(np.int64)
        if x.ndim != 4:
            raise ValueError(f"images must be (N, C, H, W), got shape {x.shape}")
        if len(y) != len(x):
            raise ValueError(f"got {len(x)} images but {len(y)} labels")
        if len(y) and (y.min() < 0 or y.max() >= self.class_num):
            raise ValueError(f"labels must be in [0, {self.class_num}), got values in "
                             f"[{y.min()}, {y.max()}]")

        rng, lam, use_cutmix = self.draw(batch_num, epoch_num)
        if lam != 1.0:
            if use_cutmix:
                (y0, y1, x0, x1), lam = self._box(rng, lam, x.shape[-2], x.shape[-1])
                x = x.copy()  # pasted in place; the caller's array stays as it was
                x[:, :, y0:y1, x0:x1] = x[::-1, :, y0:y1, x0:x1].copy()
            else:
                x = x * np.float32(lam) + x[::-1] * np.float32(1.0 - lam)
        one_hot = smooth_one_hot(y, self.class_num, self.label_smoothing)
        target = lam * one_hot + (1.0 - lam) * one_hot[::-1]
        return np.ascontiguousarray(x, dtype=np.float32), target.astype(np.float32)

    @staticmethod
    def _box(rng, lam, height, width):
        """timm's ``rand_bbox`` (no margin) and ``cutmix_bbox_and_lam`` with correct_lam."""
        ratio = np.sqrt(1.0 - lam)
        cut_h, cut_w = int(height * ratio), int(width * ratio)
        cy = int(rng.integers(0, height))
        cx = int(rng.integers(0, width))
        y0, y1 = np.clip([cy - cut_h // 2, cy + cut_h // 2], 0, height)
        x0, x1 = np.clip([cx - cut_w // 2, cx + cut_w // 2], 0, width)
        lam = 1.0 - float((y1 - y0) * (x1 - x0)) / float(height * width)
        return (int(y0), int(y1), int(x0), int(x1)), lam
