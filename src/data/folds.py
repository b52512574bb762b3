"""K-fold cross-validation of a class-folder dataset for ``label_issues.py``: a stratified,
deterministic fold per image (per class, the permutation of ``val_split``'s ``class_stream``
dealt round robin, each class starting one fold further), its record (``folds.csv``), the
folder of symbolic links a fold trains on, and the out-of-fold probabilities put together.
See docs/label_issues.md.
"""
import csv
import io
import os
import shutil

import numpy as np

from src.data.split import class_stream, relative_path
from src.utils.config import ConfigError
from src.utils.files import atomic_write_text

FOLDS_FILE = "folds.csv"
FOLDS_HEADER = ("path", "label", "fold")


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
    if folds < 2:
        raise ConfigError(f"label_folds must be 2 or more (each image is predicted by a model "
                          f"trained on the other folds), got {folds}")
    if len(class_names) < 2:
        raise ConfigError(f"data_path {data_path} holds one class folder ({class_names[0]!r}): "
                          f"finding label issues compares the classes, it needs 2 or more")
    labels = np.asarray(labels, np.int64)
    counts = np.bincount(labels, minlength=len(class_names))
    smallest = int(np.argmin(counts))
    if folds > counts[smallest]:
        fix = (f"use label_folds {counts[smallest]} or less, or add images" if counts[smallest]
               >= 2 else "add images: every class needs 2 or more")
        raise ConfigError(f"label_folds {folds} is larger than the {counts[smallest]} image"
                          f"{'' if counts[smallest] == 1 else 's'} of class "
                          f"{class_names[smallest]!r} in data_path {data_path}: every fold holds "
                          f"out at least one image of each class; {fix}")
    assigned = np.empty(len(labels), np.int64)
    for label, name in enumerate(class_names):
        members = np.flatnonzero(labels == label)
        order = class_stream(seed, name).permutation(len(members))
        assigned[members[order]] = (np.arange(len(members)) + label) % folds
    return assigned


def folds_text(files: list[tuple[str, int]], assigned: np.ndarray, class_names: list[str],
               data_path: str) -> str:
    """``folds.csv``: a header, then one row per image: its path relative to ``data_path``,
    its class name (the given label) and its fold (1-based)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FOLDS_HEADER)
    for (path, label), fold in zip(files, assigned):
        writer.writerow((relative_path(path, data_path), class_names[label], int(fold) + 1))
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
