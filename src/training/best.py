"""The run's best checkpoint (``NET-best.ckpt``): which evaluation is the best, its
weights written with their score, the score stored in every periodic checkpoint and restored
on resume; the one owner of "best", as timm's ``CheckpointSaver``."""
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import mindspore.nn as nn

from src.utils.checkpoint import BEST_KEY, RECORD_KEY, atomic_save_checkpoint
from src.utils.tasks import MULTICLASS, TASKS, Task
from src.utils.tracking import TensorBoardLog

if TYPE_CHECKING:
    from src.training.evaluator import Evaluator


SCORE_KEYS = tuple(dict.fromkeys(task.score_key for task in TASKS.values()))
"""The names a stored best score goes by: each task's ``score_key``."""


def stored_score(stored: dict) -> float:
    """The score of a stored best (``BestCheckpoint.score``, ``Patience.state``), under
    whichever of ``SCORE_KEYS`` it holds.

    Raises:
        KeyError: If it holds none of them.
    """
    for key in SCORE_KEYS:
        if key in stored:
            return float(stored[key])
    raise KeyError(f"a stored best score needs one of {', '.join(SCORE_KEYS)}, got {stored}")


def best_checkpoint_path(output_dir: str, prefix: str) -> str:
    """The run's best checkpoint: ``output_dir/PREFIX-best.ckpt``."""
    return os.path.join(output_dir, f"{prefix}-best.ckpt")


class BestCheckpoint:
    """The best evaluation so far (``{"top1", "epoch"}``: the chosen metric, a
    fraction, and its 1-based epoch; a new best is strictly better by the task's
    ``is_better``) and its checkpoint, holding the weights it was chosen on, the score under
    ``BEST_KEY`` and the model record under ``RECORD_KEY``. In data parallel every rank
    decides alike and only ``write`` saves; a failed write is kept in ``error`` (the run stops).

    Args:
        path (str): Where the checkpoint is written (atomically).
        on_ema (bool): Choose by the EMA's score (``ema_top1``) instead of the live one's.
        write (bool): This process writes (rank 0).
        task (Task): Whose ``score_key`` and ``is_better`` decide.
        model_record (str): The run's model record (JSON text) stored with the weights.
    """

    def __init__(self, path: str, on_ema: bool = False, write: bool = True, *,
                 task: Task = MULTICLASS, model_record: str = ""):
        self.path, self.write, self.task = path, write, task
        self.key = task.score_key
        self.model_record = model_record
        self.metric = f"ema_{self.key}" if on_ema else self.key
        self.top1 = None  # the best score (None: no evaluation yet)
        self.epoch = None
        self.is_new = False  # whether the last evaluation set a new best
        self.last = None  # the last evaluation: (epoch, score)
        self.error = None  # why the checkpoint could not be written

    def score(self) -> dict | None:
        """The best so far, for the periodic checkpoints: ``{"top1", "epoch"}``, or None
        before the first evaluation."""
        return None if self.epoch is None else {self.key: self.top1, "epoch": self.epoch}

    def restore(self, stored: dict | None, in_folder: dict | None = None) -> None:
        """Continue a resumed run from the higher of ``stored`` (the resumed
        checkpoint's score) and ``in_folder`` (the folder's ``NET-best.ckpt``'s, ``folder_best``;
        ``stored`` on a tie); either may be None."""
        best = stored
        if in_folder is not None and (stored is None or self.task.is_better(
                stored_score(in_folder), stored_score(stored))):
            best = in_folder
        if best is not None:
            self.top1, self.epoch = stored_score(best), int(best["epoch"])

    def update(self, metrics: dict[str, float], epoch: int, network: nn.Cell) -> bool:
        """Take the evaluation ``metrics`` after ``epoch`` (1-based): if
        ``metrics[self.metric]`` beats the best, record it and save ``network`` (the one that metric
        measured) unless an earlier write failed. Returns whether it is a new best (``is_new``)."""
        self.is_new = self.task.is_better(metrics[self.metric], self.top1)
        self.last = (epoch, metrics[self.metric])
        if self.is_new:
            self.top1, self.epoch = metrics[self.metric], epoch
            if self.write and not self.error:
                self.save(network)
        return self.is_new

    def save(self, network: nn.Cell) -> None:
        """Write ``network`` with the score, atomically; a failure goes to
        ``error`` (the ranks must agree on it), not raised."""
        try:
            entries = {BEST_KEY: json.dumps(self.score())}
            if self.model_record:
                entries[RECORD_KEY] = self.model_record
            atomic_save_checkpoint(network, self.path, entries)
        except (OSError, RuntimeError) as err:
            self.error = (f"cannot write the best checkpoint {self.path}: "
                          f"{str(err).splitlines()[0]}")

    def record(self, metrics: dict[str, float]) -> dict[str, float]:
        """An epoch record's evaluation part: ``metrics`` with ``best_top1`` (the best so far)
        before ``eval_images``."""
        record = {key: value for key, value in metrics.items() if key != "eval_images"}
        record[f"best_{self.key}"] = self.top1
        if "eval_images" in metrics:
            record["eval_images"] = metrics["eval_images"]
        return record


class EvalKeepingBest:
    """``TrainMonitor``'s ``evaluator``: run ``evaluator`` (an ``Evaluator``), let
    ``best`` take the result, return the record's evaluation part; ``error`` is ``best``'s."""

    def __init__(self, evaluator: "Evaluator", best: BestCheckpoint):
        self.evaluator, self.best = evaluator, best

    def __call__(self, epoch):
        metrics = self.evaluator()
        self.best.update(metrics, epoch, self.evaluator.network(self.best.metric))
        return self.best.record(metrics)

    @property
    def error(self) -> str | None:
        """Why the best checkpoint could not be written, or None."""
        return self.best.error


def confusion_at_best(tracker: TensorBoardLog | None, evaluator: "Evaluator | None",
                      best: BestCheckpoint, class_names: list[str],
                      plot: Callable) -> Callable[[int, int], None] | None:
    """``TrainMonitor``'s ``after_eval``: after a new best, the chosen network's
    confusion matrix drawn by ``plot(confusion, class_names, path)`` as TensorBoard image
    ``eval/confusion_matrix``; None without ``tracker`` or ``evaluator``."""
    if tracker is None or evaluator is None:
        return None

    def after_eval(step: int, epoch: int) -> None:
        if best.is_new and evaluator.confusion is not None:
            tracker.drawn_image("eval/confusion_matrix", step, lambda path: plot(
                evaluator.confusion, class_names, path))
    return after_eval
