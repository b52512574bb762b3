"""Training augmentations beyond crop and flip: TrivialAugment wide, RandAugment, AutoAugment
(per-image policies on uint8 HWC RGB crops), random erasing (normalized float32 CHW), and the
checks of their arguments. TrivialAugment and RandAugment are built from MindSpore's single
ops, not its built-ins, which mis-translate and mis-shear in 2.10: docs/augmentations.md.
"""
import itertools
import math
import zlib

import mindspore as ms
import mindspore.dataset as ds
import mindspore.dataset.transforms as transforms
import mindspore.dataset.vision as vision
import numpy as np

from src.utils.limits import (
    MAGNITUDE_BINS,
    RANDAUGMENT_MAX_MAGNITUDE,
    RANDAUGMENT_MAX_OPS,
)

ERASE_SCALE = (0.02, 1.0 / 3.0)  # erased area, fraction of the image (Zhong et al.; timm)
ERASE_RATIO = (0.3, 3.3)  # erased height / width, drawn log-uniformly
_BILINEAR = vision.Inter.BILINEAR


def trivial_augment_wide_space(num_bins: int = MAGNITUDE_BINS) -> dict:
    """TrivialAugment's "wide" space (Müller & Hutter 2021; torchvision's
    ``TrivialAugmentWide``): op name -> (``num_bins`` magnitudes or None, signed). Units: shear
    factor, pixels, degrees, enhancement m of factor 1 + m, bits kept, Solarize threshold."""
    return _augment_space(num_bins, shear=0.99, shift=32.0, rotate=135.0, enhance=0.99,
                          posterize_drop=6)


def rand_augment_space(image_size: int, num_bins: int = MAGNITUDE_BINS) -> dict:
    """RandAugment's space (Cubuk et al. 2020; torchvision's), as
    ``trivial_augment_wide_space``; translation up to 150/331 of ``image_size`` pixels."""
    return _augment_space(num_bins, shear=0.3, shift=150.0 / 331.0 * image_size, rotate=30.0,
                          enhance=0.9, posterize_drop=4)


def _augment_space(num_bins, *, shear, shift, rotate, enhance, posterize_drop):
    """The op table both spaces share: each magnitude linear from 0 to its maximum over the
    bins (Solarize from 255 down to 0), Posterize from 8 bits down to 8 - ``posterize_drop``."""
    def ramp(top: float) -> np.ndarray:
        return np.linspace(0.0, top, num_bins)
    return {"Identity": (None, False),
            "ShearX": (ramp(shear), True), "ShearY": (ramp(shear), True),
            "TranslateX": (ramp(shift), True), "TranslateY": (ramp(shift), True),
            "Rotate": (ramp(rotate), True),
            "Brightness": (ramp(enhance), True), "Color": (ramp(enhance), True),
            "Contrast": (ramp(enhance), True), "Sharpness": (ramp(enhance), True),
            "Posterize": (_posterize_bits(num_bins, posterize_drop), False),
            "Solarize": (np.linspace(255.0, 0.0, num_bins), False),
            "AutoContrast": (None, False), "Equalize": (None, False)}


def _posterize_bits(num_bins, max_drop):
    """Bits kept, from 8 down to 8 - ``max_drop`` over the bins (round half to even)."""
    return 8 - np.round(np.arange(num_bins) / ((num_bins - 1) / max_drop))


def _shear(axis, m, size):
    """Shear by factor ``m`` about the top-left corner, as torchvision: ``vision.Affine``
    shears about the center by an angle, so shift by -m / 2 of the side and use atan(m)."""
    del size
    degrees, shift = math.degrees(math.atan(m)), -m / 2
    if axis == 0:
        return vision.Affine(0.0, (shift, 0.0), 1.0, (degrees, 0.0), _BILINEAR, 0)
    return vision.Affine(0.0, (0.0, shift), 1.0, (0.0, degrees), _BILINEAR, 0)


