"""What a pipeline does, one frozen object per use, built by ``src.recipe`` from the config:
``TrainAugment``, ``EvalPreprocess`` (also predict's reader, int8 calibration, the exported
``config.json``) and ``Sampling``. See docs/data.md#data-settings.
"""
from collections.abc import Sequence
from dataclasses import dataclass

from src.data.augment import check_augment_args
from src.utils.image_constants import IMAGENET_MEAN, IMAGENET_STD, INTERPOLATIONS


@dataclass(frozen=True, kw_only=True)
class EvalPreprocess:
    """Eval preprocessing (docs/data.md#preprocessing): decode (turned upright by EXIF with
    ``exif_transpose``), resize the shorter side to ``resize`` px with ``interpolation`` (one of
    ``INTERPOLATIONS``), center crop ``image_size`` px, normalize by ``mean``/``std`` of [0, 1]
    pixels. Raises ValueError for another ``interpolation``."""

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
    """Training preprocessing (docs/augmentations.md): random resized crop to ``image_size`` px
    (area ``crop_scale``), flip, the ``auto_augment`` policy, normalize, random erasing with
    probability ``random_erasing``; each image drawn read ``aug_repeats`` times (0, 1: once).
    Raises ValueError as ``check_augment_args``, or for a negative ``aug_repeats``."""

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
        object.__setattr__(self, "crop_scale", tuple(self.crop_scale))  # a config list too
        check_augment_args(self.auto_augment, self.randaugment_num_ops,
                           self.randaugment_magnitude, self.random_erasing)
        if self.aug_repeats < 0:
            raise ValueError(f"aug_repeats must be 0 or more, got {self.aug_repeats}")


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """Which images ``create_dataset`` reads and how: ``indices`` (``imagefolder``: positions in
    ``image_folder_files`` order; None: all), ``balance_classes`` (training), the shard, and
    ``shuffle`` / ``drop_remainder`` (None: as ``is_training``)."""

    indices: Sequence[int] | None = None
    balance_classes: bool = False
    num_shards: int | None = None
    shard_id: int | None = None
    shuffle: bool | None = None
    drop_remainder: bool | None = None
