"""Image classification input pipelines on ``mindspore.dataset``.

Factories in the style of MindCV: ``create_transforms`` builds the per-image ops,
``create_dataset`` the source, the maps and the batching.

- ``imagefolder``: ``ImageFolderDataset``, one sub-folder per class (ImageNet train/val
  layout; also CIFAR-10 stored as JPEG class folders). Labels are the indices of the
  class folders in sorted order.
- ``cifar10``: ``Cifar10Dataset`` over the binary release (``data_batch_1..5.bin`` for
  training, ``test_batch.bin`` for eval); its uint32 labels are cast to int32.

Output columns: ``image`` float32 (N, 3, image_size, image_size), normalized with the
ImageNet mean/std from pixels in [0, 255]; ``label`` int32 (N,) (or what ``batch_transform``
returns).

Training augmentations beyond crop + flip are off by default (the pipelines are then the same,
bit for bit, as without them): ``auto_augment`` (TrivialAugment wide, RandAugment, AutoAugment)
and ``random_erasing``; ``batch_transform`` hooks a batch-mixing op (mixup / cutmix) into the
batching. How they differ from torchvision's, and why TrivialAugment and RandAugment are built
here from MindSpore's single ops: docs/augmentations.md.
"""
import itertools
import math
import os
import zlib

import mindspore as ms
import mindspore.dataset as ds
import mindspore.dataset.transforms as transforms
import mindspore.dataset.vision as vision
import numpy as np

from src.errors import MissingFileError
from src.image_check import IMAGE_EXTENSIONS, ImageFolderError, check_image_folder

# ImageNet mean / std of torchvision and NVIDIA, in units of 0-255 pixel values.
IMAGENET_MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
IMAGENET_STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]
CIFAR10_TRAIN_FILES = [f"data_batch_{i}.bin" for i in range(1, 6)]
CIFAR10_TEST_FILES = ["test_batch.bin"]
CIFAR10_RECORDS_PER_FILE = 10000
CIFAR10_RECORD_BYTES = 1 + 32 * 32 * 3  # label byte + 3 colour planes
MAGNITUDE_BINS = 31  # magnitude bins of TrivialAugment / RandAugment (torchvision's default)
RANDAUGMENT_MAX_OPS = 3  # the flat choice over op tuples has 28 ** num_ops entries
ERASE_SCALE = (0.02, 1.0 / 3.0)  # erased area, fraction of the image (Zhong et al.; timm)
ERASE_RATIO = (0.3, 3.3)  # erased height / width, drawn log-uniformly
_BILINEAR = vision.Inter.BILINEAR


def create_transforms(is_training, image_size=224, eval_resize=256, decoded=False,
                      crop_scale=(0.08, 1.0), auto_augment="none", randaugment_num_ops=2,
                      randaugment_magnitude=9, random_erasing=0.0):
    """Per-image transforms of the ResNet recipe (torchvision / NVIDIA ImageNet).

    Train: random resized crop (area ``crop_scale``, default 0.08-1, aspect ratio 3/4-4/3,
    bilinear) fused with the JPEG decode (OpenCV, C++), random horizontal flip, the
    ``auto_augment`` policy (on the uint8 HWC RGB crop, pixels 0-255), normalize, HWC -> CHW,
    then random erasing (on the normalized float32 CHW tensor): torchvision's order in its
    reference recipe (``references/classification/presets.py``).
    Eval: decode to a PIL image, resize the shorter side to ``eval_resize`` with PIL's
    antialiased bilinear filter, center crop ``image_size``, normalize, HWC -> CHW: the same
    pixels as torchvision's ``Resize(256)``/``CenterCrop(224)`` on PIL images (OpenCV's bilinear
    resize has no antialiasing and differs by 3.7 of 255 on average). Greyscale and CMYK
    JPEGs decode to 3-channel RGB. The augmentation arguments are checked but ignored for eval.

    Args:
        is_training (bool): Training (random) or eval (deterministic) transforms.
        image_size (int): Output height and width, pixels.
        eval_resize (int): Eval only: shorter side before the center crop, pixels.
        decoded (bool): Input is already a decoded HWC uint8 image (CIFAR-10 binary), not
            encoded bytes.
        crop_scale (tuple(float, float)): Train only: random crop area range, as a fraction
            of the image area.
        auto_augment (str): Train only: ``none`` (default), ``trivialaugment_wide``
            (Müller & Hutter 2021, "TrivialAugment"), ``randaugment`` (Cubuk et al. 2020,
            "RandAugment") or ``autoaugment`` (Cubuk et al. 2019, "AutoAugment", ImageNet
            policy); see ``auto_augment_ops``.
        randaugment_num_ops (int): ``randaugment`` only: ops applied per image, 0-3.
        randaugment_magnitude (int): ``randaugment`` only: magnitude bin, 0-30 of 31.
        random_erasing (float): Train only: probability of erasing one rectangle of the
            normalized image with standard normal noise (Zhong et al. 2020, "Random Erasing
            Data Augmentation"); 0 (default) adds no op. See ``RandomErasing``.

    Returns:
        list: MindSpore transforms (and ``RandomErasing``, a Python callable), input encoded
        bytes (or uint8 HWC RGB), output float32 CHW. Apply them in a pipeline
        (``Dataset.map``) or one by one.

    Raises:
        ValueError: If ``auto_augment`` is unknown (lists the valid names), the RandAugment
            arguments are out of range, or ``random_erasing`` is not in [0, 1].
    """
    check_augment_args(auto_augment, randaugment_num_ops, randaugment_magnitude, random_erasing)
    normalize = [vision.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD), vision.HWC2CHW()]
    if is_training:
        crop_args = dict(scale=tuple(crop_scale), ratio=(3.0 / 4.0, 4.0 / 3.0))
        crop = (vision.RandomResizedCrop(image_size, **crop_args) if decoded
                else vision.RandomCropDecodeResize(image_size, **crop_args))
        policy = auto_augment_ops(auto_augment, image_size, randaugment_num_ops,
                                  randaugment_magnitude)
        erasing = [RandomErasing(random_erasing)] if random_erasing > 0 else []
        return [crop, vision.RandomHorizontalFlip(prob=0.5)] + policy + normalize + erasing
    to_pil = vision.ToPIL() if decoded else vision.Decode(to_pil=True)
    return [to_pil, vision.Resize(eval_resize, vision.Inter.BILINEAR),
            vision.CenterCrop(image_size), vision.ToNumpy()] + normalize


