"""Resumable checkpoints of a training run: saved atomically every ``save_checkpoint_epochs``
epochs / ``save_checkpoint_steps`` steps and on a stop, pruned to the run's own newest files."""
import json
import logging
import os
from collections.abc import Callable, Sequence

import numpy as np
from mindspore.train import Callback, RunContext

from src.training.callbacks import NONFINITE_PARAMETERS, NOT_WRITTEN, StepState, passed_multiple
from src.training.signals import StopSignals
from src.utils.checkpoint import (
    BEST_KEY,
    CONFIG_KEY,
    DATA_KEY,
    EPOCH_LOSS_KEY,
    RECORD_KEY,
    STEP_KEY,
    atomic_save_checkpoint,
    checkpoint_name,
    prune,
)

LOGGER = logging.getLogger(__name__)


class CheckpointSaver(Callback):
    """Save resumable checkpoints ``PREFIX-E_S.ckpt`` into ``output_dir``
    atomically every ``save_epochs`` epochs, every ``save_steps`` steps (0 = none), at the end
    (``total_steps``) and on a stop signal of ``stop``; keep this run's newest ``keep_max``
    (``own_files``: a resumed run's earlier ones, oldest first). Each stores ``run_config``,
    ``train_data`` and ``model_record`` (JSON; "" = not stored) and ``best()``'s score. Only
    ``write`` (rank 0) writes. A checkpoint not written or non-finite parameters stop training
    (``error``, ``diverged``, ``last_saved``). See docs/reliability.md#checkpoint-saves."""

    def __init__(self, state: StepState, stop: StopSignals, *, output_dir: str, prefix: str,
                 steps_per_epoch: int, total_steps: int, run_config: str = "{}",
                 save_epochs: int = 1, save_steps: int = 0, keep_max: int = 10,
                 own_files: Sequence[str] = (), write: bool = True,
                 best: Callable[[], dict | None] | None = None, train_data: str = "",
                 epoch_loss: Callable[[], dict] | None = None, model_record: str = ""):
        super().__init__()
        self.state, self.stop = state, stop
        self.output_dir, self.prefix = output_dir, prefix
        self.steps_per_epoch, self.total_steps = steps_per_epoch, total_steps
        self.run_config = run_config
        self.save_epochs, self.save_steps, self.keep_max = save_epochs, save_steps, keep_max
        self.own_files = list(own_files)
        self.write = write
        self.best = best
        self.train_data = train_data
        self.model_record = model_record  # what the weights are (src.utils.model_record)
        self.epoch_loss = epoch_loss  # the epoch's losses so far (TrainMonitor.epoch_loss)
        self.step_save_due = False  # a save_steps multiple reached at an epoch's last step
        self.error = None
        self.diverged = False  # the failure was non-finite parameters (not a write error)
        self.last_saved = self.own_files[-1] if self.own_files else None

    def _saves_nothing(self):
        """After a non-finite loss or an agreed stop (the same on every rank)."""
        return self.state.nonfinite_step or self.state.stopped_by

    def on_train_step_end(self, run_context: RunContext) -> None:
        if self._saves_nothing():
            return
        step, done = self.state.global_step, self.state.steps_per_call
        if self.stop.received:  # agreed: every rank is here, the collective below included
            self.save(run_context)
            if self.stop.collective:
                self._wait_for_the_writer()
            run_context.request_stop()
        elif self.error:
            return
        elif self.save_steps and passed_multiple(step, done, self.save_steps):
            # in sink mode: the first sink end at or past a multiple
            if step % self.steps_per_epoch:
                self.save(run_context)
            else:
                self.step_save_due = True  # after the epoch's record: on_train_epoch_end

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        if self.error or self._saves_nothing():
            return
        step = self.state.global_step
        epoch, into_epoch = divmod(step, self.steps_per_epoch)
        due, self.step_save_due = self.step_save_due, False
        if self.stop.received or due or (not into_epoch and (epoch % self.save_epochs == 0
                                                             or step == self.total_steps
                                                             or self.state.early_stop)):
            self.save(run_context)  # a signal during epoch-end eval saves here too

    def save(self, run_context: RunContext) -> None:
        """Write the training cell's state (network, optimizer, step, run config) under the
        current position, atomically; on failure record ``error`` and stop training."""
        step = self.state.global_step
        path = os.path.join(self.output_dir, checkpoint_name(self.prefix, step,
                                                             self.steps_per_epoch))
        if path == self.last_saved or not self.write or self.error:
            return
        train_network = run_context.original_args().train_network
        if not all(np.isfinite(p.asnumpy()).all() for p in train_network.get_parameters()):
            self.diverged = True
            self._fail(run_context, NONFINITE_PARAMETERS,
                       f"non-finite parameters at global step {step}, not saved as {path}")
            return
        try:
            best = self.best() if self.best else None
            atomic_save_checkpoint(train_network, path,
                                   {STEP_KEY: step, CONFIG_KEY: self.run_config,
                                    BEST_KEY: json.dumps(best) if best else "",
                                    DATA_KEY: self.train_data,
                                    EPOCH_LOSS_KEY: json.dumps(self.epoch_loss())
                                    if self.epoch_loss else "",
                                    RECORD_KEY: self.model_record})
        except (OSError, RuntimeError) as err:
            self._fail(run_context, NOT_WRITTEN,
                       f"cannot write checkpoint {path}: {str(err).splitlines()[0]}")
            return
        self.last_saved = path
        self.own_files = prune([p for p in self.own_files if p != path] + [path],
                               self.keep_max)

    def _wait_for_the_writer(self):
        """Every rank, after the save of a stop: wait until the writing rank has saved (or
        failed) and take its outcome."""
        path = os.path.join(self.output_dir, checkpoint_name(self.prefix, self.state.global_step,
                                                             self.steps_per_epoch))
        written = self.stop.gather(int(self.write and self.last_saved == path))
        if self.write:
            return
        if any(written):
            self.last_saved = path
        elif not self.error:
            self.error = (f"the writing rank did not save the checkpoint of global step "
                          f"{self.state.global_step} ({path}): see its log")

    def _fail(self, run_context, reason, message):
        self.error = message
        LOGGER.error("%s; stopping", message)
        self.state.fail(reason, run_context)