def _translate(axis, m, size):
    """Shift by int(m) pixels (``vision.Affine`` takes fractions of the side), fill 0."""
    shift = int(m) / size
    return vision.Affine(0.0, (shift, 0.0) if axis == 0 else (0.0, shift), 1.0, (0.0, 0.0),
                         _BILINEAR, 0)


# op name -> builder(magnitude, image_size) of the MindSpore op (uint8 HWC RGB in and out)
AUGMENT_OPS = {
    "Identity": lambda m, size: transforms.TypeCast(ms.uint8),
    "ShearX": lambda m, size: _shear(0, m, size),
    "ShearY": lambda m, size: _shear(1, m, size),
    "TranslateX": lambda m, size: _translate(0, m, size),
    "TranslateY": lambda m, size: _translate(1, m, size),
    "Rotate": lambda m, size: vision.Rotate(float(m), _BILINEAR, False, None, 0),
    "Brightness": lambda m, size: vision.AdjustBrightness(1.0 + m),
    "Color": lambda m, size: vision.AdjustSaturation(1.0 + m),
    "Contrast": lambda m, size: vision.AdjustContrast(1.0 + m),
    "Sharpness": lambda m, size: vision.AdjustSharpness(1.0 + m),
    "Posterize": lambda m, size: vision.Posterize(int(m)),
    # pixels >= m, for integer pixels the same as >= ceil(m)
    "Solarize": lambda m, size: vision.Solarize(float(math.ceil(m))),
    "AutoContrast": lambda m, size: vision.AutoContrast(),
    "Equalize": lambda m, size: vision.Equalize(),
}


def augment_variants(space: dict, image_size: int) -> list[tuple[str, float, object]]:
    """(op name, signed magnitude, MindSpore op) of every entry of ``space``, each op given
    as many entries, so one uniform pick draws op, magnitude and sign uniformly."""
    count = 2 * max(len(m) for m, _ in space.values() if m is not None)
    variants = []
    for name, (magnitudes, signed) in space.items():
        build = AUGMENT_OPS[name]
        if magnitudes is None:
            variants += [(name, 0.0, build(0.0, image_size))] * count
            continue
        signs = (1.0, -1.0) if signed else (1.0, 1.0)
        variants += [(name, s * float(m), build(s * float(m), image_size))
                     for m in magnitudes for s in signs]
    return variants


def _trivial_augment_wide(image_size, num_ops, magnitude):
    """One op per image, uniformly over ops, magnitude bins and signs: one RandomChoice."""
    del num_ops, magnitude
    variants = augment_variants(trivial_augment_wide_space(), image_size)
    return [transforms.RandomChoice([op for _, _, op in variants])]


def _rand_augment(image_size, num_ops, magnitude):
    """``num_ops`` independent uniform picks of (op, sign) at one magnitude bin, as ONE
    RandomChoice over all ordered tuples: MindSpore seeds every random op alike, so separate
    RandomChoice ops would pick the same entry for each image."""
    space = {name: (None if m is None else m[magnitude:magnitude + 1], signed)
             for name, (m, signed) in rand_augment_space(image_size).items()}
    if num_ops == 0:
        return []
    ops = [op for _, _, op in augment_variants(space, image_size)]
    tuples = itertools.product(ops, repeat=num_ops)
    return [transforms.RandomChoice([transforms.Compose(list(t)) if num_ops > 1 else t[0]
                                     for t in tuples])]


def _auto_augment(image_size, num_ops, magnitude):
    """MindSpore's own AutoAugment, ImageNet policy, bilinear, fill 0."""
    del image_size, num_ops, magnitude
    return [vision.AutoAugment(vision.AutoAugmentPolicy.IMAGENET, _BILINEAR, 0)]


AUTO_AUGMENT_POLICIES = {"none": lambda image_size, num_ops, magnitude: [],
                         "trivialaugment_wide": _trivial_augment_wide,
                         "randaugment": _rand_augment, "autoaugment": _auto_augment}


