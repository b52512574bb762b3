"""What a model's outputs mean, by its task (``src.utils.tasks``): the probabilities of the
logits (softmax, or a sigmoid per class), a multi-label model's per-class decision thresholds
(its record's, else 0.5) and the labels at or above them. See
docs/deployment.md#multi-label-models.
"""
from collections.abc import Sequence

import numpy as np

from src.utils.model_record import ModelRecord
from src.utils.multilabel_metrics import DEFAULT_THRESHOLD
from src.utils.tasks import TASKS, Task, get_task, softmax

__all__ = ["TASKS", "labels_above", "model_probabilities", "model_thresholds", "probabilities",
           "softmax"]


def probabilities(logits: np.ndarray, task: "str | Task") -> np.ndarray:
    """Class probabilities of logits (N, K) by ``task`` (a ``Task`` or its name): its
    ``probabilities`` (softmax over K, or a sigmoid per class); float32 logits give float32,
    float64 float64.

    Raises:
        ValueError: If ``task`` is not one of ``TASKS``.
    """
    return get_task(task).probabilities(np.asarray(logits))


def model_probabilities(logits: np.ndarray, model: ModelRecord) -> np.ndarray:
    """The probabilities a model file's record says its logits (N, K) mean: its task's
    ``probabilities`` of the logits divided by its calibration ``temperature`` (none
    recorded: 1). Every eval and predict path goes through it.

    Raises:
        ValueError: If the record's task is not one of ``TASKS``.
    """
    logits = np.asarray(logits)
    if model.temperature is not None:
        logits = logits / np.asarray(model.temperature, logits.dtype)
    return model.task_object.probabilities(logits)


def model_thresholds(record: ModelRecord | None, class_num: int) -> np.ndarray:
    """A multi-label model's thresholds: those ``record`` holds, else ``DEFAULT_THRESHOLD``
    for each of ``class_num`` classes; float64 (class_num,)."""
    if record is not None and record.thresholds is not None:
        return np.asarray(record.thresholds, np.float64)
    return np.full(class_num, DEFAULT_THRESHOLD)


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
