"""What a model's outputs mean: the task (``multiclass``: softmax over the classes;
``multilabel``: one sigmoid per class, a label where it reaches its threshold), the
probabilities of the logits by task, the per-class decision thresholds (``thresholds.json``
beside a checkpoint) and their record in an exported file's metadata.
See docs/deployment.md#multi-label-models.
"""
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from src.utils.errors import UserError
from src.utils.files import atomic_write_text
from src.utils.multilabel_metrics import DEFAULT_THRESHOLD, sigmoid

TASKS = ("multiclass", "multilabel")
"""Values of ``task``; the first is the default (a model that records none)."""


THRESHOLDS_FILE = "thresholds.json"
"""Beside a checkpoint: ``{"task": "multilabel", "class_names": [...], "thresholds": [...]}``."""

TASK_KEY, THRESHOLDS_KEY, LABEL_NAMES_KEY = "task", "thresholds", "label_names"
"""The metadata keys of an exported graph (ONNX ``metadata_props``, MindIR ``user_info``);
lists are JSON text."""


class ThresholdsError(UserError, ValueError):
    """A thresholds record (``thresholds.json``, a config.json or an exported file's metadata)
    is malformed or does not fit the model."""


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of a float array (N, K), numerically stable, in its dtype."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


PROBABILITIES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "multiclass": softmax, "multilabel": sigmoid}
"""The function from logits to probabilities of each task."""


def probabilities(logits: np.ndarray, task: str) -> np.ndarray:
    """Class probabilities of logits (N, K): softmax over K (``multiclass``) or a sigmoid per
    class (``multilabel``); float32 logits give float32, float64 float64.

    Raises:
        ValueError: If ``task`` is not one of ``TASKS``.
    """
    if task not in PROBABILITIES:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    return PROBABILITIES[task](np.asarray(logits))


def checked_thresholds(values, class_num: int, source: str) -> np.ndarray:
    """``values`` as float64 (class_num,) (as written: a float32 value read back exactly),
    each a number in [0, 1].

    Raises:
        ThresholdsError: Naming ``source``, the count or the first bad value.
    """
    if not isinstance(values, list) or len(values) != class_num:
        count = f"{len(values)} values" if isinstance(values, list) else repr(values)
        raise ThresholdsError(f"{source}: thresholds is {count}; expected a list of "
                              f"{class_num} numbers in [0, 1], one per class")
    for index, value in enumerate(values):
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or not 0 <= value <= 1):
            raise ThresholdsError(f"{source}: thresholds[{index}] is {value!r}; expected a "
                                  f"number in [0, 1]")
    return np.asarray(values, np.float64)


def write_thresholds(folder: str, class_names: Sequence[str], thresholds) -> str:
    """Write ``thresholds.json`` (task ``multilabel``, the class names, one threshold per
    class as float) into ``folder``, atomically; returns its path.

    Raises:
        ThresholdsError: If the counts differ or a threshold is not in [0, 1].
        WriteError: If it cannot be written.
    """
    values = [float(v) for v in np.asarray(thresholds, np.float64).reshape(-1)]
    checked_thresholds(values, len(class_names), THRESHOLDS_FILE)
    path = os.path.join(folder, THRESHOLDS_FILE)
    atomic_write_text(path, json.dumps({TASK_KEY: "multilabel", "class_names": list(class_names),
                                        THRESHOLDS_KEY: values}, indent=1) + "\n")
    return path


def thresholds_path(checkpoint_path: str) -> str:
    """``thresholds.json`` beside a checkpoint file (in it, for a folder)."""
    folder = checkpoint_path if os.path.isdir(checkpoint_path) else os.path.dirname(
        os.path.abspath(checkpoint_path))
    return os.path.join(folder, THRESHOLDS_FILE)


