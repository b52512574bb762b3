"""Training callbacks: the per-step state, progress lines and the metrics file, checkpoints,
stop signals. The evaluator that keeps the best checkpoint is ``src.training.evaluator``.

``Model.train`` calls callbacks in list order: ``StepState`` goes first, so the monitor and
the saver read the step it has just classified (the loss is read from the device once).
"""
import collections
import json
import logging
import math
import os
import signal
import time

import numpy as np
from mindspore.train import Callback

from src.utils.checkpoint import (
    CONFIG_KEY,
    STEP_KEY,
    atomic_save_checkpoint,
    checkpoint_name,
    prune,
)

LOGGER = logging.getLogger(__name__)


def loss_value(net_outputs):
    """The loss as a Python float from ``cb_params.net_outputs`` (a Tensor or a tuple whose
    first item is the loss, as with loss scaling)."""
    if isinstance(net_outputs, (tuple, list)):
        net_outputs = net_outputs[0]
    return float(np.mean(net_outputs.asnumpy()))


def step_status(net_outputs):
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


def passed_multiple(step, done, interval):
    """Whether the last ``done`` steps, ending at ``step``, reached or passed a multiple of
    ``interval`` (one step at a time: ``step`` is a multiple; in sink mode: a call of
    ``done`` steps went past one)."""
    return step // interval > (step - done) // interval


class StepState(Callback):
    """The one owner of the per-step state: global step, the step's status and loss, the
    count of overflowed steps and the loss scale, and why training must stop (a non-finite
    loss, too many overflowed steps). Listed first among the callbacks; ``TrainMonitor`` and
    ``CheckpointSaver`` read it.

    A non-finite loss in fp32 requests a stop (``nonfinite_step`` says where). An overflowed
    step under loss scaling (GPU/Ascend) is skipped by the training cell and counted; when
    more than ``max_overflow_fraction`` of the last ``OVERFLOW_WINDOW`` steps overflowed,
    nothing is being trained: ``overflow_stop`` says so and a stop is requested.

    In dataset sink mode one call of the callbacks covers ``steps_per_call`` steps (the sink
    size, set by train.py before each ``Model.train``); the loss and overflow flag are those
    of the call's last step.

    Args:
        start_step (int): Steps already done (resumed runs).
        max_overflow_fraction (float): In [0, 1]; 1 never stops.
    """

    OVERFLOW_WINDOW = 100

    def __init__(self, start_step=0, max_overflow_fraction=0.5):
        super().__init__()
        self.steps_per_call = 1
        self.global_step = start_step
        self.status, self.loss = "ok", None
        self.overflow_steps = 0
        self.loss_scale = None
        self.recent_overflows = collections.deque(maxlen=self.OVERFLOW_WINDOW)
        self.max_overflow_fraction = max_overflow_fraction
        self.nonfinite_step = None
        self.overflow_stop = None

    @property
    def must_stop(self):
        """Whether training cannot go on (non-finite loss, too many overflowed steps)."""
        return bool(self.nonfinite_step or self.overflow_stop)

    def on_train_step_end(self, run_context):
        outputs = run_context.original_args().net_outputs
        self.global_step += self.steps_per_call
        self.status, self.loss = step_status(outputs)
        if isinstance(outputs, (tuple, list)) and len(outputs) > 2:
            self.loss_scale = float(np.mean(outputs[2].asnumpy()))
        self.recent_overflows.append(self.status == "overflow")
        self._check_overflow_fraction(run_context)
        if self.status == "overflow":
            self.overflow_steps += 1
        elif self.status == "nonfinite" and self.nonfinite_step is None:
            self.nonfinite_step = self.global_step
            run_context.request_stop()

    def _check_overflow_fraction(self, run_context):
        window = self.recent_overflows
        count = sum(window)
        if (len(window) == window.maxlen and count > self.max_overflow_fraction * len(window)
                and self.overflow_stop is None):
            self.overflow_stop = (f"{count} of the last {len(window)} steps overflowed and "
                                  f"were skipped (max_overflow_fraction "
                                  f"{self.max_overflow_fraction}) at global step "
                                  f"{self.global_step}, loss scale {self.loss_scale}: the "
                                  f"model is not training (check the LR, the data, amp_level)")
            run_context.request_stop()


