"""Image classification input pipelines on ``mindspore.dataset``.

Factories in the style of MindCV: ``create_transforms`` builds the per-image ops,
``create_dataset`` the source, the maps and the batching.

- ``imagefolder``: ``ImageFolderDataset``, one sub-folder per class (ImageNet train/val
  layout; also CIFAR-10 stored as JPEG class folders). Labels are the indices of the
  class folders in sorted order.
- ``cifar10``: ``Cifar10Dataset`` over the binary release (``data_batch_1..5.bin`` for
  training, ``test_batch.bin`` for eval); its uint32 labels are cast to int32.

Output columns: ``image`` float32 (N, 3, image_size, image_size), normalized with the
ImageNet mean/std from pixels in [0, 255]; ``label`` int32 (N,).
"""
import os

import mindspore as ms
import mindspore.dataset as ds
import mindspore.dataset.transforms as transforms
import mindspore.dataset.vision as vision

from src.errors import MissingFileError
from src.image_check import IMAGE_EXTENSIONS, ImageFolderError, check_image_folder

# ImageNet mean / std of torchvision and NVIDIA, in units of 0-255 pixel values.
IMAGENET_MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
IMAGENET_STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]
CIFAR10_TRAIN_FILES = [f"data_batch_{i}.bin" for i in range(1, 6)]
CIFAR10_TEST_FILES = ["test_batch.bin"]
CIFAR10_RECORDS_PER_FILE = 10000
CIFAR10_RECORD_BYTES = 1 + 32 * 32 * 3  # label byte + 3 colour planes


def create_transforms(is_training, image_size=224, eval_resize=256, decoded=False,
                      crop_scale=(0.08, 1.0)):
    """Per-image transforms of the ResNet recipe (torchvision / NVIDIA ImageNet).

    Train: random resized crop (area ``crop_scale``, default 0.08-1, aspect ratio 3/4-4/3,
    bilinear) fused with
    the JPEG decode (OpenCV, C++), random horizontal flip, normalize, HWC -> CHW.
    Eval: decode to a PIL image, resize the shorter side to ``eval_resize`` with PIL's
    antialiased bilinear filter, center crop ``image_size``, normalize, HWC -> CHW: the same
    pixels as torchvision's ``Resize(256)``/``CenterCrop(224)`` on PIL images (OpenCV's bilinear
    resize has no antialiasing and differs by 3.7 of 255 on average). Greyscale and CMYK
    JPEGs decode to 3-channel RGB.

    Args:
        is_training (bool): Training (random) or eval (deterministic) transforms.
        image_size (int): Output height and width, pixels.
        eval_resize (int): Eval only: shorter side before the center crop, pixels.
        decoded (bool): Input is already a decoded HWC uint8 image (CIFAR-10 binary), not
            encoded bytes.
        crop_scale (tuple(float, float)): Train only: random crop area range, as a fraction
            of the image area.

    Returns:
        list: MindSpore vision transforms, input encoded bytes (or uint8 HWC RGB),
        output float32 CHW. Apply them in a pipeline (``Dataset.map``) or one by one.
    """
    normalize = [vision.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD), vision.HWC2CHW()]
    if is_training:
        crop_args = dict(scale=tuple(crop_scale), ratio=(3.0 / 4.0, 4.0 / 3.0))
        crop = (vision.RandomResizedCrop(image_size, **crop_args) if decoded
                else vision.RandomCropDecodeResize(image_size, **crop_args))
        return [crop, vision.RandomHorizontalFlip(prob=0.5)] + normalize
    to_pil = vision.ToPIL() if decoded else vision.Decode(to_pil=True)
    return [to_pil, vision.Resize(eval_resize, vision.Inter.BILINEAR),
            vision.CenterCrop(image_size), vision.ToNumpy()] + normalize


def create_dataset(data_path, is_training, dataset="imagefolder", batch_size=32,
                   image_size=224, eval_resize=256, crop_scale=(0.08, 1.0), num_parallel_workers=4,
                   num_shards=None, shard_id=None, drop_remainder=None, shuffle=None,
                   check_images=True):
    """Build a batched classification dataset.

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

    Returns:
        mindspore.dataset.Dataset: columns ``image`` float32 (batch, 3, image_size,
        image_size) and ``label`` int32 (batch,).

    Raises:
        MissingFileError: If ``data_path`` is not a folder, holds no class folders, or the
            CIFAR-10 files are missing.
        ValueError: If ``dataset`` is unknown or ``batch_size`` is not positive.
        ImageFolderError: Naming empty class folders, corrupt, truncated or macOS metadata
            files, or a short CIFAR-10 file.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
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
    image_ops = create_transforms(is_training, image_size, eval_resize, decoded, crop_scale)
    data = source.map(operations=image_ops, input_columns="image",
                      num_parallel_workers=num_parallel_workers)
    data = data.map(operations=transforms.TypeCast(ms.int32), input_columns="label",
                    num_parallel_workers=num_parallel_workers)
    return data.batch(batch_size, drop_remainder=drop_remainder)


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
