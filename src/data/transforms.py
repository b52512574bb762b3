"""Per-image ops of the ResNet recipe (torchvision / NVIDIA ImageNet): random resized crop and
flip for training, resize and center crop for eval, normalization; the augmentation policies
come from ``src.data.augment``. See docs/data.md#preprocessing.
"""
import io

import mindspore.dataset.vision as vision
import numpy as np
from PIL import Image, ImageOps

from src.data.augment import RandomErasing, auto_augment_ops
from src.data.image_check import MAX_PIXELS_WORDS, pillow_notes_silenced, too_many_pixels
from src.data.settings import EvalPreprocess, TrainAugment
from src.utils import image_constants

# ImageNet mean / std in 0-255 pixel units (vision.Normalize's)
IMAGENET_MEAN = [m * 255 for m in image_constants.IMAGENET_MEAN]
IMAGENET_STD = [s * 255 for s in image_constants.IMAGENET_STD]
# eval resize filter -> MindSpore's (on PIL images Resize applies PIL's own)
EVAL_INTERPOLATIONS = {name: vision.Inter[name.upper()]
                       for name in image_constants.INTERPOLATIONS}
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")  # Pillow's 16-bit greyscale


@pillow_notes_silenced()
def decode_rgb(data: np.ndarray | bytes, exif_transpose: bool = False) -> Image.Image:
    """Encoded image bytes -> an 8-bit RGB Pillow image: Pillow's decode, 16-bit greyscale by
    each pixel's high byte as the training decoder (docs/data.md#preprocessing);
    ``exif_transpose``: turned upright by its EXIF Orientation tag first.

    Raises:
        ValueError: If the image has more pixels than the limit (``set_max_image_pixels``)
            or cannot be decoded.
    """
    try:
        image = Image.open(io.BytesIO(data))
        size = too_many_pixels(image)
        if size:
            raise ValueError(f"{size} pixels: {MAX_PIXELS_WORDS} {Image.MAX_IMAGE_PIXELS}")
        if exif_transpose:  # before the 16-bit conversion, which drops the EXIF
            ImageOps.exif_transpose(image, in_place=True)
        if image.mode in SIXTEEN_BIT_MODES:
            image = Image.fromarray((np.asarray(image).astype(np.uint32) >> 8).astype(np.uint8))
        return image.convert("RGB")
    except Image.DecompressionBombError as err:
        raise ValueError(f"{MAX_PIXELS_WORDS} {Image.MAX_IMAGE_PIXELS}: {err}") from err
    except OSError as err:
        raise ValueError(f"cannot decode the image: {err}") from err


class DecodeRGB(vision.Decode):
    """``vision.Decode(to_pil=True)`` by ``decode_rgb``: a Python-implementation op, so the ops
    after it stay on PIL images (PIL's antialiased resize, not OpenCV's)."""

    def __init__(self, exif_transpose: bool = False):
        super().__init__(to_pil=True)
        self.exif_transpose = exif_transpose

    def _execute_py(self, img):
        return decode_rgb(img, self.exif_transpose)


def create_transforms(settings: TrainAugment | EvalPreprocess, decoded: bool = False) -> list:
    """Per-image ops: training (``TrainAugment``: crop, flip, policy, normalize, erasing) or
    eval (``EvalPreprocess``: PIL decode, resize, center crop, normalize), in torchvision's
    order (docs/data.md#preprocessing). Input encoded bytes, or decoded uint8 HWC RGB with
    ``decoded`` (CIFAR-10 binary: no EXIF); output float32 CHW.
    """
    normalize = [vision.Normalize(mean=[m * 255 for m in settings.mean],
                                  std=[s * 255 for s in settings.std]), vision.HWC2CHW()]
    size = settings.image_size
    if isinstance(settings, TrainAugment):
        crop_args = dict(scale=tuple(settings.crop_scale), ratio=(3.0 / 4.0, 4.0 / 3.0))
        if decoded:
            crop = [vision.RandomResizedCrop(size, **crop_args)]
        elif settings.exif_transpose:
            crop = [DecodeRGB(exif_transpose=True), vision.ToNumpy(),
                    vision.RandomResizedCrop(size, **crop_args)]
        else:
            crop = [vision.RandomCropDecodeResize(size, **crop_args)]
        policy = auto_augment_ops(settings.auto_augment, size, settings.randaugment_num_ops,
                                  settings.randaugment_magnitude)
        erasing = [RandomErasing(settings.random_erasing)] if settings.random_erasing > 0 else []
        return crop + [vision.RandomHorizontalFlip(prob=0.5)] + policy + normalize + erasing
    to_pil = vision.ToPIL() if decoded else DecodeRGB(settings.exif_transpose)
    return [to_pil, vision.Resize(settings.resize, EVAL_INTERPOLATIONS[settings.interpolation]),
            vision.CenterCrop(size), vision.ToNumpy()] + normalize
