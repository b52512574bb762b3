"""A validation split of one class-folder dataset (``val_split``) and the files that record it.

The split is stratified and deterministic: in each class, a permutation of the class's files
(sorted by name), drawn from the run's ``seed`` and the class name alone, holds out its first
``round(val_split * n)`` files (at least one) and keeps the rest for training. So the same
folder and seed always give the same split, each class is held out in the same proportion
(scikit-learn's ``StratifiedShuffleSplit`` over one split, per class rather than over the whole
set), and adding a class leaves the other classes' splits unchanged. Keras' ``validation_split``
takes the last fraction of the (unshuffled) samples instead, which on class folders would hold
out whole classes.

The split is given as positions in the reader's file order (``image_folder_files``: class
folders in label order, the files of each sorted by name, ``ImageFolderDataset``'s order),
which ``create_dataset(indices=...)`` reads. ``write_split_files`` records both parts as
``train_split.txt`` and ``val_split.txt`` (one path per line, relative to the class-folder
root: ``class_folder/file.jpg``); ``read_split_file`` turns such a file back into positions
(``eval.py --split_file``).
"""
import hashlib
import os
from collections import Counter
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
    """A class-folder dataset split into a training and a validation part.

    Attributes:
        files (list[tuple[str, int]]): (path, label) of every image, in the reader's order
            (``image_folder_files``).
        train (numpy.ndarray): int64 positions into ``files`` of the training part, ascending.
        val (numpy.ndarray): int64 positions of the held-out part, ascending.
    """

    files: list
    train: np.ndarray
    val: np.ndarray

    def relative_paths(self, data_path, part):
        """The paths of ``part`` (``train`` or ``val``) relative to ``data_path``, ``/``
        separated (``class_folder/file.jpg``), in the reader's order."""
        return [relative_path(self.files[i][0], data_path) for i in getattr(self, part)]

    def train_labels(self):
        """int64 labels of the training part, in the reader's order."""
        return np.array([self.files[i][1] for i in self.train], np.int64)


def relative_path(path, data_path):
    """``path`` relative to the class-folder root ``data_path``, with ``/`` separators."""
    return os.path.relpath(path, data_path).replace(os.sep, "/")


def class_stream(seed, class_name):
    """The random generator of one class's split: a function of (``seed``, class name) only
    (a SHA-256 of the name, not Python's salted ``hash``).

    Returns:
        numpy.random.Generator
    """
    name_key = int.from_bytes(hashlib.sha256(class_name.encode("utf-8")).digest()[:8], "little")
    return np.random.default_rng([int(seed) % 2 ** 64, SPLIT_STREAM, name_key])


def stratified_split(labels, val_split, seed, class_names):
    """Hold out ``val_split`` of every class, as the module docstring says.

    Args:
        labels (array-like): int label of each sample, in the reader's order; the samples of
            a class in this order are its files sorted by name.
        val_split (float): Fraction held out per class, in (0, 1): ``round(val_split * n)``
            images of a class of ``n`` (Python's ``round``, halves to even), at least 1.
        seed (int): The run's seed (>= 0; taken modulo 2**64).
        class_names (list[str]): Name of each label (seeds each class's permutation).

    Returns:
        tuple(numpy.ndarray, numpy.ndarray): int64 positions of the training part and of the
        held-out part, each ascending; together every position once.

    Raises:
        ConfigError: If ``val_split`` is outside (0, 1), or would leave a class with no
            training image (a class of one image, or ``val_split`` close to 1) or no
            validation image (a class without images); names the key, the value, the class
            and its image count.
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


def split_image_folder(data_path, val_split, seed):
    """The stratified split of a class-folder root (``stratified_split`` over its files).

    Args:
        data_path (str): Class-folder root.
        val_split (float): Fraction held out per class, in (0, 1).
        seed (int): The run's seed.

    Returns:
        FolderSplit: The files and the positions of both parts.

    Raises:
        MissingFileError: If ``data_path`` is not a folder or holds no class folders.
        ConfigError: As ``stratified_split``.
    """
    files = image_folder_files(data_path)
    train, val = stratified_split([label for _, label in files], val_split, seed,
                                  class_names_of(data_path))
    return FolderSplit(files, train, val)


def write_split_files(output_dir, data_path, split):
    """Write the two parts of ``split`` as ``TRAIN_SPLIT_FILE`` and ``VAL_SPLIT_FILE`` in
    ``output_dir``: one path per line relative to ``data_path`` (``class_folder/file.jpg``),
    in the reader's order; each file written atomically.

    Returns:
        tuple(str, str): The paths written.

    Raises:
        WriteError: If a file cannot be written.
    """
    written = []
    for part, name in (("train", TRAIN_SPLIT_FILE), ("val", VAL_SPLIT_FILE)):
        path = os.path.join(output_dir, name)
        atomic_write_text(path, "".join(f"{p}\n" for p in split.relative_paths(data_path, part)))
        written.append(path)
    return tuple(written)


def read_split_file(split_file, data_path, key="split_file"):
    """Positions, in the reader's order of ``data_path``, of the images a split file lists
    (``write_split_files``: one path per line relative to ``data_path``; blank lines ignored).

    Args:
        split_file (str): The file.
        data_path (str): The class-folder root the paths are relative to.
        key (str): The config key that named the file, for the messages.

    Returns:
        numpy.ndarray: int64 positions into ``image_folder_files(data_path)``, ascending.

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
    position = {relative_path(path, data_path): i
                for i, (path, _) in enumerate(image_folder_files(data_path))}
    unknown = [line for line in lines if line not in position]
    if unknown:
        raise ConfigError(f"{key} {split_file}: {len(unknown)} of its {len(lines)} paths are "
                          f"no image of data_path {data_path} (e.g. {', '.join(unknown[:3])}); "
                          f"it lists paths relative to the class-folder root it was made of")
    twice = sorted(line for line, count in Counter(lines).items() if count > 1)[:3]
    if twice:
        raise ConfigError(f"{key} {split_file} lists paths more than once: {', '.join(twice)}")
    return np.sort(np.array([position[line] for line in lines], np.int64))


