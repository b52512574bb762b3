"""The training loop of train.py: ``Model.train`` calls step by step (each epoch its own
pipeline) or in dataset sink calls (one pipeline for the run), LP-FT's two phases, and the
exit status of the run (``finish``). Steps are optimizer steps throughout.
"""
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from mindspore.train import Callback, Model

from src.training.callbacks import NOT_WRITTEN, STOP_REASONS, StepState, StopAtStep, TrainMonitor
from src.training.profiler import ProfileSteps
from src.training.saver import CheckpointSaver
from src.training.signals import StopSignals
from src.utils.tasks import TASKS

EXIT_NONFINITE, EXIT_SAVE_FAILED = 3, 4
"""Exit statuses: a non-finite loss or parameters, or too many overflowed steps; a checkpoint,
record or log line not written."""


@dataclass
class TrainCallbacks:
    """The callbacks of ``Model.train``: ``state`` (first; the others read it), the
    ``monitor``, the ``saver``, the ``profiler`` (or None) and ``all``, the list in order."""

    state: StepState
    monitor: TrainMonitor
    saver: CheckpointSaver
    profiler: ProfileSteps | None = None
    all: list[Callback] | None = None


@dataclass(frozen=True)
class TrainPlan:
    """How a run's steps are laid out and fed: epochs, optimizer steps per epoch (per
    device), batches per optimizer step, optimizer steps per sink call (0 = step by step),
    ``epoch_dataset(epoch, skip_steps)`` (one epoch's pipeline, its first optimizer steps'
    batches skipped) and ``run_dataset()`` (the one pipeline of a sink-mode run)."""

    epoch_size: int
    steps_per_epoch: int
    grad_accumulation_steps: int = 1
    sink_size: int = 0
    epoch_dataset: Callable | None = None
    run_dataset: Callable | None = None

    @property
    def total_steps(self) -> int:
        """Optimizer steps of the whole run."""
        return self.epoch_size * self.steps_per_epoch


def stopped(callbacks: TrainCallbacks, stop: StopSignals) -> bool:
    """Whether training must not go on: a signal, a non-finite loss or too many overflowed
    steps, a checkpoint or record not written, or early stopping (in data parallel: as the
    ranks agreed, so every rank returns the same)."""
    return bool(stop.received or callbacks.state.must_stop or callbacks.state.early_stop)


def train_run(model: Model, callbacks: TrainCallbacks, plan: TrainPlan, start_step: int,
              stop: StopSignals, *, probe_end: int = 0,
              fine_tune: Callable[[Model], Model] | None = None) -> None:
    """Train from ``start_step`` (steps done) to the end of ``plan`` or a stop, step by
    step or in sink calls; with LP-FT (``probe_end`` > ``start_step``) the linear probe up to
    ``probe_end``, then, unless stopped, the ``Model`` ``fine_tune(model)`` returns."""
    if probe_end and start_step < probe_end:
        train_until(model, callbacks, plan, start_step, end_step=probe_end, stop=stop)
        if stopped(callbacks, stop) or callbacks.state.global_step < probe_end:
            return
        model, start_step = fine_tune(model), probe_end
    train_until(model, callbacks, plan, start_step, end_step=plan.total_steps, stop=stop)


def train_until(model: Model, callbacks: TrainCallbacks, plan: TrainPlan, start_step: int, *,
                end_step: int, stop: StopSignals) -> None:
    """Train from ``start_step`` to ``end_step`` (an epoch boundary), step by step or in sink
    calls (``plan.sink_size``)."""
    if plan.sink_size:
        train_in_sink_calls(model, callbacks, plan, start_step, stop=stop, end_step=end_step)
    else:
        train_step_by_step(model, callbacks, plan, start_step, stop=stop, end_step=end_step)


