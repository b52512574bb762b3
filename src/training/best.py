"""The run's best checkpoint (``NET-best.ckpt``): which evaluation is the best, its weights
written with their score, the score given to every periodic checkpoint and restored on resume.

The one owner of "best", as timm's ``CheckpointSaver`` (``timm/utils/checkpoint_saver.py``)
owns it; the evaluator (``src.training.evaluator``) only measures.
"""
import json
import os
from collections.abc import Callable

from src.utils.checkpoint import BEST_KEY, atomic_save_checkpoint


def best_checkpoint_path(output_dir: str, prefix: str) -> str:
    """The run's best checkpoint: ``output_dir/PREFIX-best.ckpt``."""
    return os.path.join(output_dir, f"{prefix}-best.ckpt")


class BestCheckpoint:
    """The best evaluation so far and its checkpoint.

    The score is ``{"top1", "epoch"}``: the chosen metric's value (a fraction in [0, 1]) and
    the 1-based epoch it was reached at. An evaluation is a new best when its chosen metric
    is strictly higher than the best so far. The checkpoint holds the weights it was chosen
    on under the network's parameter names, and its score under ``BEST_KEY`` (a resume
    compares it). In data parallel every rank holds one, decides from the same summed numbers
    (so the same), and only the one with ``write`` saves; a checkpoint that cannot be written
    is recorded in ``error`` (``TrainMonitor`` then stops training, the ranks agree on it),
    and nothing more is written.

    Args:
        path (str): Where the best checkpoint is written (atomically).
        on_ema (bool): Choose by the weight EMA's top-1 (``ema_top1``) instead of the live
            network's (``top1``); only with an EMA evaluated.
        write (bool): Whether this process writes the checkpoint (rank 0).
    """

    def __init__(self, path, on_ema=False, write=True):
        self.path, self.write = path, write
        self.metric = "ema_top1" if on_ema else "top1"
        self.top1 = -1.0
        self.epoch = None
        self.is_new = False  # whether the last evaluation set a new best
        self.error = None  # why the checkpoint could not be written

    def score(self):
        """The best so far, for the periodic checkpoints: ``{"top1", "epoch"}``, or None
        before the first evaluation."""
        return None if self.epoch is None else {"top1": self.top1, "epoch": self.epoch}

    def restore(self, stored, in_folder=None):
        """Continue a resumed run from the higher of ``stored`` (the resumed checkpoint's
        score, ``src.utils.checkpoint.stored_best``) and ``in_folder`` (the score of the best
        checkpoint of the folder the run continues, ``src.training.resume.folder_best``;
        ``stored`` on a tie), so a worse evaluation after a resume does not replace the best
        checkpoint. Either may be None (nothing yet). Every rank reads the same files, so every
        rank holds the same value."""
        best = stored
        if in_folder is not None and (stored is None
                                      or float(in_folder["top1"]) > float(stored["top1"])):
            best = in_folder
        if best is not None:
            self.top1, self.epoch = float(best["top1"]), int(best["epoch"])

    def update(self, metrics, epoch, network):
        """Take the evaluation after ``epoch`` (1-based): when ``metrics[self.metric]`` beats
        the best, it becomes the best and ``network`` (the network that metric measured,
        ``Evaluator.network``) is written with its score (by the writing process, unless an
        earlier write failed).

        Returns:
            bool: Whether it is a new best (also in ``is_new``).
        """
        self.is_new = metrics[self.metric] > self.top1
        if self.is_new:
            self.top1, self.epoch = metrics[self.metric], epoch
            if self.write and not self.error:
                self.save(network)
        return self.is_new

    def save(self, network):
        """Write ``network`` with the score as the best checkpoint, atomically; a failure is
        recorded in ``error``, not raised: in data parallel the other ranks must learn of it
        in the ranks' agreement."""
        try:
            atomic_save_checkpoint(network, self.path, {BEST_KEY: json.dumps(self.score())})
        except (OSError, RuntimeError) as err:
            self.error = (f"cannot write the best checkpoint {self.path}: "
                          f"{str(err).splitlines()[0]}")

    def record(self, metrics):
        """An epoch record's evaluation part: ``metrics`` with ``best_top1`` (the best so far)
        before ``eval_images``."""
        record = {key: value for key, value in metrics.items() if key != "eval_images"}
        record["best_top1"] = self.top1
        if "eval_images" in metrics:
            record["eval_images"] = metrics["eval_images"]
        return record


class EvalKeepingBest:
    """``TrainMonitor``'s ``evaluator``: evaluate, let ``best`` take the result, return the
    record's evaluation part (``BestCheckpoint.record``); ``error`` is ``best``'s.

    Args:
        evaluator (Evaluator): ``evaluator() -> metrics`` and ``network(metric)``.
        best (BestCheckpoint): The best so far.
    """

    def __init__(self, evaluator, best):
        self.evaluator, self.best = evaluator, best

    def __call__(self, epoch):
        metrics = self.evaluator()
        self.best.update(metrics, epoch, self.evaluator.network(self.best.metric))
        return self.best.record(metrics)

    @property
    def error(self):
        """Why the best checkpoint could not be written, or None."""
        return self.best.error


def confusion_at_best(tracker, evaluator, best: BestCheckpoint, class_names: list[str],
                      plot: Callable) -> Callable[[int, int], None] | None:
    """``TrainMonitor``'s ``after_eval`` for TensorBoard: after an evaluation that set a new
    best, the chosen network's confusion matrix (kept by ``evaluator``) drawn by
    ``plot(confusion, class_names, path)`` (eval.py's ``--plot`` picture) as image
    ``eval/confusion_matrix`` at that step; None without ``tracker`` or ``evaluator``."""
    if tracker is None or evaluator is None:
        return None

    def after_eval(step, epoch):
        if best.is_new and evaluator.confusion is not None:
            tracker.drawn_image("eval/confusion_matrix", step, lambda path: plot(
                evaluator.confusion, class_names, path))
    return after_eval
