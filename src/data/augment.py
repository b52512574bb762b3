"""Training augmentations on top of crop and flip: TrivialAugment wide, RandAugment and
AutoAugment (per-image policies on uint8 HWC RGB crops) and random erasing (on the normalized
float32 CHW image), with the checks of their arguments.

TrivialAugment and RandAugment are built from MindSpore's single C++ ops, not taken from
``vision.TrivialAugmentWide`` / ``vision.RandAugment``: in MindSpore 2.10 those translate by
whole image widths (TranslateX/Y by m pixels blanks the image: about 1 in 8 TrivialAugment
images comes out all black), shear by tan(m) about the center and draw ops and signs with
a bias. Details and measurements: docs/augmentations.md.
"""
import itertools
import math
import zlib

import mindspore as ms
import mindspore.dataset as ds
import mindspore.dataset.transforms as transforms
import mindspore.dataset.vision as vision
import numpy as np

MAGNITUDE_BINS = 31  # magnitude bins of TrivialAugment / RandAugment (torchvision's default)
RANDAUGMENT_MAX_OPS = 3  # the flat choice over op tuples has 28 ** num_ops entries
ERASE_SCALE = (0.02, 1.0 / 3.0)  # erased area, fraction of the image (Zhong et al.; timm)
ERASE_RATIO = (0.3, 3.3)  # erased height / width, drawn log-uniformly
_BILINEAR = vision.Inter.BILINEAR


def trivial_augment_wide_space(num_bins=MAGNITUDE_BINS):
    """TrivialAugment's "wide" space (Müller & Hutter 2021; torchvision's
    ``TrivialAugmentWide``): op name -> (magnitudes, signed).

    Magnitudes: shear factor (x' = x + m y), translation in pixels (truncated to int), rotation
    in degrees, enhancement ``m`` for the factor 1 + m (Brightness, Color = saturation,
    Contrast, Sharpness), bits kept (Posterize), threshold (Solarize inverts pixels >= it);
    ``None`` for ops without one. Signed ops use +m or -m with equal probability.

    Returns:
        dict: name -> (numpy.ndarray of ``num_bins`` magnitudes or None, bool signed).
    """
    return _augment_space(num_bins, shear=0.99, shift=32.0, rotate=135.0, enhance=0.99,
                          posterize_drop=6)


def rand_augment_space(image_size, num_bins=MAGNITUDE_BINS):
    """RandAugment's space (Cubuk et al. 2020; torchvision's ``RandAugment``), magnitudes as
    ``trivial_augment_wide_space``; translation up to 150/331 of ``image_size`` pixels.

    Returns:
        dict: name -> (numpy.ndarray of ``num_bins`` magnitudes or None, bool signed).
    """
    return _augment_space(num_bins, shear=0.3, shift=150.0 / 331.0 * image_size, rotate=30.0,
                          enhance=0.9, posterize_drop=4)


def _augment_space(num_bins, shear, shift, rotate, enhance, posterize_drop):
    """The op table both spaces share: each magnitude linear from 0 to its maximum over the
    bins (Solarize from 255 down to 0), Posterize from 8 bits down to 8 - ``posterize_drop``."""
    def ramp(top):
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
    """Shear by factor ``m`` about the top-left corner (torchvision's ``center=[0, 0]``, PIL's
    affine data (1, m, 0, 0, 1, 0) for x): ``vision.Affine`` shears about the center, so a
    shift of -m x side / 2 moves the fixed line to the top (left) edge. ``vision.Affine``
    takes the shift as a fraction of the side (-m / 2 for any ``size``) and the shear as an
    angle whose tangent is the factor."""
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


def augment_variants(space, image_size):
    """Every (op, magnitude, sign) of ``space`` as a MindSpore op, each op name given the same
    number of entries (2 per magnitude: +m and -m for signed ops, m twice otherwise), so a
    uniform pick among them picks the op uniformly, then the magnitude and the sign.

    Returns:
        list[tuple(str, float, object)]: (op name, signed magnitude, MindSpore op).
    """
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


