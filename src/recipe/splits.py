"""Which images a run trains and evaluates on: the ``val_split`` lists and class counts of a
run, eval.py's ``split_file``, and ``task multilabel``'s label files (their tables, split and
class weights).
"""
import logging
import os

import numpy as np

from src.data.class_names import CLASS_NAMES_FILE, model_class_names, read_class_names
from src.data.multilabel import LabelTable, label_file_classes, multilabel_split, read_label_file
from src.data.split import (
    FolderSplit,
    checked_split,
    held_out_fraction,
    read_split_file,
    split_image_folder,
    write_split_files,
)
from src.training.loss import pos_weights
from src.training.output_dir import record_training_images
from src.utils.config import Config, ConfigError
from src.utils.tasks import get_task

# ---- the val_split lists and class counts of a run; eval.py's split_file ----

def held_out(cfg: Config) -> float:
    """The fraction of ``data_path`` held out (``src.data.split.held_out_fraction``)."""
    return held_out_fraction(cfg.val_split, cfg.eval_data_path)


def run_split(cfg: Config, continues_here: bool, write: bool) -> tuple:
    """``(split, changed)``: the run's ``val_split`` (None without one or class folders), checked
    against the lists an earlier part of the run wrote (``checked_split``; ``write``: rank 0
    compares), and the lists it changes (``resume_ignore_config`` only).

    Raises:
        ConfigError: If the split changed, unless ``resume_ignore_config``.
    """
    val_split = held_out(cfg) if cfg.dataset == "imagefolder" else 0.0
    return checked_split(cfg.data_path, val_split, cfg.seed, output_dir=cfg.output_dir,
                         compare=write and continues_here,
                         allow_change=cfg.resume_ignore_config,
                         split=data_split(cfg) if val_split and get_task(cfg.task).label_file
                         else None)


def record_run_images(cfg: Config, *, continues_here: bool, class_names: list[str], write: bool,
                      log: logging.Logger, checked: tuple | None = None) -> None:
    """Class folders: the ``val_split`` lists and training images per class, in the log and
    ``output_dir`` (``record_training_images``); ``checked``: ``run_split``'s result if called
    already. Raises as ``run_split``, or ``WriteError``."""
    if cfg.dataset != "imagefolder":
        return
    if get_task(cfg.task).label_file:
        record_label_file_images(cfg, write=write, log=log,
                                 checked=checked or run_split(cfg, continues_here, write))
        return
    if cfg.val_split and not held_out(cfg):
        log.warning("val_split %g not applied: eval_data_path %s is given and wins (every image "
                    "of data_path trains)", cfg.val_split, cfg.eval_data_path)
    split, changed = checked or run_split(cfg, continues_here, write)
    record_training_images(cfg.output_dir, cfg.data_path, class_names, log, split=split,
                           val_split=cfg.val_split, changed=changed, write=write,
                           for_eval=cfg.run_eval, suggest_balance=cfg.class_balance == "none")


def split_indices(cfg: Config) -> list[int] | None:
    """eval.py's ``--split_file``: positions of the images it lists in data_path's reader order
    (``read_split_file``); None without one.

    Raises:
        ConfigError: With dataset cifar10, or a bad list. MissingFileError: No such file.
    """
    if not cfg.split_file:
        return None
    if cfg.dataset != "imagefolder":
        raise ConfigError(f"split_file {cfg.split_file} needs dataset imagefolder, got "
                          f"{cfg.dataset}")
    if get_task(cfg.task).label_file:
        return read_split_file(cfg.split_file, cfg.data_path,
                               listed=eval_label_table(cfg).paths)
    return read_split_file(cfg.split_file, cfg.data_path)


# ---- multi-label data (task multilabel): label files, their split and class weights ----

_TABLES = {}  # (label_file, data_path, check_images, class names) -> (file's mtime, LabelTable)


def label_table(label_file: str, data_path: str, class_names: list[str],
                check_images: bool) -> LabelTable:
    """``read_label_file`` of ``label_file``, read once per process while the file is
    unchanged."""
    key = (label_file, data_path, check_images, tuple(class_names))
    mtime = os.stat(label_file).st_mtime_ns if os.path.isfile(label_file) else None
    cached = _TABLES.get(key)
    if cached is None or cached[0] != mtime:
        cached = _TABLES[key] = (mtime, read_label_file(
            label_file, data_path, class_names=class_names, check_images=check_images))
    return cached[1]


def label_classes(cfg: Config) -> list[str]:
    """The class list of ``label_file``: ``class_names.txt`` beside it when present, else the
    sorted set of its names (``label_file_classes``).

    Raises:
        ConfigError: If they are not ``class_num``, or ``class_names.txt`` repeats a name.
        LabelFileError: An unreadable file. ClassNamesError: A ``class_names.txt`` that is
            not UTF-8 text.
    """
    names_file = os.path.join(os.path.dirname(cfg.label_file), CLASS_NAMES_FILE)
    from_file = os.path.isfile(names_file)
    names = read_class_names(names_file) if from_file else label_file_classes(cfg.label_file)
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"{names_file} names a class more than once ({', '.join(repeated)}): "
                          f"a label file's classes are told apart by name; give each once")
    if len(names) != cfg.class_num:
        source = names_file if from_file else f"the names used in label_file {cfg.label_file}"
        raise ConfigError(f"{source}: {len(names)} classes but class_num is {cfg.class_num}")
    return names