def auto_augment_ops(name: str, image_size: int, randaugment_num_ops: int = 2,
                     randaugment_magnitude: int = 9) -> list:
    """MindSpore ops of the per-image policy ``name`` (``AUTO_AUGMENT_POLICIES``; ``none``: no
    op) on square uint8 HWC RGB images of side ``image_size``, bilinear, filling with 0
    (docs/augmentations.md#how-ours-are-built).

    Raises:
        ValueError: As ``check_augment_args``.
    """
    check_augment_args(name, randaugment_num_ops, randaugment_magnitude, 0.0)
    return AUTO_AUGMENT_POLICIES[name](image_size, randaugment_num_ops, randaugment_magnitude)


def check_augment_args(auto_augment: str, randaugment_num_ops: int,
                       randaugment_magnitude: int, random_erasing: float) -> None:
    """Raises:
        ValueError: Naming the bad value: an unknown ``auto_augment`` (lists the valid ones),
            RandAugment arguments outside ``src.utils.image_constants``' limits, or
            ``random_erasing`` not in [0, 1].
    """
    if auto_augment not in AUTO_AUGMENT_POLICIES:
        raise ValueError(f"unknown auto_augment {auto_augment!r}; valid: "
                         f"{', '.join(AUTO_AUGMENT_POLICIES)}")
    if auto_augment == "randaugment":
        _check_int_range("randaugment_num_ops", randaugment_num_ops, RANDAUGMENT_MAX_OPS)
        _check_int_range("randaugment_magnitude", randaugment_magnitude,
                         RANDAUGMENT_MAX_MAGNITUDE)
    check_probability("random_erasing", random_erasing)


def _check_int_range(key, value, high):
    is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if not is_int or not 0 <= value <= high:
        raise ValueError(f"{key} must be an integer in [0, {high}], got {value!r}")


def check_probability(key: str, value: float) -> None:
    """Raises:
        ValueError: If ``value`` is not a number in [0, 1] (names ``key`` and the value).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{key} must be a probability in [0, 1], got {value!r}")


class RandomErasing:
    """Random erasing (Zhong et al. 2020) as torchvision's ``RandomErasing(value="random")`` /
    timm's ``mode="pixel"``, on a normalized float32 CHW image: with probability ``prob`` one
    rectangle (area from ``scale``, aspect log-uniform from ``ratio``, 10 tries) filled with
    standard normal noise. Each image draws from its own generator seeded with (``seed``,
    CRC-32 of its bytes; default seed: the dataset seed when built), deterministic under
    parallel workers (docs/augmentations.md#random-erasing). Raises ValueError for a ``prob``
    outside [0, 1]."""

    max_attempts = 10

    def __init__(self, prob: float, scale: tuple[float, float] = ERASE_SCALE,
                 ratio: tuple[float, float] = ERASE_RATIO, seed: int | None = None):
        check_probability("random_erasing", prob)
        self.prob, self.scale, self.ratio = prob, tuple(scale), tuple(ratio)
        self.seed = ds.config.get_seed() if seed is None else seed

    def __call__(self, image: np.ndarray) -> np.ndarray:
        """``image`` float32 (C, H, W) -> the same array, or an erased copy."""
        rng = np.random.default_rng([self.seed, zlib.crc32(np.ascontiguousarray(image))])
        if rng.random() >= self.prob:
            return image
        box = self.rectangle(image.shape[1:], rng)
        if box is None:
            return image
        top, left, height, width = box
        erased = image.copy()
        erased[:, top:top + height, left:left + width] = rng.standard_normal(
            (image.shape[0], height, width), dtype=np.float32)
        return erased

    def rectangle(self, shape: tuple[int, int],
                  rng: np.random.Generator) -> tuple[int, int, int, int] | None:
        """(top, left, height, width) of a rectangle inside ``shape`` (H, W), or None."""
        image_h, image_w = shape
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(self.max_attempts):
            area = image_h * image_w * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            height = int(round(math.sqrt(area * aspect)))
            width = int(round(math.sqrt(area / aspect)))
            if height < image_h and width < image_w:
                return (int(rng.integers(0, image_h - height + 1)),
                        int(rng.integers(0, image_w - width + 1)), height, width)
        return None
