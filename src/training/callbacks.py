"""Training callbacks: the per-step state (``StepState``, listed first: the others read the
step it classified) and the progress lines with the metrics file (``TrainMonitor``). Signals,
checkpoints, evaluation and the best checkpoint have modules of their own."""
import collections
import json
import logging
import math
import time
from collections.abc import Callable, Sequence

import mindspore as ms
import numpy as np
from mindspore.train import Callback, RunContext

from src.utils.checkpoint import (
    KD_LOSS_PREFIX,
    OVERFLOW_COUNTER,
)
from src.utils.errors import WriteError
from src.utils.files import append_line
from src.utils.logger import log_file_error
from src.utils.tracking import TensorBoardLog

LOGGER = logging.getLogger(__name__)

NONFINITE_LOSS, OVERFLOW_STOP, NONFINITE_PARAMETERS, NOT_WRITTEN = 1, 2, 3, 4
STOP_REASONS = {NONFINITE_LOSS: "non-finite loss",
                OVERFLOW_STOP: "too many overflowed steps",
                NONFINITE_PARAMETERS: "non-finite parameters",
                NOT_WRITTEN: "a file not written: a checkpoint, metrics.jsonl or train.log"}
"""Why training must stop (``StepState.fail``), by code: small positive ints, so the ranks of
data parallel can exchange them (``StopSignals``)."""


def loss_value(net_outputs: ms.Tensor | Sequence[ms.Tensor]) -> float:
    """The loss as a Python float from ``cb_params.net_outputs`` (a Tensor or a tuple whose
    first item is the loss, as with loss scaling)."""
    if isinstance(net_outputs, (tuple, list)):
        net_outputs = net_outputs[0]
    return float(np.mean(net_outputs.asnumpy()))


def step_status(net_outputs: ms.Tensor | Sequence[ms.Tensor]) -> tuple[str, float]:
    """Classify a step from ``cb_params.net_outputs``.

    Returns:
        tuple(str, float): ``"ok"``, ``"overflow"`` (loss scaling detected an overflow and
        skipped the update) or ``"nonfinite"`` (a NaN/inf loss in fp32); and the loss.
    """
    loss = loss_value(net_outputs)
    if isinstance(net_outputs, (tuple, list)) and len(net_outputs) > 1 and bool(
            net_outputs[1].asnumpy()):
        return "overflow", loss
    return ("ok" if math.isfinite(loss) else "nonfinite"), loss


def passed_multiple(step: int, done: int, interval: int) -> bool:
    """Whether the last ``done`` steps, ending at ``step``, reached or passed a multiple of
    ``interval`` (one step at a time: ``step`` is a multiple; in sink mode: a call of
    ``done`` steps went past one)."""
    return step // interval > (step - done) // interval


def _overflow_counter(cb_params):
    """The training cell's count of overflowed steps (``TrainStep``'s ``overflow_count``
    parameter), or None for a cell without one (MindSpore's own cells, test doubles)."""
    network = (cb_params.get("train_network") if isinstance(cb_params, dict)
               else getattr(cb_params, "train_network", None))
    if network is None or not hasattr(network, "get_parameters"):
        return None
    return next((p for p in network.get_parameters() if p.name == OVERFLOW_COUNTER), None)


def _loss_parts(cb_params):
    """A distilling cell's loss parts of its last step: {"task_loss": Parameter,
    "distill_loss": Parameter} (``src.training.distill``), or {} for other cells."""
    network = (cb_params.get("train_network") if isinstance(cb_params, dict)
               else getattr(cb_params, "train_network", None))
    if network is None or not hasattr(network, "get_parameters"):
        return {}
    return {p.name[len(KD_LOSS_PREFIX):] + "_loss": p for p in network.get_parameters()
            if p.name.startswith(KD_LOSS_PREFIX)}


