"""What a pipeline does to each image, as one object per use: ``TrainAugment`` (training
crop, flip and augmentations) and ``EvalPreprocess`` (eval resize and crop, also predict's
reader, int8 calibration and the exported ``config.json``), plus ``Sampling`` (which images,
in which order, on which shard). ``src.recipe`` builds them from the config. Both check
their values when made. See docs/data.md#data-settings."""
from collections.abc import Sequence
from dataclasses import dataclass

from src.data.augment import check_augment_args
from src.utils.image_constants import IMAGENET_MEAN, IMAGENET_STD, INTERPOLATIONS


@dataclass(frozen=True, kw_only=True)
class EvalPreprocess:
    """Eval preprocessing: decode, resize the shorter side, center crop, normalize.

    Attributes:
        image_size: Center crop side, pixels (``eval_image_size``).
        resize: Shorter side before the crop, pixels (``eval_resize``).
        interpolation: Resize filter, one of ``INTERPOLATIONS`` (``eval_interpolation``).
        exif_transpose: Turn images upright by their EXIF Orientation tag first.
        mean, std: Normalization per RGB channel, for pixels in [0, 1].

    Raises:
        ValueError: If ``interpolation`` is not in ``INTERPOLATIONS``.
    """

    image_size: int = 224
    resize: int = 256
    interpolation: str = "bilinear"
    exif_transpose: bool = False
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self):
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"eval interpolation must be one of {', '.join(INTERPOLATIONS)}, "
                             f"got {self.interpolation!r}")


@dataclass(frozen=True, kw_only=True)
class TrainAugment:
    """Training preprocessing: random resized crop, flip, ``auto_augment``, normalize, random
    erasing (docs/augmentations.md).

    Attributes:
        image_size: Crop side, pixels (``train_image_size``).
        crop_scale: Crop area range, fraction of the image.
        auto_augment: Per-image policy (``src.data.augment.AUTO_AUGMENT_POLICIES``).
        randaugment_num_ops, randaugment_magnitude: ``randaugment`` only.
        random_erasing: Erasing probability; 0 adds no op.
        aug_repeats: Reads of each drawn image per epoch (repeated augmentation); 0 or 1 off.
        exif_transpose: Turn images upright by their EXIF Orientation tag first.
        mean, std: Normalization per RGB channel, for pixels in [0, 1].

    Raises:
        ValueError: As ``check_augment_args``, or for a negative ``aug_repeats``.
    """

    image_size: int = 224
    crop_scale: tuple[float, float] = (0.08, 1.0)
    auto_augment: str = "none"
    randaugment_num_ops: int = 2
    randaugment_magnitude: int = 9
    random_erasing: float = 0.0
    aug_repeats: int = 0
    exif_transpose: bool = False
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self):
        check_augment_args(self.auto_augment, self.randaugment_num_ops,
                           self.randaugment_magnitude, self.random_erasing)
        if self.aug_repeats < 0:
            raise ValueError(f"aug_repeats must be 0 or more, got {self.aug_repeats}")


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """Which images a pipeline reads and in which order (``create_dataset``).

    Attributes:
        indices: ``imagefolder`` only: positions in the reader's order
            (``image_folder_files``) to read; None: every image.
        balance_classes: Training, ``imagefolder`` only: draw classes equally often.
        num_shards, shard_id: Data-parallel shards and this device's one.
        shuffle, drop_remainder: None: as ``is_training``.
    """

    indices: Sequence[int] | None = None
    balance_classes: bool = False
    num_shards: int | None = None
    shard_id: int | None = None
    shuffle: bool | None = None
    drop_remainder: bool | None = None
