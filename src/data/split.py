"""A stratified, deterministic validation split of one class-folder dataset (``val_split``):
per class, a permutation drawn from (seed, class name) holds out ``round(val_split * n)`` files
(at least 1); the parts are positions in the reader's file order, recorded in
``train_split.txt`` / ``val_split.txt``. See docs/data.md#one-folder-split-for-you-val_split.
"""
import hashlib
import os
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from src.data.pipeline import class_names_of, image_folder_files
from src.utils.config import ConfigError
from src.utils.errors import MissingFileError
from src.utils.files import atomic_write_text

TRAIN_SPLIT_FILE = "train_split.txt"
VAL_SPLIT_FILE = "val_split.txt"
SPLIT_STREAM = 1  # tags the split's random streams apart from the sampler's (sampling.py)


class FolderSplit(NamedTuple):
    """A class-folder dataset split: (path, label) of every image in the reader's order, and
    the ascending int64 positions into it of the training and the held-out part."""

    files: list[tuple[str, int]]
    train: np.ndarray
    val: np.ndarray

    def relative_paths(self, data_path: str, part: str) -> list[str]:
        """The ``/``-separated paths of ``part`` (``train`` or ``val``) relative to
        ``data_path``, in the reader's order."""
        return [relative_path(self.files[i][0], data_path) for i in getattr(self, part)]

    def train_labels(self) -> np.ndarray:
        """int64 labels of the training part, in the reader's order."""
        return np.array([self.files[i][1] for i in self.train], np.int64)


def relative_path(path: str, data_path: str) -> str:
    """``path`` relative to the class-folder root ``data_path``, with ``/`` separators."""
    return os.path.relpath(path, data_path).replace(os.sep, "/")


def class_stream(seed: int, class_name: str) -> np.random.Generator:
    """The generator of one class's split, from ``seed`` and a SHA-256 of the class name."""
    name_key = int.from_bytes(hashlib.sha256(class_name.encode("utf-8")).digest()[:8], "little")
    return np.random.default_rng([int(seed) % 2 ** 64, SPLIT_STREAM, name_key])


