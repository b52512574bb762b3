"""Batched classification pipelines on ``mindspore.dataset`` (MindCV-style
``create_dataset``): class folders (``ImageFolderDataset``) or the CIFAR-10 binary release
(``Cifar10Dataset``), or the rows of a multi-label table
(``GeneratorDataset``); per-image ops from ``src.data.transforms``. See docs/data.md.
"""
import os
from collections.abc import Callable, Sequence

import mindspore as ms
import mindspore.dataset as ds
import mindspore.dataset.transforms as transforms
import numpy as np

from src.data.image_check import (
    IMAGE_EXTENSIONS,
    ImageFolderError,
    check_image_folder,
    list_folder,
)
from src.data.multilabel import LabelTable
from src.data.sampling import EpochSampler, balanced_sample_weights
from src.data.settings import EvalPreprocess, Sampling, TrainAugment
from src.data.transforms import create_transforms
from src.utils.errors import MissingFileError

CIFAR10_TRAIN_FILES = [f"data_batch_{i}.bin" for i in range(1, 6)]
CIFAR10_TEST_FILES = ["test_batch.bin"]
CIFAR10_RECORDS_PER_FILE = 10000
CIFAR10_RECORD_BYTES = 1 + 32 * 32 * 3  # label byte + 3 colour planes
_LISTINGS = {}  # class-folder root as given -> (folder_signature, image_folder_files)


