"""K-fold cross-validation for ``label_issues.py``: a stratified, deterministic fold per image,
its record (``folds.csv``), the data a fold trains on, and the out-of-fold probabilities put
together. Class folders: per class, the permutation of ``val_split``'s ``class_stream`` dealt
round robin, each class starting one fold further; a fold trains on a folder of symbolic links.
A label file (``task multilabel``): iterative stratification into K parts
(``src.data.multilabel.multilabel_folds``); a fold trains on a label file of its rows. See
docs/label_issues.md.
"""
import csv
import io
import os
import shutil

import numpy as np

from src.data.class_names import CLASS_NAMES_FILE, write_class_names
from src.data.multilabel import label_file_text, multilabel_folds, row_names
from src.data.split import class_stream, relative_path
from src.utils.config import ConfigError
from src.utils.files import atomic_write_text

FOLDS_FILE = "folds.csv"
FOLDS_HEADER = ("path", "label", "fold")
TABLE_FOLDS_HEADER = ("path", "labels", "fold")
"""``folds.csv``'s header for a label file: ``labels`` holds the names separated by spaces."""
FOLD_LABEL_FILE = "train.csv"
"""In a fold's folder, for a label file: the rows the fold trains on (``class_names.txt``
beside it keeps the run's class order)."""


def fold_assignment(labels: np.ndarray, folds: int, seed: int, class_names: list[str], *,
                    data_path: str) -> np.ndarray:
    """The fold (0..folds-1) of each image, stratified: in every fold each class holds
    ``n // folds`` or one more of its ``n`` images; a function of (``seed``, class names,
    the images' order) only.

    Args:
        labels: int (N,) class of each image, in the reader's order.
        folds: K, 2 or more.
        seed: The run's seed.
        class_names: The names of the classes, in label order.
        data_path: Named in errors.

    Returns:
        numpy.ndarray: int64 (N,).

    Raises:
        ConfigError: For ``folds`` under 2, a single class, or ``folds`` above the image count
            of the smallest class (names it).
    """
    labels = np.asarray(labels, np.int64)
    check_fold_counts(folds, np.bincount(labels, minlength=len(class_names)), class_names,
                      f"data_path {data_path}", one="holds one class folder")
    assigned = np.empty(len(labels), np.int64)
    for label, name in enumerate(class_names):
        members = np.flatnonzero(labels == label)
        order = class_stream(seed, name).permutation(len(members))
        assigned[members[order]] = (np.arange(len(members)) + label) % folds
    return assigned


def multilabel_fold_assignment(targets: np.ndarray, folds: int, seed: int,
                               class_names: list[str], *, label_file: str) -> np.ndarray:
    """The fold (0..folds-1) of each row of a label file: iterative stratification into
    ``folds`` parts (``multilabel_folds``; Sechidis et al. 2011), each of ``N // folds`` or
    one more rows and, per class, about ``n / folds`` of its ``n`` positive images; a function
    of (``targets``, ``folds``, ``seed``) only.

    Args:
        targets: (N, C) multi-hot given labels, in the label file's row order.
        folds: K, 2 or more.
        seed: The run's seed.
        class_names: The C names, in label order.
        label_file: Named in errors.

    Returns:
        numpy.ndarray: int64 (N,).

    Raises:
        ConfigError: For ``folds`` under 2, a single class, ``folds`` above the positive images
            of the rarest class, or a class given to every image (names it and the count).
    """
    targets = np.asarray(targets) != 0
    check_fold_counts(folds, targets.sum(0), class_names, f"label_file {label_file}",
                      one="names one class")
    always = np.flatnonzero(targets.all(0))
    if len(always):
        raise ConfigError(f"class {class_names[always[0]]!r} is given to all {len(targets)} "
                          f"images of label_file {label_file}: confident learning weighs each "
                          f"class against the images without it; leave that class out of the "
                          f"table, or add images without it")
    return multilabel_folds(targets, folds, seed)


def check_fold_counts(folds: int, counts: np.ndarray, class_names: list[str], where: str, *,
                      one: str) -> None:
    """Refuse ``folds`` under 2, a single class, or ``folds`` above the image count of the
    smallest class (every fold holds out at least one image of each class).

    Args:
        folds: K.
        counts: int (C,) images of each class (positives, for a label file).
        class_names: The C names.
        where: The data named in the errors (``"data_path D"``, ``"label_file F"``).
        one: The words of a single class (``"holds one class folder"``).

    Raises:
        ConfigError: Naming the class and its count.
    """
    if folds < 2:
        raise ConfigError(f"label_folds must be 2 or more (each image is predicted by a model "
                          f"trained on the other folds), got {folds}")
    if len(class_names) < 2:
        raise ConfigError(f"{where} {one} ({class_names[0]!r}): finding label issues compares "
                          f"the classes, it needs 2 or more")
    smallest = int(np.argmin(counts))
    count = int(counts[smallest])
    if folds > count:
        fix = (f"use label_folds {count} or less, or add images" if count >= 2
               else "add images: every class needs 2 or more")
        raise ConfigError(f"label_folds {folds} is larger than the {count} image"
                          f"{'' if count == 1 else 's'} of class {class_names[smallest]!r} in "
                          f"{where}: every fold holds out at least one image of each class; "
                          f"{fix}")