def create_dataset(data_path, is_training, dataset="imagefolder", batch_size=32,
                   image_size=224, eval_resize=256, crop_scale=(0.08, 1.0), num_parallel_workers=4,
                   num_shards=None, shard_id=None, drop_remainder=None, shuffle=None,
                   check_images=True, auto_augment="none", randaugment_num_ops=2,
                   randaugment_magnitude=9, random_erasing=0.0, batch_transform=None):
    """Build a batched classification dataset.

    The augmentation arguments (``auto_augment`` to ``batch_transform``) apply to training
    only: they are checked for eval too, but the eval pipeline is the same with or without
    them.

    Args:
        data_path (str): Class-folder root (``imagefolder``) or folder of the CIFAR-10
            ``.bin`` files (``cifar10``).
        is_training (bool): Random augmentation, shuffling and dropping of the last
            partial batch; eval never shuffles and keeps every image.
        dataset (str): ``imagefolder`` or ``cifar10``.
        batch_size (int): Images per batch on this device (per-device batch).
        image_size (int): Output crop size, pixels.
        eval_resize (int): Eval resize of the shorter side, pixels.
        crop_scale (tuple(float, float)): Train random crop area range (fraction).
        num_parallel_workers (int): Worker threads for reading and mapping; capped at the
            number of CPUs (MindSpore rejects more).
        num_shards (int, optional): Number of data-parallel shards (devices).
        shard_id (int, optional): This device's shard, in [0, num_shards).
        drop_remainder (bool, optional): Drop the last partial batch; default: is_training.
        shuffle (bool, optional): Shuffle the order; default: is_training.
        check_images (bool): ``imagefolder``: check every file before reading
            (``src.image_check``); the folder layout is always checked.
        auto_augment (str): Train only: per-image policy, as ``create_transforms``.
        randaugment_num_ops (int): Train only: as ``create_transforms``.
        randaugment_magnitude (int): Train only: as ``create_transforms``.
        random_erasing (float): Train only: erasing probability, as ``create_transforms``.
        batch_transform (callable, optional): Train only: ``f(images, labels, batch_info)
            -> (images, targets)`` run on every batch (``Dataset.batch``'s ``per_batch_map``),
            e.g. mixup / cutmix. It gets numpy ``images`` float32 (N, 3, image_size,
            image_size), normalized, and ``labels`` int32 (N,), plus MindSpore's
            ``BatchInfo`` (``get_batch_num()``, ``get_epoch_num()``); its outputs become the
            ``image`` and ``label`` columns, their dtypes and shapes as returned. It runs in
            one worker, batch by batch in order, so a callable seeding its own random state
            (e.g. from the batch number) stays deterministic. ``drop_remainder`` applies
            before it.

    Returns:
        mindspore.dataset.Dataset: columns ``image`` float32 (batch, 3, image_size,
        image_size) and ``label`` int32 (batch,), or as ``batch_transform`` returns.

    Raises:
        MissingFileError: If ``data_path`` is not a folder, holds no class folders, or the
            CIFAR-10 files are missing.
        ValueError: If ``dataset`` is unknown, ``batch_size`` is not positive, or an
            augmentation argument is invalid (as ``create_transforms``).
        ImageFolderError: Naming empty class folders, corrupt, truncated or macOS metadata
            files, or a short CIFAR-10 file.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
    if batch_transform is not None and not callable(batch_transform):
        raise ValueError(f"batch_transform must be callable, got {batch_transform!r}")
    check_augment_args(auto_augment, randaugment_num_ops, randaugment_magnitude, random_erasing)
    if dataset not in DATASET_READERS:
        raise ValueError(f"unknown dataset {dataset!r}; valid: {', '.join(DATASET_READERS)}")
    if not os.path.isdir(data_path):
        raise MissingFileError(f"data_path {data_path!r} is not a folder")
    shuffle = is_training if shuffle is None else shuffle
    num_parallel_workers = max(1, min(num_parallel_workers, os.cpu_count() or 1))
    drop_remainder = is_training if drop_remainder is None else drop_remainder
    source, decoded = DATASET_READERS[dataset](
        data_path, is_training, check_images, shuffle=shuffle,
        num_parallel_workers=num_parallel_workers, num_shards=num_shards, shard_id=shard_id)
    image_ops = create_transforms(is_training, image_size, eval_resize, decoded, crop_scale,
                                  auto_augment, randaugment_num_ops, randaugment_magnitude,
                                  random_erasing)
    data = source.map(operations=image_ops, input_columns="image",
                      num_parallel_workers=num_parallel_workers)
    data = data.map(operations=transforms.TypeCast(ms.int32), input_columns="label",
                    num_parallel_workers=num_parallel_workers)
    if is_training and batch_transform is not None:
        return data.batch(batch_size, drop_remainder=drop_remainder,
                          per_batch_map=StackedBatchMap(batch_transform),
                          input_columns=["image", "label"], output_columns=["image", "label"],
                          num_parallel_workers=1)
    return data.batch(batch_size, drop_remainder=drop_remainder)


class StackedBatchMap:
    """``per_batch_map`` adapter: MindSpore hands each column over as a list of per-image
    arrays; ``batch_transform`` gets them stacked.

    Args:
        batch_transform (callable): ``f(images, labels, batch_info) -> (images, targets)``
            with numpy ``images`` float32 (N, 3, H, W) and ``labels`` int32 (N,); it may
            return arrays (batched as they are) or lists of per-image arrays.
    """

    def __init__(self, batch_transform):
        self.batch_transform = batch_transform

    def __call__(self, images, labels, batch_info):
        images, targets = self.batch_transform(np.stack(images), np.stack(labels), batch_info)
        return images, targets


def count_images(data_path, is_training, dataset="imagefolder"):
    """Number of images a (train or eval) split holds, without decoding any.

    Raises:
        MissingFileError: As ``create_dataset``.
    """
    if not os.path.isdir(data_path):
        raise MissingFileError(f"data_path {data_path!r} is not a folder")
    source, _ = DATASET_READERS[dataset](data_path, is_training, False, shuffle=False)
    return source.get_dataset_size()


def _image_folder(data_path, is_training, check_images, **kwargs):
    del is_training  # the same folder layout serves train and eval
    check_image_folder(data_path, check_content=check_images)
    return ds.ImageFolderDataset(data_path, extensions=IMAGE_EXTENSIONS, **kwargs), False


def _cifar10_binary(data_path, is_training, check_images, **kwargs):
    del check_images  # fixed-size records: the file sizes are the check
    names = CIFAR10_TRAIN_FILES if is_training else CIFAR10_TEST_FILES
    missing = [n for n in names if not os.path.isfile(os.path.join(data_path, n))]
    if missing:
        raise MissingFileError(f"CIFAR-10 binary folder {data_path!r} lacks {missing}")
    expected = CIFAR10_RECORDS_PER_FILE * CIFAR10_RECORD_BYTES
    sizes = {n: os.path.getsize(os.path.join(data_path, n)) for n in names}
    short = [f"{n} ({size} bytes)" for n, size in sizes.items() if size != expected]
    if short:
        raise ImageFolderError(f"CIFAR-10 binary folder {data_path!r}: {', '.join(short)}; each file "
                         f"must hold {CIFAR10_RECORDS_PER_FILE} records of {CIFAR10_RECORD_BYTES}"
                         f" bytes ({expected} bytes)")
    usage = "train" if is_training else "test"
    return ds.Cifar10Dataset(data_path, usage=usage, **kwargs), True


DATASET_READERS = {"imagefolder": _image_folder, "cifar10": _cifar10_binary}


def class_names_of(data_path):
    """Class names of an ImageFolder root, in label order (sorted sub-folder names)."""
    return check_image_folder(data_path, check_content=False)


# ---------------------------------------------------------------- training augmentations
# TrivialAugment and RandAugment are built from MindSpore's single C++ ops, not taken from
# ``vision.TrivialAugmentWide`` / ``vision.RandAugment``: in MindSpore 2.10 those translate by
# whole image widths (TranslateX/Y by m pixels blanks the image: about 1 in 8 TrivialAugment
# images comes out all black), shear by tan(m) about the center and draw ops and signs with
# a bias. Details and measurements: docs/augmentations.md.

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