def read_thresholds(checkpoint_path: str, class_num: int) -> np.ndarray | None:
    """The thresholds of ``thresholds.json`` beside ``checkpoint_path``: float64
    (class_num,); None when there is no such file.

    Raises:
        ThresholdsError: If it is not JSON, its task is not ``multilabel``, or its names or
            thresholds are not ``class_num`` (names the file and the field).
    """
    path = thresholds_path(checkpoint_path)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ThresholdsError(f"cannot read {path} as JSON: {err}") from err
    if not isinstance(record, dict) or record.get(TASK_KEY) != "multilabel":
        raise ThresholdsError(f"{path}: expected a JSON object with task multilabel, "
                              f"class_names and thresholds (written by eval.py)")
    names = record.get("class_names")
    if not isinstance(names, list) or len(names) != class_num:
        raise ThresholdsError(f"{path}: class_names lists "
                              f"{len(names) if isinstance(names, list) else 'no'} names but the "
                              f"model has {class_num} classes")
    return checked_thresholds(record.get(THRESHOLDS_KEY), class_num, path)


@dataclass(frozen=True)
class OutputRecord:
    """What a model file says of its outputs: ``task`` (None: it records none), the
    ``thresholds`` (float64 (K,)) and ``label_names`` of a multi-label model (None if not
    recorded), and the ``source`` they were read from (for messages)."""

    task: str | None
    thresholds: np.ndarray | None = None
    label_names: list[str] | None = None
    source: str = ""


def model_thresholds(record: OutputRecord | None, class_num: int) -> np.ndarray:
    """A multi-label model's thresholds: those ``record`` holds, else ``DEFAULT_THRESHOLD``
    for each of ``class_num`` classes; float64 (class_num,)."""
    if record is not None and record.thresholds is not None:
        return record.thresholds
    return np.full(class_num, DEFAULT_THRESHOLD)


def metadata_record(task: str, label_names: Sequence[str] | None = None,
                    thresholds=None) -> dict[str, str]:
    """An exported graph's metadata of ``task``; for ``multilabel`` also the thresholds and
    the label names when known (JSON text)."""
    record = {TASK_KEY: task}
    if task == "multilabel":
        record[THRESHOLDS_KEY] = json.dumps([float(v) for v in thresholds])
        if label_names:
            record[LABEL_NAMES_KEY] = json.dumps(list(label_names))
    return record


def read_metadata_record(metadata: dict[str, str], source: str) -> OutputRecord:
    """The ``OutputRecord`` of an exported graph's metadata (``metadata_record``'s keys; a
    graph exported before the task was recorded: ``multiclass``).

    Raises:
        ThresholdsError: For a task not in ``TASKS`` or malformed thresholds or names.
    """
    task = metadata.get(TASK_KEY, TASKS[0])
    if task not in TASKS:
        raise ThresholdsError(f"{source} records {TASK_KEY} {task!r}, not one of "
                              f"{', '.join(TASKS)}: not written by export.py?")
    try:
        thresholds, names = (json.loads(metadata[k]) if k in metadata else None
                             for k in (THRESHOLDS_KEY, LABEL_NAMES_KEY))
    except json.JSONDecodeError as err:
        raise ThresholdsError(f"{source}: its {THRESHOLDS_KEY} or {LABEL_NAMES_KEY} record is "
                              f"not JSON ({err})") from err
    if thresholds is not None:
        if not isinstance(thresholds, list):
            raise ThresholdsError(f"{source}: its {THRESHOLDS_KEY} record is not a list")
        thresholds = checked_thresholds(thresholds, len(thresholds), source)
    if names is not None and not (isinstance(names, list)
                                  and all(isinstance(n, str) for n in names)):
        raise ThresholdsError(f"{source}: its {LABEL_NAMES_KEY} record is not a list of names")
    return OutputRecord(task, thresholds, names, source)


def labels_above(probs: np.ndarray, thresholds: np.ndarray, names: Sequence[str]) -> list[dict]:
    """The classes of one image whose probability reaches its threshold, most probable first.

    Args:
        probs (numpy.ndarray): Sigmoid probabilities (K,).
        thresholds (numpy.ndarray): Per-class thresholds (K,).
        names (list[str]): Class names in label order.

    Returns:
        list[dict]: ``class``, ``name``, ``probability`` (rounded to 6 decimals).
    """
    order = np.argsort(-probs, kind="stable")
    return [{"class": int(i), "name": names[i], "probability": round(float(probs[i]), 6)}
            for i in order if probs[i] >= thresholds[i]]
