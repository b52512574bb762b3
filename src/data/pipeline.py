"""Image classification input pipelines on ``mindspore.dataset``.

Factory in the style of MindCV: ``create_dataset`` builds the source, the maps and the
batching (the per-image ops come from ``create_transforms``).

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
here from MindSpore's single ops: docs/augmentations.md. The per-image ops are
``src.data.transforms``, the augmentation policies ``src.data.augment``.
"""
import os

import mindspore as ms
import mindspore.dataset as ds
import mindspore.dataset.transforms as transforms
import numpy as np

from src.data.augment import check_augment_args
from src.data.image_check import (
    IMAGE_EXTENSIONS,
    ImageFolderError,
    check_image_folder,
    list_folder,
)
from src.data.sampling import EpochSampler, balanced_sample_weights
from src.data.transforms import create_transforms
from src.utils.errors import MissingFileError

CIFAR10_TRAIN_FILES = [f"data_batch_{i}.bin" for i in range(1, 6)]
CIFAR10_TEST_FILES = ["test_batch.bin"]
CIFAR10_RECORDS_PER_FILE = 10000
CIFAR10_RECORD_BYTES = 1 + 32 * 32 * 3  # label byte + 3 colour planes
_LISTINGS = {}  # class-folder root as given -> (folder_signature, image_folder_files)