def held_out_fraction(val_split, eval_data_path):
    """The fraction of each class of ``data_path`` held out for ``run_eval``.

    Args:
        val_split (float): The configured ``val_split``, in [0, 1).
        eval_data_path (str): The configured ``eval_data_path`` ("" if none).

    Returns:
        float: ``val_split``, or 0.0 when ``eval_data_path`` is given (it wins: every image
        of ``data_path`` trains).
    """
    return 0.0 if eval_data_path else val_split


def training_labels(data_path, val_split, seed):
    """Labels of the images a run trains on: every image of ``data_path``, or with
    ``val_split`` the part not held out (``split_image_folder``).

    Returns:
        numpy.ndarray: int64 labels, in the reader's order.

    Raises:
        ConfigError: As ``split_image_folder``.
    """
    if val_split:
        return split_image_folder(data_path, val_split, seed).train_labels()
    return np.array([label for _, label in image_folder_files(data_path)], np.int64)


def changed_split_files(output_dir, data_path, split):
    """The split files in ``output_dir`` (an earlier part of the same run) that list other
    images than ``split`` would write: a resumed run whose split changed (another seed,
    files added to or removed from ``data_path``) would train on images it held out before.

    Returns:
        list[str]: Names of the differing files (missing ones are not listed).
    """
    changed = []
    for part, name in (("train", TRAIN_SPLIT_FILE), ("val", VAL_SPLIT_FILE)):
        path = os.path.join(output_dir, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                if f.read().splitlines() != split.relative_paths(data_path, part):
                    changed.append(name)
    return changed


def checked_split(data_path, val_split, seed, output_dir="", compare=False, allow_change=False):
    """The ``val_split`` of a run (``split_image_folder``), checked against the lists an earlier
    part of the same run wrote into ``output_dir`` (a resumed run whose split changed would
    train on images it held out before). A check only: nothing is written.

    Args:
        data_path (str): The class-folder root.
        val_split (float): The fraction held out (``held_out_fraction``); 0 = no split.
        seed (int): The run's seed.
        output_dir (str): The run's folder, holding the earlier lists (if ``compare``).
        compare (bool): Compare with the lists in ``output_dir`` (the process that writes
            the run's files, continuing a run of that folder).
        allow_change (bool): A changed split is returned instead of refused
            (``resume_ignore_config``).

    Returns:
        tuple: ``(split, changed)``: the ``FolderSplit`` (None for ``val_split`` 0) and the
        names of the lists it changes.

    Raises:
        ConfigError: If the split changed, unless ``allow_change``; as ``split_image_folder``.
    """
    if not val_split:
        return None, []
    split = split_image_folder(data_path, val_split, seed)
    changed = changed_split_files(output_dir, data_path, split) if compare else []
    if changed and not allow_change:
        raise ConfigError(f"val_split {val_split} with seed {seed} now splits "
                          f"data_path {data_path} otherwise than {', '.join(changed)} "
                          f"in {output_dir}, written when this run started (another "
                          f"seed, or files added or removed): resuming would train on "
                          f"images held out before. Use the run's seed and data, or "
                          f"--resume_ignore_config true to resume with the new split")
    return split, changed