def label_names(labels: np.ndarray, class_names: list[str], *, multi_hot: bool) -> list[str]:
    """The given label of each image as its source writes it: the class name (class folders:
    ``labels`` int (N,)), or with ``multi_hot`` the names of its classes in label order
    separated by spaces, as a label file does (``labels`` (N, C) multi-hot)."""
    if multi_hot:
        return row_names(labels, class_names)
    return [class_names[int(label)] for label in labels]


def folds_text(paths: list[str], given: list[str], assigned: np.ndarray, data_path: str, *,
               header: tuple[str, str, str] = FOLDS_HEADER) -> str:
    """``folds.csv``: ``header``, then one row per image: its path relative to ``data_path``,
    its given label (``label_names``: a class name, or a label file's names separated by
    spaces under ``TABLE_FOLDS_HEADER``) and its fold (1-based)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for path, label, fold in zip(paths, given, assigned):
        writer.writerow((relative_path(path, data_path), label, int(fold) + 1))
    return out.getvalue()


def record_folds(output_dir: str, text: str, *, folds: int, seed: int, data_path: str) -> bool:
    """Write ``folds.csv`` (``folds_text``) into ``output_dir`` atomically, or check that the
    one there is the same; returns whether it was there.

    Raises:
        ConfigError: If the one there differs (other images, ``folds`` or ``seed``).
        WriteError: If it cannot be written.
    """
    path = os.path.join(output_dir, FOLDS_FILE)
    if not os.path.isfile(path):
        atomic_write_text(path, text)
        return False
    with open(path, encoding="utf-8", errors="replace") as f:
        if f.read() == text:
            return True
    raise ConfigError(f"{path} assigns the images to folds otherwise than label_folds {folds} "
                      f"with seed {seed} does for data_path {data_path} (other images, "
                      f"label_folds or seed than when this output_dir was started): resuming "
                      f"would mix models trained on each other's held-out images. Use that "
                      f"run's data, label_folds and seed, or another output_dir")


def link_fold_images(files: list[tuple[str, int]], positions: np.ndarray, class_names: list[str],
                     folder: str) -> None:
    """Make ``folder`` a class-folder root of symbolic links to the images at ``positions`` of
    ``files`` (absolute targets), every class folder present: built beside it and renamed into
    place, an earlier one replaced (its links only; their targets are untouched).

    Raises:
        OSError: If the links cannot be made.
    """
    building = folder + ".partial"
    if os.path.isdir(building):
        shutil.rmtree(building)
    for name in class_names:
        os.makedirs(os.path.join(building, name))
    for i in positions:
        path, label = files[i]
        os.symlink(os.path.abspath(path),
                   os.path.join(building, class_names[label], os.path.basename(path)))
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.rename(building, folder)


def write_fold_label_file(folder: str, *, header: list[str], files: list[str],
                          given: list[str], positions: np.ndarray,
                          class_names: list[str]) -> str:
    """Write the label file a fold trains on into ``folder``: ``FOLD_LABEL_FILE``, the input's
    ``header`` and its rows at ``positions`` (paths relative to the data_path, as ``files``;
    given labels as ``label_names``), and ``class_names.txt`` beside it (the run's class order,
    which train.py reads beside a label file), each atomically.

    Returns:
        str: The label file's path.

    Raises:
        WriteError: If a file cannot be written.
    """
    os.makedirs(folder, exist_ok=True)
    write_class_names(os.path.join(folder, CLASS_NAMES_FILE), class_names)
    path = os.path.join(folder, FOLD_LABEL_FILE)
    atomic_write_text(path, label_file_text(header, [files[i] for i in positions],
                                            [given[i] for i in positions]))
    return path


def out_of_fold(held_out: list[tuple[np.ndarray, np.ndarray]], count: int) -> np.ndarray:
    """The probabilities of every image from the fold that held it out.

    Args:
        held_out: Per fold, the positions (int, into the reader's order) it held out and their
            probabilities (len(positions), C).
        count: N, the images.

    Returns:
        numpy.ndarray: float32 (N, C).

    Raises:
        ValueError: If an image is held out by no fold or by several.
    """
    times = np.zeros(count, np.int64)
    probs = None
    for positions, fold_probs in held_out:
        if probs is None:
            probs = np.zeros((count, fold_probs.shape[1]), np.float32)
        times[positions] += 1
        probs[positions] = fold_probs
    if probs is None or (times != 1).any():
        raise ValueError(f"{int((times == 0).sum())} images held out by no fold, "
                         f"{int((times > 1).sum())} by several")
    return probs