def stratified_split(labels: Sequence[int] | np.ndarray, val_split: float, seed: int,
                     class_names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Ascending int64 positions of the training and the held-out part of ``labels`` (in the
    reader's order), as the module docstring says.

    Raises:
        ConfigError: If ``val_split`` is outside (0, 1), or would leave a class with no
            training or no validation image (names the class and its image count).
    """
    if not 0 < val_split < 1:
        raise ConfigError(f"val_split must be in (0, 1) to split, got {val_split}")
    labels = np.asarray(labels, np.int64)
    train, val = [], []
    for label, name in enumerate(class_names):
        members = np.flatnonzero(labels == label)
        n = len(members)
        held = max(1, round(val_split * n))
        if n == 0 or held >= n:
            lacks = "validation" if n == 0 else "training"
            raise ConfigError(f"val_split {val_split} leaves class {name!r} ({n} image"
                              f"{'' if n == 1 else 's'}) with no {lacks} image: every class "
                              f"needs at least 2 images, one held out and one to train on; "
                              f"lower val_split, add images, or give eval_data_path instead")
        order = class_stream(seed, name).permutation(n)
        val.append(members[order[:held]])
        train.append(members[order[held:]])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


def split_image_folder(data_path: str, val_split: float, seed: int) -> FolderSplit:
    """The stratified split of a class-folder root (``stratified_split`` over its files).

    Raises:
        MissingFileError: If ``data_path`` is not a folder or holds no class folders.
        ConfigError: As ``stratified_split``.
    """
    files = image_folder_files(data_path)
    train, val = stratified_split([label for _, label in files], val_split, seed,
                                  class_names_of(data_path))
    return FolderSplit(files, train, val)


def write_split_files(output_dir: str, data_path: str, split: FolderSplit) -> tuple[str, str]:
    """Write the parts' paths relative to ``data_path``, one a line, atomically, as
    ``TRAIN_SPLIT_FILE`` and ``VAL_SPLIT_FILE`` in ``output_dir``; return their paths.

    Raises:
        WriteError: If a file cannot be written.
    """
    written = []
    for part, name in (("train", TRAIN_SPLIT_FILE), ("val", VAL_SPLIT_FILE)):
        path = os.path.join(output_dir, name)
        atomic_write_text(path, "".join(f"{p}\n" for p in split.relative_paths(data_path, part)))
        written.append(path)
    return tuple(written)


def read_split_file(split_file: str, data_path: str, key: str = "split_file", *,
                    listed: list[str] | None = None) -> np.ndarray:
    """Ascending int64 positions into ``image_folder_files(data_path)`` (or ``listed``: the
    paths of a label file's rows) of the images a split file (``write_split_files``) lists;
    ``key`` names the file in messages.

    Raises:
        MissingFileError: If ``split_file`` does not exist.
        ConfigError: If it lists no image, a path twice, or paths that are no image of
            ``data_path`` (names the first few and their count).
    """
    if not os.path.isfile(split_file):
        raise MissingFileError(f"{key} {split_file!r} does not exist")
    try:
        with open(split_file, encoding="utf-8") as f:
            lines = [line.strip() for line in f if line.strip()]
    except UnicodeDecodeError as err:
        raise ConfigError(f"{key} {split_file}: not UTF-8 text ({err.reason})") from err
    if not lines:
        raise ConfigError(f"{key} {split_file} lists no image")
    paths = listed if listed is not None else [path for path, _ in image_folder_files(data_path)]
    position = {relative_path(path, data_path): i for i, path in enumerate(paths)}
    unknown = [line for line in lines if line not in position]
    if unknown:
        raise ConfigError(f"{key} {split_file}: {len(unknown)} of its {len(lines)} paths are "
                          f"no image of data_path {data_path} (e.g. {', '.join(unknown[:3])}); "
                          f"it lists paths relative to the class-folder root it was made of")
    twice = sorted(line for line, count in Counter(lines).items() if count > 1)[:3]
    if twice:
        raise ConfigError(f"{key} {split_file} lists paths more than once: {', '.join(twice)}")
    return np.sort(np.array([position[line] for line in lines], np.int64))


def held_out_fraction(val_split: float, eval_data_path: str) -> float:
    """The fraction held out for ``run_eval``: ``val_split``, or 0.0 when ``eval_data_path``
    is given (it wins)."""
    return 0.0 if eval_data_path else val_split


def training_labels(data_path: str, val_split: float, seed: int) -> np.ndarray:
    """int64 labels, in the reader's order, of the images a run trains on (with ``val_split``
    the part not held out).

    Raises:
        ConfigError: As ``split_image_folder``.
    """
    if val_split:
        return split_image_folder(data_path, val_split, seed).train_labels()
    return np.array([label for _, label in image_folder_files(data_path)], np.int64)


def changed_split_files(output_dir: str, data_path: str, split: FolderSplit) -> list[str]:
    """Names of the split files in ``output_dir`` (missing ones aside) that list other images
    than ``split`` would write."""
    changed = []
    for part, name in (("train", TRAIN_SPLIT_FILE), ("val", VAL_SPLIT_FILE)):
        path = os.path.join(output_dir, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                if f.read().splitlines() != split.relative_paths(data_path, part):
                    changed.append(name)
    return changed


def checked_split(data_path: str, val_split: float, seed: int, *, output_dir: str = "",
                  compare: bool = False, allow_change: bool = False,
                  split: FolderSplit | None = None) -> tuple[FolderSplit | None, list[str]]:
    """The run's split (None for ``val_split`` 0; ``split``: made already, e.g. of a label
    file) and, with ``compare``, the names of the lists in ``output_dir`` it changes
    (``changed_split_files``); writes nothing.

    Raises:
        ConfigError: If the split changed, unless ``allow_change``; as ``split_image_folder``.
    """
    if not val_split:
        return None, []
    split = split or split_image_folder(data_path, val_split, seed)
    changed = changed_split_files(output_dir, data_path, split) if compare else []
    if changed and not allow_change:
        raise ConfigError(f"val_split {val_split} with seed {seed} now splits "
                          f"data_path {data_path} otherwise than {', '.join(changed)} "
                          f"in {output_dir}, written when this run started (another "
                          f"seed, or files added or removed): resuming would train on "
                          f"images held out before. Use the run's seed and data, or "
                          f"--resume_ignore_config true to resume with the new split")
    return split, changed
