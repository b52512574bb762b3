"""The config of ``label_issues.py``: its checks (``check_label_issues_config``), the images and
their given labels (``given_labels``: class folders, or a label file with ``task multilabel``)
and their folds (``assign_folds``), no evaluation during a fold's training
(``drop_evaluation_keys``), the training keys every fold is given (``fold_recipe``: the keys
set by the user, less the command's own), and the model a fold's checkpoint is run as
(``fold_model``). See docs/label_issues.md.
"""
import os
from typing import NamedTuple

import numpy as np

from src.data.folds import fold_assignment, label_names, multilabel_fold_assignment
from src.data.multilabel import label_file_header
from src.data.pipeline import class_names_of, image_folder_files
from src.data.settings import EvalPreprocess
from src.recipe.checks import TRAIN_SECTIONS, check_train_config
from src.recipe.model_record import model_config, model_preprocess, resolve_model
from src.recipe.splits import label_tables
from src.training.resume import MAY_DIFFER
from src.utils.config import Config, ConfigError, read_recipe
from src.utils.model_record import ModelRecord
from src.utils.tasks import Task, get_task

LABEL_ISSUES_SECTIONS = (*TRAIN_SECTIONS, "label issues")
"""The sections of label_issues.py's ``--help``: training's and its own."""
OWN_KEYS = ("data_path", "label_file", "output_dir", "resume_ckpt", "overwrite",
            "run_distribute", "device_num", "label_folds", "label_page_images")
"""Keys the command sets for each fold itself (or reads alone): not in the fold recipe."""
EVALUATION_KEYS = ("run_eval", "eval_data_path", "eval_label_file", "val_split", "eval_interval",
                   "best_on_ema", "early_stopping_patience", "early_stopping_min_delta")
"""The keys of an evaluation during training, which the folds do not do."""
RECIPE_FILE = "fold_train.yaml"
MAY_DIFFER_BETWEEN_FOLDS = MAY_DIFFER - {"pre_trained", "use_ema"}
"""Keys whose value may change between runs of the command: those a resumed train.py run may
change, less the weights a fold starts from and those that predict its held-out images."""


def drop_evaluation_keys(cfg: Config) -> tuple[Config, dict]:
    """A new config with the keys of an evaluation during training (``EVALUATION_KEYS``) at
    their defaults, as set by no one: a fold trains on all of its training part and is
    evaluated on its held-out fold. Returns it and the keys ``cfg`` set otherwise, with their
    values (for a log line); ``cfg`` itself is unchanged."""
    dropped = {key: cfg[key] for key in EVALUATION_KEYS if cfg.set_otherwise(key)}
    return cfg.replaced(user_keys=cfg.user_keys - set(EVALUATION_KEYS),
                        **{key: cfg.defaults[key] for key in EVALUATION_KEYS}), dropped


class GivenLabels(NamedTuple):
    """The images of a data set and their given labels, in the reader's order.

    Attributes:
        task (Task): The config's task: ``multi_hot`` labels are a label file's.
        paths (list[str]): N image files (under ``data_path``, joined to it).
        labels (numpy.ndarray): int64 (N,) class indices; multi-hot task: uint8 (N, C).
        class_names (list[str]): C names in label order.
        label_texts (list[str]): N given labels as the source writes them (``label_names``).
        source (str): The data as named in messages (``data_path D``, ``label_file F``).
        header (list[str]): A label file's 2 header cells; [] for class folders.
    """

    task: Task
    paths: list[str]
    labels: np.ndarray
    class_names: list[str]
    label_texts: list[str]
    source: str
    header: list[str]


def check_label_issues_config(cfg: Config) -> None:
    """Refuse what the command cannot do, naming the key: another dataset than class folders
    (a label file's rows included), ``benchmark_steps``, a ``resume_ckpt`` other than auto,
    ``overwrite``, a negative ``label_page_images``; then train.py's checks
    (``check_train_config``: a ``label_file`` without ``task multilabel`` and the reverse
    among them).

    Raises:
        ConfigError: Naming the key, its value and what to do.
    """
    refused = (
        (cfg.dataset != "imagefolder", f"dataset {cfg.dataset}: label_issues.py reads class "
                                       f"folders (dataset imagefolder)"),
        (cfg.benchmark_steps, f"benchmark_steps {cfg.benchmark_steps} trains nothing; leave it 0"),
        (cfg.resume_ckpt not in ("", "auto"), f"resume_ckpt {cfg.resume_ckpt}: the command "
                                              f"resumes each fold in its own folder (auto); "
                                              f"rerun the same command to resume"),
        (cfg.overwrite, "overwrite true: give a new output_dir for a new run of the command"),
        (cfg.label_page_images < 0, f"label_page_images must be 0 or more, got "
                                    f"{cfg.label_page_images}"),
    )
    for wrong, message in refused:
        if wrong:
            raise ConfigError(message)
    check_train_config(cfg)


