"""Batch-level mixup / CutMix, timm's ``Mixup`` in batch mode, run as the ``per_batch_map`` of
batching on normalized CHW images; the ``label`` column becomes float32 soft targets
(N, class_num), so the loss must take soft targets. See docs/data.md#mixup-and-cutmix-batchmixer.
"""
import numbers

import numpy as np


def _check_range(name, value, low, high=None):
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not np.isfinite(value) \
            or value < low or (high is not None and value > high):
        where = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be a number {where}, got {value!r}")
    return float(value)


def smooth_one_hot(labels: np.ndarray, class_num: int, smoothing: float) -> np.ndarray:
    """Smoothed one-hot targets (timm's ``mixup_target``): float64 (N, K) from int labels (N,),
    off value eps / K, on value 1 - eps + eps / K."""
    off = smoothing / class_num
    on = 1.0 - smoothing + off
    target = np.full((len(labels), class_num), off, dtype=np.float64)
    target[np.arange(len(labels)), labels] = on
    return target


class BatchMixer:
    """Mixup or CutMix of a whole batch with its reversed self, and the mixed soft targets.

    timm's ``Mixup(mode='batch', correct_lam=True)``: a batch is mixed with probability
    ``mix_prob``, by CutMix with probability ``mix_switch_prob`` when both alphas are > 0, with
    lam ~ Beta(alpha, alpha); sample i pairs with N-1-i. Every draw comes from
    ``default_rng([seed, epoch_num, batch_num])``, so give each epoch's pipeline its own seed.
    Mixup: Zhang et al. 2018; CutMix: Yun et al. 2019; see docs/data.md#mixup-and-cutmix-batchmixer.

    Args:
        mixup_alpha: Beta parameter of mixup; 0 = off.
        cutmix_alpha: Beta parameter of CutMix; 0 = off.
        mix_prob: Probability in [0, 1] that a batch is mixed.
        mix_switch_prob: Probability in [0, 1] of CutMix when both alphas are > 0.
        label_smoothing: eps in [0, 1), folded into the targets.
        class_num: K.
        seed: Non-negative seed of the per-batch generators.

    Inputs (``__call__(images, labels, batch_info)``):
        float32 images (N, 3, H, W) (or a list of (3, H, W)), int labels (N,) in [0, K) or
        float multi-hot targets (N, K) in [0, 1], and MindSpore's ``BatchInfo``.

    Outputs:
        New images float32 (N, 3, H, W) and targets float32 (N, K): ``lam * t + (1 - lam) *
        t_flipped`` of the (smoothed one-hot, or multi-hot) targets t.

    Raises:
        ValueError: For an argument out of its range (both alphas 0 too), images not 4-D,
            a label count unlike the image count, a label outside [0, K), float targets not
            (N, K) in [0, 1], or ``label_smoothing`` with them.
    """

    def __init__(self, *, mixup_alpha: float = 1.0, cutmix_alpha: float = 0.0,
                 mix_prob: float = 1.0, mix_switch_prob: float = 0.5,
                 label_smoothing: float = 0.1, class_num: int = 1000, seed: int = 0):
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

    def draw(self, batch_num: int, epoch_num: int = 0
             ) -> tuple[np.random.Generator, float, bool]:
        """The batch's generator (for the CutMix centre), lam (1.0 unmixed) and whether CutMix
        is used (timm's ``_params_per_batch``)."""
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

    def mix(self, images: np.ndarray | list[np.ndarray], labels: np.ndarray | list,
            batch_num: int, epoch_num: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Mix one batch: ``__call__`` with the batch and epoch numbers given."""
        x = np.asarray(np.stack(images) if isinstance(images, (list, tuple)) else images,
                       dtype=np.float32)
        y = np.asarray(np.stack(labels) if isinstance(labels, (list, tuple)) else labels)
        if x.ndim != 4:
            raise ValueError(f"images must be (N, C, H, W), got shape {x.shape}")
        targets = self._targets(y, len(x))

        rng, lam, use_cutmix = self.draw(batch_num, epoch_num)
        if lam != 1.0:
            if use_cutmix:
                (y0, y1, x0, x1), lam = self._box(rng, lam, x.shape[-2], x.shape[-1])
                x = x.copy()  # pasted in place; the caller's array stays as it was
                x[:, :, y0:y1, x0:x1] = x[::-1, :, y0:y1, x0:x1].copy()
            else:
                x = x * np.float32(lam) + x[::-1] * np.float32(1.0 - lam)
        target = lam * targets + (1.0 - lam) * targets[::-1]
        return np.ascontiguousarray(x, dtype=np.float32), target.astype(np.float32)

    def _targets(self, y, count):
        """float64 (N, K) targets to mix: int labels (N,) one-hot and smoothed, or float
        multi-hot (N, K) in [0, 1] as they are (no smoothing)."""
        if not np.issubdtype(y.dtype, np.floating):
            y = y.reshape(-1).astype(np.int64)
            if len(y) != count:
                raise ValueError(f"got {count} images but {len(y)} labels")
            if len(y) and (y.min() < 0 or y.max() >= self.class_num):
                raise ValueError(f"labels must be in [0, {self.class_num}), got values in "
                                 f"[{y.min()}, {y.max()}]")
            return smooth_one_hot(y, self.class_num, self.label_smoothing)
        if y.shape != (count, self.class_num):
            raise ValueError(f"float targets must be (N, K) = ({count}, {self.class_num}), got "
                             f"shape {y.shape}")
        if y.size and not (np.isfinite(y).all() and y.min() >= 0 and y.max() <= 1):
            raise ValueError("float targets must be in [0, 1]")
        if self.label_smoothing:
            raise ValueError(f"label_smoothing {self.label_smoothing} is not defined for "
                             f"multi-hot targets: use 0")
        return y.astype(np.float64)

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
