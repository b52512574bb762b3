"""The training loop of train.py: ``Model.train`` calls step by step (each epoch its own
pipeline) or in dataset sink calls (one pipeline for the run), LP-FT's two phases, and the
exit status of the run (``finish``). Steps are optimizer steps throughout.
"""
import json
import os
from collections.abc import Callable
from dataclasses import dataclass

from src.training.callbacks import NOT_WRITTEN, STOP_REASONS, StopAtStep

EXIT_NONFINITE, EXIT_SAVE_FAILED = 3, 4
"""Exit statuses: a non-finite loss or parameters, or too many overflowed steps; a checkpoint,
record or log line not written."""


@dataclass
class TrainCallbacks:
    """The callbacks of ``Model.train`` (train.py's ``build_callbacks``).

    Attributes:
        state (StepState): The per-step state, first of the callbacks; the others read it.
        monitor (TrainMonitor): Progress lines, ``metrics.jsonl``, evaluation.
        saver (CheckpointSaver): The periodic checkpoints.
        profiler (ProfileSteps or None): ``--profile_steps``.
        all (list): The list ``Model.train`` gets, in order.
    """

    state: object
    monitor: object
    saver: object
    profiler: object = None
    all: list = None


@dataclass(frozen=True)
class TrainPlan:
    """How a run's steps are laid out and fed.

    Attributes:
        epoch_size (int): Epochs of the run.
        steps_per_epoch (int): Optimizer steps per epoch (per device).
        grad_accumulation_steps (int): Batches (``Model`` steps) per optimizer step.
        sink_size (int): Optimizer steps per dataset-sink call; 0 = step by step.
        epoch_dataset (callable): ``(epoch, skip_steps) -> Dataset``: one epoch's pipeline,
            the batches of its first ``skip_steps`` optimizer steps skipped (step by step).
        run_dataset (callable): ``() -> Dataset``: the one pipeline of a sink-mode run.
    """

    epoch_size: int
    steps_per_epoch: int
    grad_accumulation_steps: int = 1
    sink_size: int = 0
    epoch_dataset: Callable | None = None
    run_dataset: Callable | None = None

    @property
    def total_steps(self):
        """Optimizer steps of the whole run."""
        return self.epoch_size * self.steps_per_epoch


def stopped(callbacks, stop):
    """Whether training must not go on: a signal, a non-finite loss or too many overflowed
    steps, or a checkpoint or record not written (in data parallel: as the ranks agreed, so
    every rank returns the same)."""
    return bool(stop.received or callbacks.state.must_stop)


def train_run(model, callbacks, plan, start_step, stop, *, probe_end=0, fine_tune=None):
    """Train from ``start_step`` to the end of the run, or until a stop, step by step
    (``train_step_by_step``) or in sink calls (``train_in_sink_calls``). With LP-FT
    (``probe_end`` > ``start_step``, the step at which the linear probe ends): the linear probe
    up to step ``probe_end``, then, unless stopped before, the model ``fine_tune(model)``
    returns from there (a second ``Model.train`` call, on a pipeline of its own in sink mode).

    Args:
        model (Model): The training ``Model``.
        callbacks (TrainCallbacks): Its callbacks.
        plan (TrainPlan): Steps, sink size and the pipelines.
        start_step (int): Optimizer steps already done (a resumed run's).
        stop (StopSignals): The run's signal handler.
        probe_end (int): LP-FT's switch step; 0 = no LP-FT.
        fine_tune (callable, optional): ``Model -> Model``, LP-FT's switch.
    """
    if probe_end and start_step < probe_end:
        train_until(model, callbacks, plan, start_step, probe_end, stop)
        if stopped(callbacks, stop) or callbacks.state.global_step < probe_end:
            return
        model, start_step = fine_tune(model), probe_end
    train_until(model, callbacks, plan, start_step, plan.total_steps, stop)


def train_until(model, callbacks, plan, start_step, end_step, stop):
    """Train from ``start_step`` to ``end_step`` (an epoch boundary), step by step or in sink
    calls (``plan.sink_size``)."""
    if plan.sink_size:
        train_in_sink_calls(model, callbacks, plan, start_step, stop, end_step=end_step)
    else:
        train_step_by_step(model, callbacks, plan, start_step, stop, end_step=end_step)


def train_step_by_step(model, callbacks, plan, start_step, stop, end_step=None):
    """Train from ``start_step`` to ``end_step`` (an epoch boundary; default: the end of the
    run), or until a stop, one batch per call (with ``grad_accumulation_steps`` k, k calls per
    optimizer step): each epoch its own pipeline (``plan.epoch_dataset``), the batches a
    resumed run has already trained skipped, so a resumed run sees the same augmented images
    in the same order as an uninterrupted one. One ``Model.train`` call per epoch; the graph
    is compiled once (step-by-step calls reuse it)."""
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


def train_in_sink_calls(model, callbacks, plan, start_step, stop, end_step=None):
    """Train from ``start_step`` to ``end_step`` (an epoch boundary, a multiple of
    ``plan.sink_size``; default: the end of the run), or until a stop, in dataset sink mode
    (GPU/Ascend): one pipeline (``plan.run_dataset``) and one ``Model.train`` call for the
    run, so the sunk training graph is compiled once (``connect_network_with_dataset`` keeps
    one graph per dataset object: a new pipeline per epoch would compile the graph again).

    A resumed run starts the pipeline at its step (``set_init_step``): the same images in the
    same order and the same LR as an uninterrupted run; MindSpore's fast recovery (on by
    default) skips the random augmentation of the skipped batches, so the augmentation draws
    from there on differ from the uninterrupted run's. A run resumed off a call boundary (a
    checkpoint of step-by-step training or of ``save_checkpoint_steps``) first trains step by
    step up to the next boundary, on its own copy of the run pipeline: one more pipeline, one
    more ``Model.train`` call and the step-by-step graph compiled once more.

    With LP-FT each phase is one such call on its own pipeline (started at the switch step
    for the second), so the run compiles two training graphs.

    With ``grad_accumulation_steps`` k a call of ``sink_size`` optimizer steps feeds the
    device k x ``sink_size`` batches and the pipeline starts at batch k x ``start_step``.
    """
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


def finish(callbacks, stop, total_steps, output_dir, log):
    """Exit status and the closing message: done, a checkpoint, record or log line not
    written, a non-finite loss, too many overflowed steps or stopped by a signal (a signal
    after the last step still ends "done"). In data parallel every rank exits with the status
    of the failure the ranks agreed on (``StepState.stopped_by``); a rank other than the one
    that stopped says which rank stopped and why.

    Returns:
        int: 0 done, ``EXIT_NONFINITE``, ``EXIT_SAVE_FAILED`` or 128 + the signal number.
    """
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


def own_failure(callbacks):
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
    with the numbers of the last record of ``output_dir``'s metrics.jsonl, then the file
    closed; nothing without a tracker."""
    tracker = callbacks.monitor.tracker
    if tracker is None:
        return
    last = {}
    records = os.path.join(output_dir, "metrics.jsonl")
    if os.path.isfile(records):
        with open(records, encoding="utf-8") as f:
            lines = [line for line in f if line.strip()]
        last = json.loads(lines[-1]) if lines else {}
    metrics = {f"hparams/{key}": last[key] for key in ("loss", "top1", "top5", "best_top1",
                                                       "ema_top1") if key in last}
    tracker.hparams(config, metrics, callbacks.state.global_step)
    tracker.close()