def auto_augment_ops(name, image_size, randaugment_num_ops=2, randaugment_magnitude=9):
    """The per-image policy ``name`` (``AUTO_AUGMENT_POLICIES``) for square uint8 HWC RGB
    images of side ``image_size`` (pixels 0-255; output the same shape and dtype), bilinear,
    geometric ops filling with 0:

    - ``none``: no op.
    - ``trivialaugment_wide``: one op of ``trivial_augment_wide_space`` per image, op, bin
      (31) and sign uniform (Müller & Hutter 2021).
    - ``randaugment``: ``randaugment_num_ops`` ops of ``rand_augment_space`` in sequence, each
      op and sign uniform, magnitude bin ``randaugment_magnitude`` (Cubuk et al. 2020).
    - ``autoaugment``: ``vision.AutoAugment`` with the ImageNet policy (Cubuk et al. 2019).

    Returns:
        list: MindSpore ops (empty for ``none``).

    Raises:
        ValueError: As ``check_augment_args``.
    """
    check_augment_args(name, randaugment_num_ops, randaugment_magnitude, 0.0)
    return AUTO_AUGMENT_POLICIES[name](image_size, randaugment_num_ops, randaugment_magnitude)


def check_augment_args(auto_augment, randaugment_num_ops, randaugment_magnitude,
                       random_erasing):
    """Raises:
        ValueError: Naming the bad value: an ``auto_augment`` not in
            ``AUTO_AUGMENT_POLICIES`` (lists the valid names), ``randaugment_num_ops`` not an
            int in [0, 3], ``randaugment_magnitude`` not an int in [0, 30], or
            ``random_erasing`` not in [0, 1].
    """
    if auto_augment not in AUTO_AUGMENT_POLICIES:
        raise ValueError(f"unknown auto_augment {auto_augment!r}; valid: "
                         f"{', '.join(AUTO_AUGMENT_POLICIES)}")
    if auto_augment == "randaugment":
        _check_int_range("randaugment_num_ops", randaugment_num_ops, RANDAUGMENT_MAX_OPS)
        _check_int_range("randaugment_magnitude", randaugment_magnitude, MAGNITUDE_BINS - 1)
    check_probability("random_erasing", random_erasing)


def _check_int_range(key, value, high):
    is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if not is_int or not 0 <= value <= high:
        raise ValueError(f"{key} must be an integer in [0, {high}], got {value!r}")


def check_probability(key, value):
    """Raises:
        ValueError: If ``value`` is not a number in [0, 1] (names ``key`` and the value).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{key} must be a probability in [0, 1], got {value!r}")


class RandomErasing:
    """Random erasing (Zhong et al. 2020) with torchvision's ``RandomErasing(value="random")``
    / timm's ``mode="pixel"`` semantics, on a normalized float32 CHW image.

    With probability ``prob``: up to 10 tries to draw an area fraction uniformly from
    ``scale`` and an aspect ratio (height / width) log-uniformly from ``ratio``; height and
    width are rounded, and the first rectangle strictly smaller than the image is placed
    uniformly and filled with independent standard normal values (float32, every channel
    and pixel its own). No fitting rectangle in 10 tries: the image is returned unchanged.
    Not ``vision.RandomErasing``: that draws the aspect ratio uniformly (not log-uniformly)
    and uses Python's and numpy's global random state, so a pipeline with more than one
    worker gives different results on every run.

    Deterministic under parallel workers: each image's random numbers come from its own
    generator seeded with (``seed``, CRC-32 of the image's bytes), whatever thread runs it,
    in whatever order; ``seed`` defaults to the dataset seed (``ds.config.get_seed()``)
    when the op is built, so ``ds.config.set_seed`` before building the pipeline fixes it.

    Args:
        prob (float): Probability of erasing, in [0, 1].
        scale (tuple(float, float)): Erased area range, fraction of the image area.
        ratio (tuple(float, float)): Aspect ratio (height / width) range.
        seed (int, optional): Base seed; default the dataset seed.

    Raises:
        ValueError: If ``prob`` is not in [0, 1] (names the value).
    """

    max_attempts = 10

    def __init__(self, prob, scale=ERASE_SCALE, ratio=ERASE_RATIO, seed=None):
        check_probability("random_erasing", prob)
        self.prob, self.scale, self.ratio = prob, tuple(scale), tuple(ratio)
        self.seed = ds.config.get_seed() if seed is None else seed

    def __call__(self, image):
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

    def rectangle(self, shape, rng):
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