def create_dataset(data_path: str, settings: TrainAugment | EvalPreprocess, *,
                   dataset: str = "imagefolder", batch_size: int = 32,
                   sampling: Sampling | None = None, num_parallel_workers: int = 4,
                   check_images: bool = True,
                   batch_transform: Callable | None = None,
                   labels: LabelTable | None = None) -> ds.Dataset:
    """A batched classification dataset: ``image`` float32 (batch, 3, size, size) normalized,
    ``label`` int32 (batch,) (with ``labels``: float32 (batch, K) multi-hot), or as
    ``batch_transform`` returns.

    Args:
        data_path: Class-folder root, or folder of the CIFAR-10 ``.bin`` files (with
            ``labels``: the folder the table was read from; its ``paths`` are read).
        settings: ``TrainAugment`` (training: augmented, shuffled, last partial batch
            dropped) or ``EvalPreprocess`` (eval: in order, every image).
        dataset: ``imagefolder`` or ``cifar10`` (``DATASET_READERS``).
        batch_size: Images per batch on this device.
        sampling: Which images, order, shard (docs/data.md#sampling); None: all, in order.
        num_parallel_workers: Worker threads, capped at the CPU count.
        check_images: ``imagefolder``: check every file first (``src.data.image_check``).
        batch_transform: Training only: ``f(images, labels, batch_info) -> (images,
            targets)`` on numpy batches (mixup, CutMix).
        labels: Multi-label data: read the rows of this table (``src.data.multilabel``), not
            class folders; ``sampling.indices`` are row positions, eval reads them in order.

    Raises:
        MissingFileError: If ``data_path`` is not a folder or lacks the CIFAR-10 files.
        ValueError: For an unknown ``dataset``, ``batch_size`` < 1, a ``batch_transform``
            that is not callable, or ``indices`` / ``balance_classes`` with ``cifar10`` or
            outside the folder (the table), ``balance_classes`` with ``labels``.
        ImageFolderError: Naming bad class folders or files, or a short CIFAR-10 file.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
    if batch_transform is not None and not callable(batch_transform):
        raise ValueError(f"batch_transform must be callable, got {batch_transform!r}")
    if dataset not in DATASET_READERS:
        raise ValueError(f"unknown dataset {dataset!r}; valid: {', '.join(DATASET_READERS)}")
    if not os.path.isdir(data_path):
        raise MissingFileError(f"data_path {data_path!r} is not a folder")
    is_training = isinstance(settings, TrainAugment)
    sampling = sampling or Sampling()
    shuffle = is_training if sampling.shuffle is None else sampling.shuffle
    num_parallel_workers = max(1, min(num_parallel_workers, os.cpu_count() or 1))
    drop_remainder = is_training if sampling.drop_remainder is None else sampling.drop_remainder
    num_shards, shard_id = sampling.num_shards, sampling.shard_id
    reader_args = dict(shuffle=shuffle, num_shards=num_shards, shard_id=shard_id)
    repeats = settings.aug_repeats if is_training else 0
    balance_classes = sampling.balance_classes and is_training
    if labels is not None:
        source = table_source(labels, sampling, dataset=dataset, shuffle=shuffle,
                              repeats=repeats, num_parallel_workers=num_parallel_workers)
        data = source.map(operations=create_transforms(settings, False), input_columns="image",
                          num_parallel_workers=num_parallel_workers)
        return _batched(data, batch_size, drop_remainder,
                        batch_transform if is_training else None)
    if sampling.indices is not None or balance_classes:
        if dataset != "imagefolder":
            raise ValueError(f"indices and balance_classes need dataset imagefolder, got "
                             f"{dataset!r}")
        check_image_folder(data_path, check_content=check_images)
        reader_args = dict(sampler=folder_sampler(data_path, sampling, shuffle, balance_classes,
                                                  repeats))
    elif repeats > 1:
        rows = np.arange(count_images(data_path, is_training, dataset))
        reader_args = dict(sampler=EpochSampler(rows, seed=ds.config.get_seed(), shuffle=shuffle,
                                                num_shards=num_shards, shard_id=shard_id,
                                                repeats=repeats))
    source, decoded = DATASET_READERS[dataset](
        data_path, is_training, check_images, num_parallel_workers=num_parallel_workers,
        **reader_args)
    data = source.map(operations=create_transforms(settings, decoded), input_columns="image",
                      num_parallel_workers=num_parallel_workers)
    data = data.map(operations=transforms.TypeCast(ms.int32), input_columns="label",
                    num_parallel_workers=num_parallel_workers)
    return _batched(data, batch_size, drop_remainder, batch_transform if is_training else None)


def _batched(data, batch_size, drop_remainder, batch_transform):
    """``data`` batched, through ``batch_transform`` (one worker, in order) if given."""
    if batch_transform is not None:
        return data.batch(batch_size, drop_remainder=drop_remainder,
                          per_batch_map=StackedBatchMap(batch_transform),
                          input_columns=["image", "label"], output_columns=["image", "label"],
                          num_parallel_workers=1)
    return data.batch(batch_size, drop_remainder=drop_remainder)


class StackedBatchMap:
    """``per_batch_map`` adapter: hands ``batch_transform`` the per-image arrays MindSpore
    passes as lists stacked into (N, ...) arrays."""

    def __init__(self, batch_transform: Callable):
        self.batch_transform = batch_transform

    def __call__(self, images, labels, batch_info):
        images, targets = self.batch_transform(np.stack(images), np.stack(labels), batch_info)
        return images, targets


def count_images(data_path: str, is_training: bool, dataset: str = "imagefolder",
                 indices: Sequence[int] | None = None, *,
                 labels: LabelTable | None = None) -> int:
    """Images of a (train or eval) split, the rows of ``labels``, or ``len(indices)``, without
    decoding any.

    Raises:
        MissingFileError: As ``create_dataset``.
    """
    if not os.path.isdir(data_path):
        raise MissingFileError(f"data_path {data_path!r} is not a folder")
    if indices is not None:
        return len(indices)
    if labels is not None:
        return len(labels.files)
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


def image_folder_files(data_path: str) -> list[tuple[str, int]]:
    """(path, label) of every image of a class-folder root in the eval reader's order (class
    folders in label order, files sorted by name); a new list, listed once per process while
    the folder is unchanged (``folder_signature``)."""
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


def folder_signature(data_path: str) -> tuple[tuple[str, int], ...]:
    """What changes when files of a class-folder root are added, removed or renamed: the
    modification times of the root and of each class folder (nanoseconds)."""
    return tuple((name, os.stat(os.path.join(data_path, name)).st_mtime_ns)
                 for name in [""] + class_names_of(data_path))


def folder_sampler(data_path: str, sampling: Sampling, shuffle: bool, balance_classes: bool,
                   repeats: int = 0) -> EpochSampler:
    """``create_dataset``'s ``EpochSampler`` over a class folder's ``sampling.indices`` (None:
    all) on its shard, shuffled or class-balanced, each read ``repeats`` times, seeded with
    the dataset seed.

    Raises:
        ValueError: If ``indices`` is empty or names no image of the folder.
    """
    files = image_folder_files(data_path)
    indices = sampled_rows(sampling, len(files), f"the images of {data_path}")
    weights = None
    if balance_classes:
        labels = np.array([label for _, label in files], np.int64)[indices]
        weights = balanced_sample_weights(labels)
    return EpochSampler(indices, seed=ds.config.get_seed(), shuffle=shuffle, weights=weights,
                        num_shards=sampling.num_shards, shard_id=sampling.shard_id,
                        repeats=repeats)


def sampled_rows(sampling: Sampling, count: int, what: str) -> np.ndarray:
    """int64 ``sampling.indices``, or every position of ``count`` rows when None.

    Raises:
        ValueError: If ``indices`` is empty or outside [0, count) (``what`` names the rows).
    """
    indices = (np.arange(count) if sampling.indices is None
               else np.asarray(sampling.indices, np.int64))
    if not len(indices) or indices.min() < 0 or indices.max() >= count:
        raise ValueError(f"indices must be a non-empty list of positions in [0, {count}) "
                         f"({what})")
    return indices


class TableRows:
    """Random-access source of a ``LabelTable``'s rows for ``GeneratorDataset``: row i is
    (the file's bytes uint8 (size,), its multi-hot target float32 (K,))."""

    def __init__(self, labels: LabelTable):
        self.paths = list(labels.paths)
        self.targets = np.asarray(labels.targets, np.float32)

    def __getitem__(self, i):
        return np.fromfile(self.paths[i], dtype=np.uint8), self.targets[i]

    def __len__(self):
        return len(self.paths)


def table_source(labels: LabelTable, sampling: Sampling, *, dataset: str, shuffle: bool,
                 repeats: int, num_parallel_workers: int) -> ds.GeneratorDataset:
    """``create_dataset``'s unbatched ``image`` (encoded bytes), ``label`` (float32 (K,))
    source of a label table: an ``EpochSampler`` over ``sampling.indices`` (None: every row),
    sharded, shuffled or in row order, each row read ``repeats`` times.

    Raises:
        ValueError: For a ``dataset`` other than ``imagefolder``, ``balance_classes``, or
            ``indices`` outside the table.
    """
    if dataset != "imagefolder":
        raise ValueError(f"a label file needs dataset imagefolder (image files), got "
                         f"{dataset!r}")
    if sampling.balance_classes:
        raise ValueError("balance_classes (class_balance sampler) is not defined for "
                         "multi-label data (label_file): an image has several classes")
    rows = sampled_rows(sampling, len(labels.files), "the rows of the label file")
    sampler = EpochSampler(rows, seed=ds.config.get_seed(), shuffle=shuffle,
                           num_shards=sampling.num_shards, shard_id=sampling.shard_id,
                           repeats=repeats)
    return ds.GeneratorDataset(TableRows(labels), column_names=["image", "label"],
                               sampler=sampler, num_parallel_workers=num_parallel_workers,
                               python_multiprocessing=False)


def class_names_of(data_path: str) -> list[str]:
    """Class names of an ImageFolder root, in label order (sorted sub-folder names)."""
    return check_image_folder(data_path, check_content=False)
