"""Per-image transforms of the ResNet recipe: random resized crop and flip for training, resize
and center crop for evaluation, ImageNet normalization (torchvision / NVIDIA ImageNet).

The training policies beyond crop and flip (TrivialAugment, RandAugment, AutoAugment, random
erasing) live in ``src.data.augment``; ``create_transforms`` puts them in torchvision's order.
"""
import io

import mindspore.dataset.vision as vision
import numpy as np
from PIL import Image, ImageOps

from src.data.augment import RandomErasing, auto_augment_ops, check_augment_args
from src.data.image_check import MAX_PIXELS_WORDS, too_many_pixels

# ImageNet mean / std of torchvision and NVIDIA, in units of 0-255 pixel values.
IMAGENET_MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
IMAGENET_STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


EVAL_INTERPOLATIONS = {"bilinear": vision.Inter.BILINEAR, "bicubic": vision.Inter.BICUBIC}
"""Eval resize filters: on the PIL images of the eval pipeline MindSpore's ``Resize`` applies
PIL's own (``Image.BILINEAR``, ``Image.BICUBIC``), the pixels torchvision and timm get."""

SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
"""Pillow modes of 16-bit greyscale images (PNG opens as ``I;16`` or ``I``)."""


def decode_rgb(data, exif_transpose=False):
    """Encoded image bytes -> a Pillow RGB image: Pillow's decode, as
    ``vision.Decode(to_pil=True)`` (torchvision's pixels for the eval resize), except that a
    16-bit greyscale image keeps the high byte of each pixel, as the training decoder
    (OpenCV) does: Pillow's own ``I;16`` -> RGB conversion clips every pixel to 255. Palette,
    LA, RGBA (alpha dropped) and CMYK images convert as in the training decoder already.

    Args:
        data (numpy.ndarray or bytes): The encoded file (uint8).
        exif_transpose (bool): Turn the image upright by its EXIF Orientation tag (Pillow's
            ``ImageOps.exif_transpose``: the image as a photo viewer shows it; height and
            width swap for orientations 5-8). False: the stored pixels, the tag ignored (as
            MindSpore's decoders, torchvision's ``ImageFolder`` and timm read them).

    Returns:
        PIL.Image.Image: RGB, 8 bits per channel.

    Raises:
        ValueError: If the image has more pixels than the limit (``set_max_image_pixels``;
            the message says so) or cannot be decoded.
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
    """``vision.Decode(to_pil=True)`` decoding with ``decode_rgb``: a MindSpore op of the
    Python (PIL) implementation, so the ops after it in a pipeline stay on PIL images (the
    eval resize is PIL's antialiased one; a plain Python function would hand them a numpy
    array and OpenCV would resize instead).

    Args:
        exif_transpose (bool): As ``decode_rgb``'s.
    """

    def __init__(self, exif_transpose=False):
        super().__init__(to_pil=True)
        self.exif_transpose = exif_transpose

    def _execute_py(self, img):
        return decode_rgb(img, self.exif_transpose)


def create_transforms(is_training, image_size=224, eval_resize=256, decoded=False,
                      crop_scale=(0.08, 1.0), auto_augment="none", randaugment_num_ops=2,
                      randaugment_magnitude=9, random_erasing=0.0, interpolation="bilinear",
                      exif_transpose=False):
    """Per-image transforms of the ResNet recipe (torchvision / NVIDIA ImageNet).

    Train: random resized crop (area ``crop_scale``, default 0.08-1, aspect ratio 3/4-4/3,
    bilinear) fused with the JPEG decode (OpenCV, C++), random horizontal flip, the
    ``auto_augment`` policy (on the uint8 HWC RGB crop, pixels 0-255), normalize, HWC -> CHW,
    then random erasing (on the normalized float32 CHW tensor): torchvision's order in its
    reference recipe (``references/classification/presets.py``).
    Eval: decode to a PIL image, resize the shorter side to ``eval_resize`` with PIL's
    antialiased bilinear (or bicubic: ``interpolation``) filter, center crop ``image_size``,
    normalize, HWC -> CHW: the same pixels as torchvision's ``Resize(256)``/``CenterCrop(224)``
    on PIL images (OpenCV's bilinear
    resize has no antialiasing and differs by 3.7 of 255 on average). Greyscale, CMYK,
    palette, 16-bit and alpha images decode to 8-bit RGB, the same pixels as in training
    (``decode_rgb``). The augmentation arguments are checked but ignored for eval.
    With ``exif_transpose`` both turn the image upright by its EXIF Orientation first: eval in
    its PIL decode, training by decoding with PIL too (``DecodeRGB``: MindSpore's C++ decoders
    do not read EXIF) and then ``RandomResizedCrop`` on the decoded image, the same crop
    draws and bilinear resize as the fused op, which stays the path without it (the pixels
    differ along the crop's edges, where the fused op's decode of the crop alone upsamples
    the chroma without its neighbours).

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
        interpolation (str): Eval only: the resize filter, ``bilinear`` (torchvision's
            weights) or ``bicubic`` (timm's): PIL's, as ``torchvision.transforms.Resize`` on
            PIL images applies it.
        exif_transpose (bool): Train and eval of encoded images: turn each image upright by
            its EXIF Orientation tag (``decode_rgb``); ignored for ``decoded`` input, which
            carries no EXIF.

    Returns:
        list: MindSpore transforms (and ``RandomErasing``, a Python callable), input encoded
        bytes (or uint8 HWC RGB), output float32 CHW. Apply them in a pipeline
        (``Dataset.map``) or one by one.

    Raises:
        ValueError: If ``auto_augment`` is unknown (lists the valid names), the RandAugment
            arguments are out of range, ``random_erasing`` is not in [0, 1], or
            ``interpolation`` is not in ``EVAL_INTERPOLATIONS``.
    """
    check_augment_args(auto_augment, randaugment_num_ops, randaugment_magnitude, random_erasing)
    if interpolation not in EVAL_INTERPOLATIONS:
        raise ValueError(f"eval interpolation must be one of {', '.join(EVAL_INTERPOLATIONS)}, "
                         f"got {interpolation!r}")
    normalize = [vision.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD), vision.HWC2CHW()]
    if is_training:
        crop_args = dict(scale=tuple(crop_scale), ratio=(3.0 / 4.0, 4.0 / 3.0))
        if decoded:
            crop = [vision.RandomResizedCrop(image_size, **crop_args)]
        elif exif_transpose:
            crop = [DecodeRGB(exif_transpose=True), vision.ToNumpy(),
                    vision.RandomResizedCrop(image_size, **crop_args)]
        else:
            crop = [vision.RandomCropDecodeResize(image_size, **crop_args)]
        policy = auto_augment_ops(auto_augment, image_size, randaugment_num_ops,
                                  randaugment_magnitude)
        erasing = [RandomErasing(random_erasing)] if random_erasing > 0 else []
        return crop + [vision.RandomHorizontalFlip(prob=0.5)] + policy + normalize + erasing
    to_pil = vision.ToPIL() if decoded else DecodeRGB(exif_transpose)
    return [to_pil, vision.Resize(eval_resize, EVAL_INTERPOLATIONS[interpolation]),
            vision.CenterCrop(image_size), vision.ToNumpy()] + normalize