def given_labels(cfg: Config) -> GivenLabels:
    """The config checked (``check_label_issues_config``), then the images and their given
    labels: the class folders of ``data_path``, or with a task of label files (``task
    multilabel``) the rows of ``label_file`` over ``data_path`` (its classes as train.py takes
    them: ``class_names.txt`` beside it, else the names it uses).

    Raises:
        ConfigError: As ``check_label_issues_config``; a ``class_num`` other than the count of
            classes.
        MissingFileError, LabelFileError: A missing data_path or label_file, a bad label file.
    """
    task = get_task(cfg.task)
    check_label_issues_config(cfg)
    if task.label_file:
        table = label_tables(cfg)[0]
        return GivenLabels(task, table.paths, table.targets, table.class_names,
                           label_names(table.targets, table.class_names, multi_hot=True),
                           f"label_file {cfg.label_file}", label_file_header(cfg.label_file))
    files = image_folder_files(cfg.data_path)
    class_names = class_names_of(cfg.data_path)
    if len(class_names) != cfg.class_num:
        raise ConfigError(f"data_path {cfg.data_path} has {len(class_names)} classes but "
                          f"class_num is {cfg.class_num}")
    labels = np.array([label for _, label in files], np.int64)
    return GivenLabels(task, [path for path, _ in files], labels, class_names,
                       label_names(labels, class_names, multi_hot=False),
                       f"data_path {cfg.data_path}", [])


def assign_folds(cfg: Config, given: GivenLabels) -> np.ndarray:
    """int64 (N,) fold of each image, 0..label_folds-1: stratified by class
    (``fold_assignment``), or for multi-hot labels by iterative stratification
    (``multilabel_fold_assignment``).

    Raises:
        ConfigError: As those, naming the class and its count.
    """
    if given.task.multi_hot:
        return multilabel_fold_assignment(given.labels, cfg.label_folds, cfg.seed,
                                          given.class_names, label_file=cfg.label_file)
    return fold_assignment(given.labels, cfg.label_folds, cfg.seed, given.class_names,
                           data_path=cfg.data_path)


def fold_recipe(cfg: Config) -> Config:
    """The training keys of every fold: those the user set (recipe file and flags), less
    ``OWN_KEYS``, in config.yaml's order; ``to_yaml()`` is the fold recipe file."""
    return Config({key: value for key, value in cfg.items()
                   if key in cfg.user_keys and key not in OWN_KEYS})


def changed_training_keys(recipe_path: str, recipe: Config, defaults: dict) -> list[str]:
    """The keys whose value in ``recipe`` differs from the recipe file at ``recipe_path``
    (written when the command started in that folder; a key missing is at its default in
    ``defaults``), those of ``MAY_DIFFER_BETWEEN_FOLDS`` aside; [] without a file.

    Raises:
        ConfigError: If the file cannot be read (as ``read_recipe``).
    """
    if not os.path.isfile(recipe_path):
        return []
    before = read_recipe(recipe_path)
    keys = [key for key in defaults if key in before or key in recipe]
    return [f"{key} {before.get(key, defaults[key])!r} -> {recipe.get(key, defaults[key])!r}"
            for key in keys if key not in MAY_DIFFER_BETWEEN_FOLDS
            and before.get(key, defaults[key]) != recipe.get(key, defaults[key])]


def fold_model(cfg: Config, checkpoint_path: str) -> tuple[ModelRecord, Config, EvalPreprocess]:
    """A fold's checkpoint as predict.py would run it with the command's keys: its record
    (``resolve_model``), the config for it (``model_config``) and its eval preprocessing.

    Raises:
        ConfigError, RecordError: As ``resolve_model``.
    """
    given = cfg.replaced(checkpoint_path=checkpoint_path)
    model = resolve_model(given)
    model_cfg = model_config(given, model)
    return model, model_cfg, model_preprocess(model_cfg, model)