def create_dataset(data_path, is_training, dataset="imagefolder", batch_size=32,
                   image_size=224, eval_resize=256, crop_scale=(0.08, 1.0), num_parallel_workers=4,
                   num_shards=None, shard_id=None, drop_remainder=None, shuffle=None,
                   check_images=True, auto_augment="none", randaugment_num_ops=2,
                   randaugment_magnitude=9, random_erasing=0.0, batch_transform=None,
                   indices=None, balance_classes=False, eval_interpolation="bilinear",
                   aug_repeats=0, exif_transpose=False):
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
            (``src.data.image_check``); the folder layout is always checked.
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
        indices (array-like, optional): ``imagefolder`` only: read just these positions of
            the folder's files in the reader's order (``image_folder_files``), e.g. one part
            of a ``src.data.split`` split; training permutes them anew every epoch, eval reads
            them in order. None: every image.
        balance_classes (bool): Training, ``imagefolder`` only: each epoch draws as many
            images as it holds (``indices``, or all), with replacement, each with probability
            proportional to 1 / (images of its class among them): every class equally often
            in expectation (``class_balance sampler``).
        eval_interpolation (str): Eval only: the resize filter, as ``create_transforms``'s
            ``interpolation``.
        aug_repeats (int): Training only: repeated augmentation (timm's
            ``num_aug_repeats``): each image drawn is read this many times in a row, over
            the shards, each copy augmented on its own, every shard's epoch as long as
            without repeats (``EpochSampler``'s ``repeats``); 0 or 1 = off. Any dataset.
        exif_transpose (bool): ``imagefolder``, train and eval: turn each image upright by its
            EXIF Orientation tag before the crop (``create_transforms``); the training decode
            is then Pillow's instead of the fused crop-decode. The CIFAR-10 binary records
            carry no EXIF: no effect there.

    With ``indices``, ``balance_classes`` or ``aug_repeats`` the rows come from
    ``src.data.sampling.EpochSampler``, seeded with the dataset seed
    (``mindspore.dataset.config.get_seed()``) when the pipeline is built: pass ``e`` of the
    pipeline is a function of that seed and ``e`` alone, sharded as ``DistributedSampler``
    shards (``num_shards``, ``shard_id``). Without them, MindSpore's own samplers
    (``shuffle``, ``num_shards``, ``shard_id``).

    Returns:
        mindspore.dataset.Dataset: columns ``image`` float32 (batch, 3, image_size,
        image_size) and ``label`` int32 (batch,), or as ``batch_transform`` returns.

    Raises:
        MissingFileError: If ``data_path`` is not a folder, holds no class folders, or the
            CIFAR-10 files are missing.
        ValueError: If ``dataset`` is unknown, ``batch_size`` is not positive, an
            augmentation argument is invalid (as ``create_transforms``), or ``indices`` /
            ``balance_classes`` are given for ``cifar10`` or ``indices`` is empty or outside
            the folder's images, or ``aug_repeats`` is negative.
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
    sampling = dict(shuffle=shuffle, num_shards=num_shards, shard_id=shard_id)
    if aug_repeats < 0:
        raise ValueError(f"aug_repeats must be 0 or more, got {aug_repeats}")
    repeats = aug_repeats if is_training else 0
    if indices is not None or (balance_classes and is_training):
        if dataset != "imagefolder":
            raise ValueError(f"indices and balance_classes need dataset imagefolder, got "
                             f"{dataset!r}")
        check_image_folder(data_path, check_content=check_images)
        sampling = dict(sampler=folder_sampler(
            data_path, indices, shuffle, balance_classes and is_training, num_shards, shard_id,
            repeats))
    elif repeats > 1:
        rows = np.arange(count_images(data_path, is_training, dataset))
        sampling = dict(sampler=EpochSampler(rows, seed=ds.config.get_seed(), shuffle=shuffle,
                                             num_shards=num_shards, shard_id=shard_id,
                                             repeats=repeats))
    source, decoded = DATASET_READERS[dataset](
        data_path, is_training, check_images, num_parallel_workers=num_parallel_workers,
        **sampling)
    image_ops = create_transforms(is_training, image_size, eval_resize, decoded, crop_scale,
                                  auto_augment, randaugment_num_ops, randaugment_magnitude,
                                  random_erasing, eval_interpolation, exif_transpose)
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


def count_images(data_path, is_training, dataset="imagefolder", indices=None):
    """Number of images a (train or eval) split holds, without decoding any: those of
    ``indices`` if given (as ``create_dataset``).

    Raises:
        MissingFileError: As ``create_dataset``.
    """
    if not os.path.isdir(data_path):
        raise MissingFileError(f"data_path {data_path!r} is not a folder")
    if indices is not None:
        return len(indices)
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
        raise ImageFolderError(f"CIFAR-10 binary folder {data_path!r}: {', '.join(short)}; each "
                               f"file must hold {CIFAR10_RECORDS_PER_FILE} records of "
                               f"{CIFAR10_RECORD_BYTES} bytes ({expected} bytes)")
    usage = "train" if is_training else "test"
    return ds.Cifar10Dataset(data_path, usage=usage, **kwargs), True


DATASET_READERS = {"imagefolder": _image_folder, "cifar10": _cifar10_binary}


def image_folder_files(data_path):
    """(path, label) of every image of a class-folder root in the order the eval pipeline
    reads them (``ImageFolderDataset`` without shuffling: class folders in label order, the
    files of each sorted by name, image extensions as ``IMAGE_EXTENSIONS``).

    Listed once per process while the folder is unchanged (``folder_signature``): a run
    reads the listing for its split, class counts, loss weights and every epoch's sampler.

    Returns:
        list[tuple[str, int]]: A new list (the caller may change it).
    """
    key = data_path  # as given: the paths listed start with it
    signature = folder_signature(data_path)
    cached = _LISTINGS.get(key)
    if cached is None or cached[0] != signature:
        files = []
        for label, name in enumerate(class_names_of(data_path)):
            folder = os.path.join(data_path, name)
            files += [(os.path.join(folder, f), label) for f in list_folder(folder).images]
        cached = _LISTINGS[key] = (signature, files)
    return list(cached[1])


def folder_signature(data_path):
    """What changes when files of a class-folder root are added, removed or renamed: the
    modification times of the root and of each class folder (nanoseconds)."""
    return tuple((name, os.stat(os.path.join(data_path, name)).st_mtime_ns)
                 for name in [""] + class_names_of(data_path))


def folder_sampler(data_path, indices, shuffle, balance_classes, num_shards, shard_id,
                   repeats=0):
    """The ``EpochSampler`` of ``create_dataset`` over a class folder: ``indices`` (all
    images if None), shuffled, or drawn class-balanced (weights ``balanced_sample_weights``
    of their labels), each read ``repeats`` times (0 or 1: once), seeded with the dataset
    seed now.

    Raises:
        ValueError: If ``indices`` is empty or names no image of the folder.
    """
    files = image_folder_files(data_path)
    indices = np.arange(len(files)) if indices is None else np.asarray(indices, np.int64)
    if not len(indices) or indices.min() < 0 or indices.max() >= len(files):
        raise ValueError(f"indices must be a non-empty list of positions in [0, {len(files)}) "
                         f"(the images of {data_path})")
    weights = None
    if balance_classes:
        labels = np.array([label for _, label in files], np.int64)[indices]
        weights = balanced_sample_weights(labels)
    return EpochSampler(indices, seed=ds.config.get_seed(), shuffle=shuffle, weights=weights,
                        num_shards=num_shards, shard_id=shard_id, repeats=repeats)


def class_names_of(data_path):
    """Class names of an ImageFolder root, in label order (sorted sub-folder names)."""
    return check_image_folder(data_path, check_content=False)
