"""What a model's outputs mean, by its task (``src.utils.tasks``): the probabilities of the
logits (softmax, or a sigmoid per class), a multi-label model's per-class decision thresholds
(its record's, else 0.5) and the labels at or above them, and the answer for one image that
predict.py prints and serve.py returns (``image_answer``). See
docs/deployment.md#multi-label-models.
"""
from collections.abc import Sequence

import numpy as np

from src.utils.model_record import ModelRecord
from src.utils.multilabel_metrics import DEFAULT_THRESHOLD
from src.utils.ood import unknown_marks
from src.utils.tasks import TASKS, Task, get_task, softmax

__all__ = ["TASKS", "batch_answers", "image_answer", "labels_above", "model_outputs",
           "model_probabilities", "model_thresholds", "probabilities", "softmax", "top_classes"]


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


def top_classes(probs: np.ndarray, names: Sequence[str], top_k: int) -> list[dict]:
    """The ``top_k`` most probable classes of one image, most probable first.

    Args:
        probs (numpy.ndarray): Class probabilities (K,).
        names (list[str]): Class names in label order.
        top_k (int): How many (at most K).

    Returns:
        list[dict]: ``class`` (label), ``name`` and ``probability`` (rounded to 6 decimals).
    """
    return [{"class": int(i), "name": names[i], "probability": round(float(probs[i]), 6)}
            for i in np.argsort(-probs)[:top_k]]


def model_outputs(model: ModelRecord) -> tuple[list[str], np.ndarray | None]:
    """The class names of a resolved ``model`` (its record's, ``class_<i>`` when none is
    known) and, for a task with thresholds (multilabel), its thresholds (the record's, else
    0.5 each; ``model_thresholds``); None otherwise."""
    names = list(model.class_names or [f"class_{i}" for i in range(model.class_num)])
    thresholds = (model_thresholds(model, model.class_num)
                  if model.task_object.uses_thresholds else None)
    return names, thresholds


def batch_answers(logits: np.ndarray, model: ModelRecord, names: Sequence[str],
                  thresholds: np.ndarray | None, top_k: int) -> list[dict]:
    """The answers for a batch of images, as predict.py prints them and serve.py returns them:
    each image's ``image_answer`` of ``model_probabilities`` of its logits (N, K), with its
    ``unknown`` mark and ``ood`` score when the model records a rejection threshold
    (``src.utils.ood.unknown_marks``, from the raw logits)."""
    probs = model_probabilities(logits, model)
    marks = unknown_marks(logits, model.ood_score, model.ood_threshold) or [{}] * len(probs)
    return [{**image_answer(row, names, thresholds, top_k), **mark}
            for row, mark in zip(probs, marks)]


def image_answer(probs: np.ndarray, names: Sequence[str], thresholds: np.ndarray | None,
                 top_k: int) -> dict:
    """The answer for one image, as predict.py prints it and serve.py returns it: ``labels``
    (``labels_above`` its ``thresholds``; only when given: a multi-label model) and ``top``
    (``top_classes``), from its probabilities (K,) and the ``model_outputs``."""
    answer = {}
    if thresholds is not None:
        answer["labels"] = labels_above(probs, thresholds, names)
    answer["top"] = top_classes(probs, names, top_k)
    return answer