class TrainMonitor(Callback):
    """Progress lines every ``log_interval`` steps and one JSON line per epoch.

    Step line: epoch, step in epoch, global step, loss, LR, img/s (global, over all
    devices), ETA. Epoch line in ``metrics_path`` (JSON Lines): epoch, global step, mean loss,
    last LR, epoch time in seconds, img/s, overflowed steps and the loss scale (loss
    scaling), and top1/top5 (ema_top1/ema_top5 with an EMA) when an evaluator runs. Epochs cut
    short (signal, non-finite loss) get no line. In dataset sink mode a line is printed after
    each sink call that reaches a multiple of ``log_interval`` (img/s over the sink calls since
    the last line), and the epoch's loss is the mean of each call's last step.

    Args:
        state (StepState): The per-step state, updated before this callback runs.
        lr (numpy.ndarray): The per-step LR array given to the optimizer.
        global_batch_size (int): Images per step over all devices.
        steps_per_epoch (int): Steps in one epoch.
        log_interval (int): Steps between progress lines.
        metrics_path (str, optional): JSON Lines file; None to write none (non-zero ranks).
        logger (logging.Logger): Where lines go.
        evaluator (callable, optional): ``evaluator() -> dict`` run after each
            ``eval_interval`` epochs and after the last one.
        eval_interval (int): Epochs between evaluations.
    """

    def __init__(self, state, lr, global_batch_size, steps_per_epoch, log_interval,
                 metrics_path, logger, evaluator=None, eval_interval=1):
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
        self.start_step = state.global_step
        self.train_start = self.epoch_start = self.window_start = None
        self.epoch_losses = []
        self.epoch_steps = self.window_steps = 0

    def on_train_begin(self, run_context):
        self.train_start = self.train_start or time.time()

    def on_train_epoch_begin(self, run_context):
        # Model.train's epochs are sink calls in sink mode: reset at real epoch starts only
        if self.epoch_start is None or self.state.global_step % self.steps_per_epoch == 0:
            self.epoch_start = self.window_start = time.time()
            self.epoch_losses = []
            self.epoch_steps = self.window_steps = 0

    def on_train_step_end(self, run_context):
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
        self.logger.info("epoch %d/%d step %d/%d (global %d) loss %.4f lr %.6f "
                         "%.1f img/s eta %s", epoch, total // self.steps_per_epoch,
                         step_in_epoch, self.steps_per_epoch, state.global_step, state.loss,
                         self.lr[state.global_step - 1], img_per_s, _hms(eta))

    def on_train_epoch_end(self, run_context):
        step = self.state.global_step
        if self.state.must_stop or step % self.steps_per_epoch:
            return  # mid-epoch (a sink call, a signal, a stop): no epoch record, no eval
        seconds = time.time() - self.epoch_start
        epoch = step // self.steps_per_epoch
        record = {"epoch": epoch, "step": step,
                  "loss": float(sum(self.epoch_losses) / len(self.epoch_losses))
                  if self.epoch_losses else None,
                  "lr": float(self.lr[step - 1]), "time_s": round(seconds, 3),
                  "img_per_s": round(self.epoch_steps * self.global_batch_size
                                     / max(seconds, 1e-9), 2),
                  "overflow_steps": self.state.overflow_steps}
        if self.state.loss_scale is not None:
            record["loss_scale"] = self.state.loss_scale
        last = step == len(self.lr)
        if self.evaluator and (epoch % self.eval_interval == 0 or last):
            record.update(self.evaluator())
        self.logger.info("epoch %d done: %s", epoch, json.dumps(record))
        if self.metrics_path:
            with open(self.metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")


class StopSignals(Callback):
    """SIGINT/SIGTERM: finish the current step, save, stop. A second signal exits at once.

    ``install()`` runs before anything slow (data check, graph compilation), so a signal at
    start-up is caught too. While a compiled step runs, MindSpore 2.10's runtime has its own
    SIGINT handler in place, which turns Ctrl-C into a SIGTERM sent to the process: a Ctrl-C
    then arrives here as SIGTERM (exit status 143 instead of 130). Ours is installed again
    around every step (two system calls), so a Ctrl-C at start-up, between steps or during
    evaluation arrives as SIGINT.

    Args:
        logger (logging.Logger): Where the acknowledgement goes.
        exit_now (callable): ``exit_now(status)`` for the second signal (default ``os._exit``).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, logger, exit_now=os._exit):
        super().__init__()
        self.logger = logger
        self.exit_now = exit_now
        self.received = None
        self._previous = {}

    @property
    def signum(self):
        """The first signal received (an int), or None."""
        return getattr(signal, self.received) if self.received else None

    def install(self):
        """Catch SIGINT and SIGTERM (the handlers found first are kept for ``restore``)."""
        for signum in self.SIGNALS:
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)

    def restore(self):
        """Put back the handlers found before the first ``install``."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame):
        del frame
        name = signal.Signals(signum).name
        if self.received:
            self.logger.error("second stop signal (%s): exiting now without saving", name)
            self.exit_now(128 + signum)
            return
        self.received = name
        self.logger.warning("%s received: stopping after the current step with a checkpoint "
                            "(Ctrl-C again to exit at once, without saving)", name)

    def on_train_step_begin(self, run_context):
        self.install()

    def on_train_step_end(self, run_context):
        self.install()


class CheckpointSaver(Callback):
    """Save resumable checkpoints atomically; on a stop signal save at the current step and
    stop training.

    Saves every ``save_epochs`` epochs, at the end of training, and every ``save_steps``
    steps when positive. Keeps the newest ``keep_max`` of the files this run wrote (a
    resumed run counts the files of the run it continues, passed as ``own_files``); other
    files in the folder are never touched. Nothing is saved after a non-finite loss, nor
    parameters that are not all finite. A checkpoint that cannot be written (non-finite
    parameters, disk full, permission) stops training: ``error`` says why, ``diverged`` tells
    non-finite parameters from a write failure, and ``last_saved`` names the last good
    checkpoint.

    Args:
        state (StepState): The per-step state, updated before this callback runs.
        stop (StopSignals): Whether a stop signal came.
        output_dir (str): Folder of the checkpoints.
        prefix (str): File name prefix (the network name).
        steps_per_epoch (int): Steps in one epoch.
        total_steps (int): Steps of the whole run.
        run_config (str): The run's config as JSON, stored in every checkpoint.
        save_epochs (int): Epochs between saves.
        save_steps (int): Steps between saves; 0 for none.
        keep_max (int): Checkpoints of this run kept.
        own_files (list[str]): Checkpoints of this run written before (resumed runs),
            oldest first.
        write (bool): Whether this process writes files (rank 0 in data parallel); every
            rank still stops on a signal.
    """

    def __init__(self, state, stop, output_dir, prefix, steps_per_epoch, total_steps,
                 run_config="{}", save_epochs=1, save_steps=0, keep_max=10, own_files=(),
                 write=True):
        super().__init__()
        self.state, self.stop = state, stop
        self.output_dir, self.prefix = output_dir, prefix
        self.steps_per_epoch, self.total_steps = steps_per_epoch, total_steps
        self.run_config = run_config
        self.save_epochs, self.save_steps, self.keep_max = save_epochs, save_steps, keep_max
        self.own_files = list(own_files)
        self.write = write
        self.error = None
        self.diverged = False  # the failure was non-finite parameters (not a write error)
        self.last_saved = self.own_files[-1] if self.own_files else None

    def on_train_step_end(self, run_context):
        if self.error or self.state.nonfinite_step:
            return
        step, done = self.state.global_step, self.state.steps_per_call
        if self.stop.received:
            self.save(run_context)
            run_context.request_stop()
        elif self.save_steps and passed_multiple(step, done, self.save_steps):
            self.save(run_context)  # in sink mode: the first sink end at or past a multiple

    def on_train_epoch_end(self, run_context):
        if self.error or self.state.nonfinite_step:
            return
        step = self.state.global_step
        epoch, into_epoch = divmod(step, self.steps_per_epoch)
        if self.stop.received or (not into_epoch and (epoch % self.save_epochs == 0
                                                      or step == self.total_steps)):
            self.save(run_context)  # a signal during epoch-end eval saves here too

    def save(self, run_context):
        """Write the training cell's state (network, optimizer, step, run config) under the
        current position, atomically; on failure record ``error`` and stop training."""
        step = self.state.global_step
        path = os.path.join(self.output_dir, checkpoint_name(self.prefix, step,
                                                             self.steps_per_epoch))
        if path == self.last_saved or not self.write:
            return
        train_network = run_context.original_args().train_network
        if not all(np.isfinite(p.asnumpy()).all() for p in train_network.get_parameters()):
            self.diverged = True
            self._fail(run_context, f"non-finite parameters at global step {step}, not saved "
                                    f"as {path}")
            return
        try:
            atomic_save_checkpoint(train_network, path,
                                   {STEP_KEY: step, CONFIG_KEY: self.run_config})
        except (OSError, RuntimeError) as err:
            self._fail(run_context, f"cannot write checkpoint {path}: "
                                    f"{str(err).splitlines()[0]}")
            return
        self.last_saved = path
        self.own_files = prune([p for p in self.own_files if p != path] + [path],
                               self.keep_max)

    def _fail(self, run_context, message):
        self.error = message
        LOGGER.error("%s; stopping", message)
        run_context.request_stop()


def _hms(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