def label_tables(cfg: Config) -> tuple[LabelTable, LabelTable | None]:
    """The training label table of ``label_file`` over ``data_path`` and, with ``run_eval``
    and ``eval_data_path``, the eval one of ``eval_label_file`` (same classes).

    Raises:
        ConfigError: As ``label_classes``. LabelFileError: As ``read_label_file``.
    """
    names = label_classes(cfg)
    train = label_table(cfg.label_file, cfg.data_path, names, cfg.check_images)
    evaluated = None
    if cfg.run_eval and cfg.eval_data_path:
        evaluated = label_table(cfg.eval_label_file, cfg.eval_data_path, names,
                                cfg.check_images)
    return train, evaluated


def data_split(cfg: Config) -> FolderSplit:
    """The ``val_split`` of ``data_path``: stratified by class folder, or for ``task
    multilabel`` by iterative stratification of the label file's rows (``multilabel_split``)."""
    if not get_task(cfg.task).label_file:
        return split_image_folder(cfg.data_path, cfg.val_split, cfg.seed)
    table = label_tables(cfg)[0]
    try:
        train, val = multilabel_split(table.targets, cfg.val_split, cfg.seed)
    except ValueError as err:
        raise ConfigError(f"val_split {cfg.val_split} of label_file {cfg.label_file}: {err}"
                          ) from err
    return FolderSplit([(path, -1) for path in table.paths], train, val)


def check_positive_labels(targets: np.ndarray, source: str) -> None:
    """Refuse a multi-label evaluation set (float multi-hot ``targets`` (N, K)) with no
    positive label at all: no class has a positive to rank, so mAP is undefined.

    Raises:
        ConfigError: Naming ``source`` (the label file, or the split that left them out).
    """
    if not np.asarray(targets).any():
        raise ConfigError(f"{source}: none of its {len(targets)} images has a label, so no "
                          f"class has a positive to rank and mAP is undefined; evaluate on "
                          f"images with labels")


def multilabel_pos_weight(cfg: Config) -> np.ndarray:
    """``class_balance loss`` of ``task multilabel``: each class's negatives / positives over
    the images the run trains on (``pos_weights``; torch's ``BCEWithLogitsLoss`` rule).

    Raises:
        ConfigError: For a class with no positive or no negative training image.
    """
    targets = label_tables(cfg)[0].targets
    if held_out(cfg):
        targets = targets[data_split(cfg).train]
    try:
        return pos_weights(targets)
    except ValueError as err:
        raise ConfigError(f"class_balance loss of label_file {cfg.label_file}: {err}") from err


def record_label_file_images(cfg: Config, *, write: bool, log: logging.Logger,
                             checked: tuple) -> None:
    """``task multilabel``: the ``val_split`` lists (``checked``: ``run_split``'s result) written
    when ``write``, and the training images' positives per class in the log."""
    split, changed = checked
    table = label_tables(cfg)[0]
    targets = table.targets
    if split is not None:
        if changed:
            log.warning("resume_ignore_config: the split changed; %s rewritten", ", ".join(changed))
        if write:
            write_split_files(cfg.output_dir, cfg.data_path, split)
        log.info("val_split %g: %d images train, %d held out (iterative stratification)",
                 cfg.val_split, len(split.train), len(split.val))
        targets = targets[split.train]
    positives = targets.sum(axis=0)
    log.info("training images %d, labels per image %.2f; positives per class: %s",
             len(targets), float(targets.sum()) / max(1, len(targets)),
             ", ".join(f"{name} {int(n)}" for name, n in zip(table.class_names, positives)))


def eval_label_table(cfg: Config, class_names=None) -> LabelTable:
    """eval.py's ``task multilabel`` data: ``label_file`` over ``data_path`` in the model's class
    order (``class_names``: its record's; else ``model_class_names``: ``class_names_path``,
    Hub weights' label names, the ``class_names.txt`` beside the checkpoint), else the label
    file's (``label_classes``).

    Raises:
        ConfigError: Without ``label_file``; as ``label_classes``. LabelFileError: As
            ``read_label_file``.
    """
    if not cfg.label_file:
        raise ConfigError("task multilabel: label_file is empty: give the CSV of data_path's "
                          "images and their labels (docs/multilabel.md)")
    names = (list(class_names or ()) or model_class_names(cfg.checkpoint_path, cfg.class_num,
                                                          cfg.class_names_path)
             or label_classes(cfg))
    return label_table(cfg.label_file, cfg.data_path, names, cfg.check_images)
