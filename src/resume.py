"""Checkpoints that resume exactly: saved atomically with the optimizer state, found again
(``auto``), and restored with the position in the LR schedule and in the data order.

A checkpoint holds the network, the optimizer's momentum buffers and its ``global_step`` (which
indexes the per-step LR array), plus ``train_step``, the number of training steps done (under
loss scaling on GPU/Ascend an overflowed step skips the optimizer, so ``global_step`` lags). The data order is restored by
building each epoch's pipeline from (seed, epoch) alone (``epoch_seed``) and skipping the
batches already trained in a partly done epoch.
"""
import glob
import logging
import os
import re
import signal

import mindspore as ms
import numpy as np
from mindspore.train import Callback

from src.callbacks import atomic_save_checkpoint, step_status
from src.checkpoint import compare, read_checkpoint

LOGGER = logging.getLogger(__name__)
NAME = re.compile(r"-(\d+)_(\d+)\.ckpt$")
STEP_KEY = "train_step"
NOT_RESTORED = ("learning_rate", STEP_KEY)  # the LR array comes from the config


def epoch_seed(seed, epoch):
    """Seed of the data pipeline of ``epoch`` (0-based): a function of (seed, epoch) only."""
    return seed * 100003 + epoch


def checkpoint_name(prefix, global_step, steps_per_epoch):
    """ModelZoo-style ``prefix-EPOCH_STEP.ckpt`` (1-based epoch, step within the epoch)."""
    epoch, step = divmod(global_step - 1, steps_per_epoch)
    return f"{prefix}-{epoch + 1}_{step + 1}.ckpt"


def position_of(path, steps_per_epoch):
    """Global step encoded in a checkpoint name, or None."""
    match = NAME.search(os.path.basename(path))
    if not match:
        return None
    return (int(match.group(1)) - 1) * steps_per_epoch + int(match.group(2))


def periodic_checkpoints(output_dir, prefix, steps_per_epoch):
    """Checkpoints written by ``CheckpointSaver`` in ``output_dir``, newest first."""
    found = [(position_of(p, steps_per_epoch), p)
             for p in glob.glob(os.path.join(output_dir, f"{prefix}-*_*.ckpt"))]
    return [p for pos, p in sorted(found, reverse=True) if pos is not None]


def find_resume_checkpoint(output_dir, prefix, steps_per_epoch):
    """The newest readable training checkpoint in ``output_dir`` (``--resume_ckpt auto``).

    Unreadable ones (truncated, corrupt, without optimizer state) are passed over with a
    warning naming them. Returns None when there is none.
    """
    for path in periodic_checkpoints(output_dir, prefix, steps_per_epoch):
        try:
            params = read_checkpoint(path)
        except ValueError as err:
            LOGGER.warning("skipping unreadable checkpoint %s (%s); trying the previous one",
                           path, str(err).splitlines()[0])
            continue
        if "global_step" not in params:
            LOGGER.warning("skipping %s: no optimizer state (not a training checkpoint)", path)
            continue
        return path
    return None


def restore_training_state(net, optimizer, path):
    """Load network and optimizer state; return the number of training steps already done.

    Args:
        net (nn.Cell): The network.
        optimizer (nn.Optimizer): Its optimizer (momentum buffers, ``global_step``).
        path (str): A checkpoint written by ``CheckpointSaver``.

    Raises:
        ValueError: If the file is unreadable, lacks optimizer state, or does not fit the
            network (names the parameters).
    """
    params = read_checkpoint(path)
    if "global_step" not in params:
        raise ValueError(f"{path} holds no optimizer state: not a training checkpoint "
                         f"(use --pre_trained to start from its weights)")
    missing, _, mismatched = compare(net, params)
    if missing or mismatched:
        raise ValueError(f"checkpoint {path} does not fit the network: missing {missing[:5]}, "
                         f"shape mismatch {mismatched[:5]}")
    steps_done = params[STEP_KEY] if STEP_KEY in params else params["global_step"]
    for name in NOT_RESTORED:
        params.pop(name, None)
    ms.load_param_into_net(net, params, strict_load=True)
    not_loaded, _ = ms.load_param_into_net(optimizer, params)
    state = [n for n in not_loaded if n.startswith(("moments.", "global_step"))]
    if state:
        raise ValueError(f"checkpoint {path} lacks optimizer state {state[:5]}")
    return int(steps_done.asnumpy().reshape(-1)[0])