def train_step_by_step(model: Model, callbacks: TrainCallbacks, plan: TrainPlan, start_step: int,
                       *, stop: StopSignals, end_step: int | None = None) -> None:
    """Train from ``start_step`` to ``end_step`` (an epoch boundary; default
    the end) or a stop, one batch per call: each epoch its own pipeline, a resumed run's trained
    batches skipped (the same images in the same order as an uninterrupted run); one
    ``Model.train`` call per epoch, the graph compiled once."""
    steps_per_epoch = plan.steps_per_epoch
    end_epoch = plan.epoch_size if end_step is None else end_step // steps_per_epoch
    callbacks.state.set_call_size(1)
    for epoch in range(start_step // steps_per_epoch, end_epoch):
        if stopped(callbacks, stop):
            return
        skip = max(0, start_step - epoch * steps_per_epoch)
        dataset = plan.epoch_dataset(epoch, skip)
        model.train(epoch + 1, dataset, callbacks=callbacks.all, dataset_sink_mode=False,
                    initial_epoch=epoch)


def train_in_sink_calls(model: Model, callbacks: TrainCallbacks, plan: TrainPlan,
                        start_step: int, *, stop: StopSignals,
                        end_step: int | None = None) -> None:
    """Train from ``start_step`` to ``end_step`` (a multiple of
    ``plan.sink_size``; default the end) or a stop in dataset sink mode: one pipeline and one
    ``Model.train`` call per run (or per LP-FT phase), so the graph compiles once; a resume off a
    call boundary first trains step by step to the next. See
    docs/reliability.md#resuming-in-sink-mode."""
    sink_size = plan.sink_size
    total = plan.total_steps if end_step is None else end_step
    k = plan.grad_accumulation_steps  # Model steps (batches) per optimizer step
    to_boundary = -start_step % sink_size  # steps before the next sink-call boundary
    if to_boundary:
        dataset = plan.run_dataset()
        dataset.set_init_step(start_step * k)
        callbacks.state.set_call_size(1)
        model.train(plan.epoch_size, dataset, callbacks=callbacks.all + [StopAtStep(
            callbacks.state, start_step + to_boundary)], dataset_sink_mode=False,
                    initial_epoch=start_step // plan.steps_per_epoch)
        start_step += to_boundary
        if stopped(callbacks, stop) or callbacks.state.global_step < start_step:
            return
    dataset = plan.run_dataset()
    if start_step:
        dataset.set_init_step(start_step * k)
    callbacks.state.set_call_size(sink_size * k)
    model.train(total // sink_size, dataset, callbacks=callbacks.all, dataset_sink_mode=True,
                sink_size=sink_size * k, initial_epoch=start_step // sink_size)


def finish(callbacks: TrainCallbacks, stop: StopSignals, total_steps: int, output_dir: str,
           log: logging.Logger) -> int:
    """The exit status and closing message of a run: 0 done (also for a signal after the
    last step), ``EXIT_SAVE_FAILED``, ``EXIT_NONFINITE`` or 128 + the signal; in data parallel the
    agreed failure's (``StepState.stopped_by``), another rank's named."""
    state, saver = callbacks.state, callbacks.saver
    last = saver.last_saved or ("none" if saver.write else "named by rank 0")
    own = own_failure(callbacks)
    if own:
        log.error("stopped: %s; last good checkpoint: %s", own[0], last)
    if state.stopped_by:
        rank, reason, step = state.stopped_by
        if not own or reason != state.failure:
            log.error("stopped: rank %d stopped training (%s), every rank after global step "
                      "%d; last good checkpoint: %s", rank, STOP_REASONS[reason], step, last)
        return EXIT_SAVE_FAILED if reason == NOT_WRITTEN else EXIT_NONFINITE
    if own:
        return own[1]
    if stop.received and state.global_step < total_steps:
        log.warning("stopped by %s at global step %d, saved %s; resume with the same command "
                    "plus --resume_ckpt auto", stop.received, state.global_step,
                    saver.last_saved or "nothing (no step trained yet)")
        return 128 + stop.signum
    if stop.received:
        log.info("%s came after the last step: the run is complete", stop.received)
    log.info("done; outputs in %s; curves: python tools/plot_metrics.py %s -o %s", output_dir,
             os.path.join(output_dir, "metrics.jsonl"), os.path.join(output_dir, "curves.png"))
    return 0


def own_failure(callbacks: TrainCallbacks) -> tuple[str, int] | None:
    """This process's reason to stop, as (message, exit status), or None."""
    state, saver, monitor = callbacks.state, callbacks.saver, callbacks.monitor
    if monitor.error and not saver.error:
        return monitor.error, EXIT_SAVE_FAILED
    if saver.error:
        return saver.error, EXIT_NONFINITE if saver.diverged else EXIT_SAVE_FAILED
    if state.overflow_stop:
        return state.overflow_stop, EXIT_NONFINITE
    if state.nonfinite_step:
        return f"non-finite loss at global step {state.nonfinite_step}", EXIT_NONFINITE
    return None


def track_run_end(callbacks: TrainCallbacks, output_dir: str, config: dict) -> None:
    """TensorBoard at the end of a run: ``config`` (the resolved config) as hyperparameters
    with the numbers of the last epoch record of ``output_dir``'s metrics.jsonl, then the file
    closed; nothing without a tracker."""
    tracker = callbacks.monitor.tracker
    if tracker is None:
        return
    last = {}
    records = os.path.join(output_dir, "metrics.jsonl")
    if os.path.isfile(records):
        with open(records, encoding="utf-8") as f:
            lines = [line for line in f if line.strip()]
        epochs = [record for record in map(json.loads, lines) if "event" not in record]
        last = epochs[-1] if epochs else {}
    scores = [f"{prefix}{task.score_key}" for task in TASKS.values()
              for prefix in ("", "best_", "ema_")]
    metrics = {f"hparams/{key}": last[key] for key in ("loss", "top5", *scores) if key in last}
    tracker.hparams(config, metrics, callbacks.state.global_step)
    tracker.close()
