"""The tasks a model is trained for, one ``Task`` object each in ``TASKS``: how its logits
become probabilities, the score that picks the best checkpoint, the losses it takes and the
keys it changes, what its records hold. The rest of the package reads these objects instead
of comparing task names. See docs/layout.md#the-task-and-the-model-record.
"""
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from src.utils.multilabel_metrics import sigmoid


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of a float array (N, K), numerically stable, in its dtype."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


@dataclass(frozen=True)
class Task:
    """What one task means wherever a model is trained, scored, recorded or served.

    Attributes:
        name (str): The ``task`` config value.
        probabilities (callable): float logits (N, K) -> probabilities (N, K), same dtype.
        score_key (str): The evaluation metric that picks the best checkpoint and drives early
            stopping (``top1`` or ``mAP``, fractions in [0, 1]); ``score_name`` its words.
        higher_is_better (bool): Whether a larger ``score_key`` is better.
        losses (tuple[str, ...]): The ``loss`` values it trains with.
        defaults (Mapping): Config values it takes for the keys the user did not set.
        refused (Mapping): key -> value the key must keep for this task (else a named error).
        problem_type (str): Hugging Face's ``problem_type`` name in ``config.json``.
        multi_hot (bool): Targets are float multi-hot (N, K) rather than class indices (N,).
        uses_thresholds (bool): Answers are the classes at or above per-class thresholds.
        label_file (bool): Its data is a label file (``label_file``), not class folders.
    """

    name: str
    probabilities: Callable[[np.ndarray], np.ndarray]
    score_key: str
    score_name: str = ""
    higher_is_better: bool = True
    losses: tuple[str, ...] = ()
    defaults: Mapping = field(default_factory=dict)
    refused: Mapping = field(default_factory=dict)
    problem_type: str = ""
    multi_hot: bool = False
    uses_thresholds: bool = False
    label_file: bool = False

    def is_better(self, score: float, best: float | None, min_delta: float = 0.0) -> bool:
        """Whether ``score`` beats ``best`` (None: nothing yet) by more than ``min_delta``
        (>= 0) in the direction of ``higher_is_better``; a NaN score never does."""
        if score != score:  # NaN: no score (e.g. no positive label to rank)
            return False
        if best is None:
            return True
        return score > best + min_delta if self.higher_is_better else score < best - min_delta

    def __str__(self) -> str:
        return self.name


MULTICLASS = Task("multiclass", softmax, "top1", "top-1", losses=("ce", "bce"),
                  problem_type="single_label_classification")
MULTILABEL = Task("multilabel", sigmoid, "mAP", "mAP", losses=("bce", "asl"),
                  defaults=MappingProxyType({"loss": "bce", "label_smoothing": 0.0}),
                  problem_type="multi_label_classification", multi_hot=True,
                  uses_thresholds=True, label_file=True)

TASKS: Mapping[str, Task] = MappingProxyType({t.name: t for t in (MULTICLASS, MULTILABEL)})
"""Every task by name; the first is the default of a model that records none."""
DEFAULT_TASK = MULTICLASS
PROBLEM_TYPES: Mapping[str, Task] = MappingProxyType({t.problem_type: t for t in TASKS.values()})
"""``config.json``'s ``problem_type`` -> its task."""


def get_task(name: "str | Task") -> Task:
    """The ``Task`` of a name (a ``Task`` is returned as it is).

    Raises:
        ValueError: If ``name`` is not a key of ``TASKS`` (lists them).
    """
    if isinstance(name, Task):
        return name
    if name not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {name!r}")
    return TASKS[name]