class StepState(Callback):
    """The one owner of the per-step state: global step (optimizer steps), the step's
    status and loss, the overflowed steps and the loss scale, and why training must stop. A
    non-finite loss or more than ``max_overflow_fraction`` of the last ``OVERFLOW_WINDOW`` steps
    overflowed requests a stop; every reason goes through ``fail`` (a ``STOP_REASONS`` code), and
    in data parallel (``agreed``) the ranks agree on it first (``StopSignals``). How calls of
    sink mode and gradient accumulation are counted: docs/reliability.md#step-state-and-stops.

    Args:
        start_step (int): Optimizer steps already done (resumed runs).
        max_overflow_fraction (float): In [0, 1]; 1 never stops.
        accumulation_steps (int): ``Model`` steps (micro-batches) per optimizer step.
    """

    OVERFLOW_WINDOW = 100

    def __init__(self, start_step: int = 0, max_overflow_fraction: float = 0.5,
                 accumulation_steps: int = 1):
        super().__init__()
        self.accumulation_steps = accumulation_steps
        self.model_steps_per_call = 1
        self.steps_per_call = 1
        self.micro_steps = 0  # Model steps since the last optimizer step ended
        self.step_ended = True  # whether the last call of the callbacks ended one
        self.global_step = start_step
        self.status, self.loss = "ok", None
        self.overflow_steps = 0
        self.loss_scale = None
        # (steps, overflowed steps) per call, newest last: the window of the stop
        self.recent_overflows = collections.deque()
        self.max_overflow_fraction = max_overflow_fraction
        self.nonfinite_step = None
        self.overflow_stop = None
        self.failure = None  # this process's first reason to stop (a STOP_REASONS code)
        self.agreed = False  # data parallel: stops wait for the ranks' agreement
        self.stopped_by = None  # (rank, reason, global step) the ranks agreed on
        self.early_stop = None  # the epoch early stopping ended the run at (not a failure)
        self._counter = None  # TrainStep's overflow_count, found at train begin
        self._counted = 0  # its value at the last read

    @property
    def must_stop(self) -> bool:
        """Whether training cannot go on (a ``STOP_REASONS`` failure): this process's in one
        process, the agreed one (``stopped_by``) in data parallel, so every rank takes the
        same path through the collectives that follow (evaluation, the save of a stop)."""
        return (self.stopped_by if self.agreed else self.failure) is not None

    def fail(self, reason: int, run_context: RunContext) -> None:
        """Note this process's reason to stop (a ``STOP_REASONS`` code; the first is kept).
        One process: training stops after this step. Data parallel: at the ranks' next
        agreement (``StopSignals``, at the end of every optimizer step and epoch)."""
        self.failure = self.failure or reason
        if not self.agreed:
            run_context.request_stop()

    def set_call_size(self, model_steps: int) -> None:
        """One call of the callbacks from now on covers ``model_steps`` ``Model`` steps: 1
        step by step, the sink size in dataset sink mode (then a multiple of
        ``accumulation_steps``)."""
        self.model_steps_per_call = model_steps
        self.steps_per_call = max(1, model_steps // self.accumulation_steps)

    def on_train_begin(self, run_context: RunContext) -> None:
        self._counter = _overflow_counter(run_context.original_args())
        self._counted = self._read_counter()

    def on_train_step_end(self, run_context: RunContext) -> None:
        steps, self.micro_steps = divmod(self.micro_steps + self.model_steps_per_call,
                                         self.accumulation_steps)
        self.step_ended = steps > 0
        if not self.step_ended:
            return  # the call only accumulated gradients
        outputs = run_context.original_args().net_outputs
        self.steps_per_call = steps
        self.global_step += steps
        self.status, self.loss = step_status(outputs)
        if isinstance(outputs, (tuple, list)) and len(outputs) > 2:
            self.loss_scale = float(np.mean(outputs[2].asnumpy()))
        overflowed = self._overflowed_steps()
        self.overflow_steps += overflowed
        self._add_to_window(steps, overflowed)
        self._check_overflow_fraction(run_context)
        if self.status == "nonfinite" and self.nonfinite_step is None:
            self.nonfinite_step = self.global_step
            self.fail(NONFINITE_LOSS, run_context)

    def _read_counter(self):
        return 0 if self._counter is None else int(self._counter.asnumpy().reshape(-1)[0])

    def _overflowed_steps(self):
        """Overflowed steps of the call that just ended."""
        if self._counter is None:
            return int(self.status == "overflow")
        total = self._read_counter()
        overflowed, self._counted = total - self._counted, total
        return overflowed

    def _add_to_window(self, steps, overflowed):
        """Append the call; drop the oldest calls the newer ones no longer need to cover
        ``OVERFLOW_WINDOW`` steps."""
        window = self.recent_overflows
        window.append((steps, overflowed))
        covered = sum(s for s, _ in window)
        while covered - window[0][0] >= self.OVERFLOW_WINDOW:
            covered -= window.popleft()[0]

    def _check_overflow_fraction(self, run_context):
        steps = sum(s for s, _ in self.recent_overflows)
        count = sum(n for _, n in self.recent_overflows)
        if (steps >= self.OVERFLOW_WINDOW and count > self.max_overflow_fraction * steps
                and self.overflow_stop is None):
            self.overflow_stop = (f"{count} of the last {steps} steps overflowed and "
                                  f"were skipped (max_overflow_fraction "
                                  f"{self.max_overflow_fraction}) at global step "
                                  f"{self.global_step}, loss scale {self.loss_scale}: the "
                                  f"model is not training (check the LR, the data, amp_level)")
            self.fail(OVERFLOW_STOP, run_context)


class OptimizerStepCallbacks(Callback):
    """Runs ``callbacks``' step hooks only on the calls that begin or end
    an optimizer step, so with gradient accumulation nothing (a line, a checkpoint, a stop, a
    profiled range) falls inside one; other hooks pass as they come. Listed after ``StepState``.

    Args:
        state (StepState): The per-step state.
        callbacks (list[Callback]): Called in this order.
        every_call (list[callable]): Called at the begin and end of every call first
            (``StopSignals.install``).
    """

    def __init__(self, state: StepState, callbacks: Sequence[Callback],
                 every_call: Sequence[Callable[[], None]] = ()):
        super().__init__()
        self.state, self.callbacks = state, list(callbacks)
        self.every_call = list(every_call)

    def _each(self, hook, run_context):
        for callback in self.callbacks:
            getattr(callback, hook)(run_context)

    def on_train_begin(self, run_context: RunContext) -> None:
        self._each("on_train_begin", run_context)

    def on_train_epoch_begin(self, run_context: RunContext) -> None:
        self._each("on_train_epoch_begin", run_context)

    def on_train_step_begin(self, run_context: RunContext) -> None:
        for call in self.every_call:
            call()
        if self.state.micro_steps == 0:
            self._each("on_train_step_begin", run_context)

    def on_train_step_end(self, run_context: RunContext) -> None:
        for call in self.every_call:
            call()
        if self.state.step_ended:
            self._each("on_train_step_end", run_context)

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        self._each("on_train_epoch_end", run_context)

    def on_train_end(self, run_context: RunContext) -> None:
        self._each("on_train_end", run_context)


EPOCH_TAGS = {"loss": "epoch/train_loss", "lr": "epoch/lr", "img_per_s": "epoch/img_per_s",
              "time_s": "epoch/time_s", "top1": "eval/top1", "top5": "eval/top5",
              "eval_loss": "eval/loss", "ema_top1": "eval/ema_top1", "ema_top5": "eval/ema_top5",
              "ema_eval_loss": "eval/ema_loss", "best_top1": "eval/best_top1",
              "task_loss": "epoch/train_task_loss", "distill_loss": "epoch/train_distill_loss",
              "mAP": "eval/mAP", "ema_mAP": "eval/ema_mAP", "best_mAP": "eval/best_mAP"}
"""TensorBoard tag of each number of an epoch record (``metrics.jsonl``)."""



def _running_sum(before: tuple[float, int], values: list[float]) -> dict:
    """``{"sum", "count"}`` of ``values`` added in order to ``before`` = (sum, count)."""
    return {"sum": float(sum(values, before[0])), "count": before[1] + len(values)}


class TrainMonitor(Callback):
    """Progress lines every ``log_interval`` steps and one JSON record per finished
    epoch in ``metrics_path`` (None: none; fields: docs/training.md#commands-and-outputs), with
    ``evaluator(epoch)``'s numbers (``EvalKeepingBest``) after every ``eval_interval`` epochs and
    the last, then ``after_eval(step, epoch)``. ``lr`` is the per-step LR array,
    ``global_batch_size`` the images per step over all devices; ``tracker`` (a
    ``TensorBoardLog``) also gets the numbers (``EPOCH_TAGS``) and ``lr_groups`` ``{tag:
    multiple}``'s LRs. A record, line or best checkpoint not written stops training
    (``StepState.fail``, ``error``); records are written atomically."""

    def __init__(self, state: StepState, *, lr: np.ndarray, global_batch_size: int,
                 steps_per_epoch: int, log_interval: int, metrics_path: str | None,
                 logger: logging.Logger, evaluator: Callable[[int], dict] | None = None,
                 eval_interval: int = 1, tracker: TensorBoardLog | None = None,
                 lr_groups: dict[str, float] | None = None,
                 after_eval: Callable[[int, int], None] | None = None):
        super().__init__()
        self.state = state
        self.lr = lr
        self.global_batch_size = global_batch_size
        self.steps_per_epoch = steps_per_epoch
        self.log_interval = max(1, log_interval)
        self.metrics_path = metrics_path
        self.logger = logger
        self.evaluator = evaluator
        self.eval_interval = max(1, eval_interval)
        self.tracker, self.lr_groups = tracker, dict(lr_groups or {})
        self.after_eval = after_eval
        self.start_step = state.global_step
        self.train_start = self.epoch_start = self.window_start = None
        self.epoch_losses = []
        self.epoch_steps = self.window_steps = 0
        self.error = None
        self.epoch_loss_before = (0.0, 0)  # (sum, count) of the epoch's losses before a resume
        self.resumed_loss = None  # a resumed checkpoint's, taken at the first epoch begin
        self.loss_parts, self.epoch_parts = {}, {}  # knowledge distillation's task, distill
        self.parts_before = {}  # their (sum, count) before a mid-epoch resume

    def on_train_begin(self, run_context: RunContext) -> None:
        self.train_start = self.train_start or time.time()
        self.loss_parts = _loss_parts(run_context.original_args())

    def on_train_epoch_begin(self, run_context: RunContext) -> None:
        # Model.train's epochs are sink calls in sink mode: reset at real epoch starts only
        if self.epoch_start is None or self.state.global_step % self.steps_per_epoch == 0:
            self.epoch_start = self.window_start = time.time()
            self.epoch_losses = []
            self.epoch_parts = {name: [] for name in self.loss_parts}
            self.epoch_steps = self.window_steps = 0
            stored = self.resumed_loss if self.state.global_step % self.steps_per_epoch else None
            self.epoch_loss_before = (stored["sum"], stored["count"]) if stored else (0.0, 0)
            self.parts_before = {name: (part["sum"], part["count"])
                                 for name, part in (stored or {}).get("parts", {}).items()}
            self.resumed_loss = None

    def epoch_loss(self) -> dict:
        """The losses of this epoch so far (``{"sum": float, "count": int}``, summed in step
        order; with ``kd_teacher`` also ``"parts"``: the same per loss part), stored in the
        checkpoints so a run resumed mid-epoch records the means of the whole epoch
        (``resumed_loss``)."""
        loss = _running_sum(self.epoch_loss_before, self.epoch_losses)
        names = list(self.parts_before) + [n for n in self.epoch_parts
                                           if n not in self.parts_before]
        parts = {name: _running_sum(self.parts_before.get(name, (0.0, 0)),
                                    self.epoch_parts.get(name, [])) for name in names}
        return dict(loss, parts=parts) if parts else loss

    def on_train_step_end(self, run_context: RunContext) -> None:
        state = self.state
        calls_steps = state.steps_per_call
        self.epoch_steps += calls_steps
        self.window_steps += calls_steps
        epoch = (state.global_step - 1) // self.steps_per_epoch + 1
        if state.status == "overflow":
            return
        if state.status == "nonfinite":
            self.logger.error("non-finite loss %s at global step %d (epoch %d): stopping; the "
                              "newest checkpoint is the last good one", state.loss,
                              state.global_step, epoch)
            return
        self.epoch_losses.append(state.loss)
        parts = {name: float(p.asnumpy()) for name, p in self.loss_parts.items()}
        for name, value in parts.items():
            self.epoch_parts.setdefault(name, []).append(value)
        step_in_epoch = (state.global_step - 1) % self.steps_per_epoch + 1
        if (not passed_multiple(step_in_epoch, calls_steps, self.log_interval)
                and step_in_epoch != self.steps_per_epoch):
            return
        now = time.time()
        img_per_s = self.window_steps * self.global_batch_size / max(now - self.window_start,
                                                                     1e-9)
        self.window_start, self.window_steps = now, 0
        total = len(self.lr)
        eta = (now - self.train_start) / (state.global_step - self.start_step) * (
            total - state.global_step)
        self.logger.info("epoch %d/%d step %d/%d (global %d) loss %.4f%s lr %.6f "
                         "%.1f img/s eta %s", epoch, total // self.steps_per_epoch,
                         step_in_epoch, self.steps_per_epoch, state.global_step, state.loss,
                         "".join(f" {k} {v:.4f}" for k, v in parts.items()),
                         self.lr[state.global_step - 1], img_per_s, _hms(eta))
        if self.tracker is not None:
            lr = float(self.lr[state.global_step - 1])
            values = {"train/loss": state.loss, "train/lr": lr, "train/img_per_s": img_per_s}
            values.update({tag: lr * scale for tag, scale in self.lr_groups.items()})
            values.update({f"train/{name}": value for name, value in parts.items()})
            if state.loss_scale is not None:
                values.update({"train/loss_scale": state.loss_scale,
                               "train/overflow_steps": state.overflow_steps})
            self.tracker.scalars(state.global_step, values)

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        step = self.state.global_step
        if self.state.must_stop or step % self.steps_per_epoch:
            return  # mid-epoch (a sink call, a signal, a stop): no epoch record, no eval
        seconds = time.time() - self.epoch_start
        epoch = step // self.steps_per_epoch
        losses = self.epoch_loss()
        record = {"epoch": epoch, "step": step,
                  "loss": losses["sum"] / losses["count"] if losses["count"] else None,
                  "lr": float(self.lr[step - 1]), "time_s": round(seconds, 3),
                  "img_per_s": round(self.epoch_steps * self.global_batch_size
                                     / max(seconds, 1e-9), 2),
                  "overflow_steps": self.state.overflow_steps}
        if self.state.loss_scale is not None:
            record["loss_scale"] = self.state.loss_scale
        record.update({name: part["sum"] / part["count"]
                       for name, part in losses.get("parts", {}).items() if part["count"]})
        last = step == len(self.lr)
        evaluated = bool(self.evaluator) and (epoch % self.eval_interval == 0 or last)
        if evaluated:
            record.update(self.evaluator(epoch))
            self.error = self.error or getattr(self.evaluator, "error", None)
        self.logger.info("epoch %d done: %s", epoch, json.dumps(record))
        if self.tracker is not None:
            self.tracker.scalars(step, {tag: record[key] for key, tag in EPOCH_TAGS.items()
                                        if key in record})
        if evaluated and self.after_eval is not None:
            self.after_eval(step, epoch)
        try:
            if self.metrics_path:
                append_line(self.metrics_path, json.dumps(record))
        except WriteError as err:
            self.error = str(err)
        self.error = self.error or log_file_error(self.logger)
        if self.error:
            self.state.fail(NOT_WRITTEN, run_context)

def _hms(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class StopAtStep(Callback):
    """Stop ``Model.train`` once ``state``'s global step reaches ``step`` (the step-by-step
    head of a sink-mode run resumed off a call boundary). Listed after ``StepState``."""

    def __init__(self, state: StepState, step: int):
        super().__init__()
        self.state, self.step = state, step

    def on_train_step_end(self, run_context: RunContext) -> None:
        if self.state.global_step >= self.step:
            run_context.request_stop()
