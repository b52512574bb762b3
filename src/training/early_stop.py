"""Early stopping (``early_stopping_patience``, ``early_stopping_min_delta``): end a run whose
evaluated metric has stopped improving, at an epoch's end, on every rank alike. The rules,
and why epochs are counted rather than evaluations: docs/training.md#early-stopping."""
import json
import logging
from collections.abc import Callable

from mindspore.train import Callback, RunContext

from src.training.best import BestCheckpoint, stored_score
from src.training.callbacks import NOT_WRITTEN, StepState
from src.utils.errors import WriteError
from src.utils.files import append_line
from src.utils.tasks import MULTICLASS, Task
from src.utils.tracking import TensorBoardLog


class Patience:
    """The decision: the reference is the first evaluated score, then every score above it by
    more than ``min_delta`` (the metric's units, a fraction for top-1); evaluated epoch E
    stops the run when ``E - reference epoch >= patience`` (epochs, 1-based), unless E is
    ``last_epoch``. Epochs up to ``first_epoch`` (LP-FT's linear probe) are not counted.
    Keras' ``EarlyStopping`` and NVIDIA DeepLearningExamples' ``--early-stopping-patience``.

    Args:
        patience (int): Epochs without improvement that stop the run; 0 = never.
        min_delta (float): >= 0.
        first_epoch (int): The last epoch not counted (0 = every epoch counts).
        last_epoch (int): The run's last epoch (it ends there anyway).
        task (Task): Whose ``score_key`` names the score in ``state()`` and whose
            ``is_better`` says what an improvement is.
    """

    def __init__(self, patience: int, min_delta: float = 0.0, *, first_epoch: int = 0,
                 last_epoch: int | None = None, task: Task = MULTICLASS):
        self.patience, self.min_delta, self.task = patience, min_delta, task
        self.key = task.score_key
        self.first_epoch, self.last_epoch = first_epoch, last_epoch
        self.score = self.epoch = None  # the reference: score and its 1-based epoch
        self.stopped = None  # the epoch whose evaluation stopped the run

    def observe(self, score: float, epoch: int) -> bool:
        """Take the evaluation of ``epoch`` (1-based); returns whether the run stops there."""
        if not self.patience or epoch <= self.first_epoch:
            return False
        if self.task.is_better(score, self.score, self.min_delta):
            self.score, self.epoch = score, epoch
        elif (self.epoch is not None and epoch - self.epoch >= self.patience
              and epoch != self.last_epoch):
            self.stopped = epoch
        return self.stopped == epoch

    def state(self) -> dict | None:
        """For the checkpoints: ``{key, "epoch", "stopped"}`` (the reference; the stopping
        epoch or None), or None before the first counted evaluation."""
        if self.epoch is None:
            return None
        return {self.key: self.score, "epoch": self.epoch, "stopped": self.stopped}

    def restore(self, stored: dict | None, *, restart_at: int | None = None) -> None:
        """Continue from ``stored`` (``state()``, or None); if it stopped at epoch
        ``restart_at``, count from there again (a stopped run extended with ``--overwrite``)."""
        if stored is not None:
            self.score, self.epoch = stored_score(stored), int(stored["epoch"])
            if restart_at is not None and stored.get("stopped") == restart_at:
                self.epoch = restart_at



def ended_early(stored: dict | None, epoch: int, patience: int | None) -> bool:
    """Whether a checkpoint of ``epoch`` storing ``stored`` (``Patience.state()``) ends the run:
    it stopped there early and ``patience`` would stop it too (None: not given, the stored
    decision stands; 0: early stopping off)."""
    if not stored or stored.get("stopped") != epoch:
        return False
    return patience is None or (patience > 0 and epoch - int(stored["epoch"]) >= patience)


def with_early_stop(score: Callable[[], dict | None],
                    patience: Patience | None) -> Callable[[], dict | None]:
    """The saver's ``best``: ``score()`` (``BestCheckpoint.score``) with ``patience``'s state
    under ``"early_stop"``, so a resumed run goes on counting; ``score`` without ``patience``."""
    if patience is None:
        return score

    def stored() -> dict | None:
        best, state = score(), patience.state()
        return dict(best, early_stop=state) if best is not None and state else best
    return stored


class EarlyStop(Callback):
    """At each evaluated epoch's end (listed after ``TrainMonitor``, before the saver): feed
    ``best``'s last evaluation to ``patience``; on a stop, note it in ``state.early_stop``
    (the saver saves, the loop ends), log one line naming the best checkpoint, append an
    ``{"event": "early_stop"}`` record to ``metrics_path`` and a TensorBoard text, and stop
    ``Model.train``. Every rank decides alike: the scores are summed over the ranks."""

    def __init__(self, patience: Patience, best: BestCheckpoint, state: StepState, *,
                 steps_per_epoch: int, metrics_path: str | None, logger: logging.Logger,
                 tracker: TensorBoardLog | None = None):
        super().__init__()
        self.patience, self.best, self.state = patience, best, state
        self.steps_per_epoch = steps_per_epoch
        self.metrics_path, self.logger, self.tracker = metrics_path, logger, tracker

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        step = self.state.global_step
        epoch, into = divmod(step, self.steps_per_epoch)
        if self.state.must_stop or into or self.best.last is None or self.best.last[0] != epoch:
            return  # mid-epoch (a sink call), a failure, or no evaluation at this epoch
        if not self.patience.observe(self.best.last[1], epoch):
            return
        self.state.early_stop = epoch
        p, metric = self.patience, self.best.metric
        moved = "risen above" if p.task.higher_is_better else "fallen below"
        line = (f"early stopping after epoch {epoch}: {metric} has not {moved} "
                f"{p.score:.6g} (epoch {p.epoch}) by more than {p.min_delta:g} for "
                f"{epoch - p.epoch} epochs (early_stopping_patience {p.patience}); best epoch "
                f"{self.best.epoch}, {metric} {self.best.top1:.6g}: {self.best.path}")
        self.logger.info("%s", line)
        record = {"event": "early_stop", "epoch": epoch, "step": step, "metric": metric,
                  "patience": p.patience, "min_delta": p.min_delta, "reference_epoch": p.epoch,
                  "best_epoch": self.best.epoch, "best": self.best.top1,
                  "checkpoint": self.best.path}
        if self.tracker is not None:
            self.tracker.text("run/early_stop", step, line)
        try:
            if self.metrics_path:
                append_line(self.metrics_path, json.dumps(record))
        except WriteError as err:
            self.logger.error("%s", err)
            self.state.fail(NOT_WRITTEN, run_context)
        run_context.request_stop()