class CheckpointSaver(Callback):
    """Save resumable checkpoints atomically; on SIGINT/SIGTERM save at the current step and stop.

    Saves every ``save_epochs`` epochs, at the end of training, and every ``save_steps``
    steps when positive; keeps the newest ``keep_max``. Nothing is saved after a non-finite
    loss, nor parameters that are not all finite (an update can overflow one step before the
    loss does), so the newest checkpoint stays the last good one.

    Args:
        output_dir (str): Folder of the checkpoints.
        prefix (str): File name prefix (the network name).
        steps_per_epoch (int): Steps in one epoch.
        total_steps (int): Steps of the whole run.
        start_step (int): Steps already done (resumed runs).
        save_epochs (int): Epochs between saves.
        save_steps (int): Steps between saves; 0 for none.
        keep_max (int): Checkpoints kept.
        write (bool): Whether this process writes files (rank 0 in data parallel); every
            rank still stops on a signal.
    """

    def __init__(self, output_dir, prefix, steps_per_epoch, total_steps, start_step=0,
                 save_epochs=1, save_steps=0, keep_max=10, write=True):
        super().__init__()
        self.output_dir, self.prefix = output_dir, prefix
        self.steps_per_epoch, self.total_steps = steps_per_epoch, total_steps
        self.global_step = start_step
        self.save_epochs, self.save_steps, self.keep_max = save_epochs, save_steps, keep_max
        self.write = write
        self.signal_received = None
        self.failed = False
        self.last_saved = None
        self._previous_handlers = {}
        self._handlers_installed = False

    def on_train_begin(self, run_context):
        self._handlers_installed = False

    def _install_signal_handlers(self):
        """Catch SIGINT and SIGTERM: the next step end saves and stops training. Installed at
        the first step of each Model.train call: the data pipeline's iterator sets its own
        SIGINT handler when it starts (it would turn Ctrl-C into a SIGTERM)."""
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous = signal.signal(signum, self._on_signal)
            self._previous_handlers.setdefault(signum, previous)
        self._handlers_installed = True

    def restore_signal_handlers(self):
        """Put back the handlers found before the first ``on_train_begin``."""
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum, frame):
        del frame
        # The first one counts: on SIGINT MindSpore's data layer also sends the process a SIGTERM.
        self.signal_received = self.signal_received or signal.Signals(signum).name

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        if not self._handlers_installed:
            self._install_signal_handlers()
        self.global_step += 1
        if self.failed or step_status(cb.net_outputs)[0] == "nonfinite":
            self.failed = True
            return
        if self.signal_received:
            self.save(cb.train_network)
            run_context.request_stop()
        elif self.save_steps and self.global_step % self.save_steps == 0:
            self.save(cb.train_network)

    def on_train_epoch_end(self, run_context):
        cb = run_context.original_args()
        if self.signal_received and not self.failed:
            self.save(cb.train_network)  # the signal came after the last step (e.g. in eval)
            return
        if self.failed:
            return
        at_epoch_end = self.global_step % self.steps_per_epoch == 0
        epoch = self.global_step // self.steps_per_epoch
        if at_epoch_end and (epoch % self.save_epochs == 0 or self.global_step == self.total_steps):
            self.save(cb.train_network)

    def save(self, train_network):
        """Write the network and optimizer state under the current position, atomically."""
        path = os.path.join(self.output_dir, checkpoint_name(self.prefix, self.global_step,
                                                             self.steps_per_epoch))
        if path == self.last_saved or not self.write:
            return
        if not all(np.isfinite(p.asnumpy()).all() for p in train_network.get_parameters()):
            self.failed = True
            LOGGER.error("not saving %s: non-finite parameters after global step %d", path,
                         self.global_step)
            return
        atomic_save_checkpoint(train_network, path, {STEP_KEY: self.global_step})
        self.last_saved = path
        for old in periodic_checkpoints(self.output_dir, self.prefix,
                                        self.steps_per_epoch)[self.keep_max:]:
            os.remove(old)

