"""Training callbacks: progress lines, one JSON line of metrics per epoch, best checkpoint."""
import json
import math
import os
import time

import mindspore as ms
import numpy as np
from mindspore.train import Callback


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


def atomic_save_checkpoint(net, path, append_dict=None):
    """Save ``net`` to ``path`` through a temporary file and a rename, so that a crash never
    leaves a truncated checkpoint under the final name.

    Args:
        net (nn.Cell or list): Network (or training cell) whose parameters are saved, or a
            list of ``{"name": str, "data": Tensor}`` as ``mindspore.save_checkpoint`` takes.
        path (str): Final ``.ckpt`` path.
        append_dict (dict, optional): Extra int/float entries stored in the file.
    """
    # save_checkpoint appends ".ckpt" to names without it: keep the suffix on the temp name.
    tmp = os.path.splitext(path)[0] + ".partial.ckpt"
    ms.save_checkpoint(net, tmp, append_dict=append_dict)
    os.replace(tmp, path)


class BestCheckpointEvaluator:
    """Evaluate a ``Model`` on a dataset and keep the checkpoint with the best top-1.

    Args:
        model (mindspore.train.Model): The model being trained (built with top-1/top-5
            metrics named ``top1``/``top5``).
        dataset (mindspore.dataset.Dataset): Eval dataset.
        best_path (str): Where the best checkpoint is written (atomically).
    """

    def __init__(self, model, dataset, best_path):
        self.model = model
        self.dataset = dataset
        self.best_path = best_path
        self.best_top1 = -1.0

    def __call__(self, net):
        """Evaluate; save ``net`` if top-1 improved. Returns {"top1", "top5", "best_top1"}."""
        result = self.model.eval(self.dataset, dataset_sink_mode=False)
        top1, top5 = float(result["top1"]), float(result["top5"])
        if top1 > self.best_top1:
            self.best_top1 = top1
            atomic_save_checkpoint(net, self.best_path)
        return {"top1": top1, "top5": top5, "best_top1": self.best_top1}


class TrainMonitor(Callback):
    """Progress lines every ``log_interval`` steps and one JSON line per epoch.

    Step line: epoch, step in epoch, global step, loss, LR, img/s (global, over all
    devices), ETA. Epoch line in ``metrics_path`` (JSON Lines): epoch, mean loss, last LR,
    epoch time in seconds, img/s, overflowed steps (loss scaling), and top1/top5 when an
    evaluator runs. A non-finite loss in fp32 stops training (``nonfinite_step`` says where).

    Args:
        lr (numpy.ndarray): The per-step LR array given to the optimizer.
        global_batch_size (int): Images per step over all devices.
        steps_per_epoch (int): Steps in one epoch.
        log_interval (int): Steps between progress lines.
        metrics_path (str, optional): JSON Lines file; None to write none (non-zero ranks).
        logger (logging.Logger): Where lines go.
        evaluator (callable, optional): ``evaluator(net) -> dict`` run after each
            ``eval_interval`` epochs and after the last one.
        eval_interval (int): Epochs between evaluations.
        start_step (int): Steps already done (resumed runs).
    """

    def __init__(self, lr, global_batch_size, steps_per_epoch, log_interval, metrics_path,
                 logger, evaluator=None, eval_interval=1, start_step=0):
        super().__init__()
        self.lr = lr
        self.global_batch_size = global_batch_size
        self.steps_per_epoch = steps_per_epoch
        self.log_interval = max(1, log_interval)
        self.metrics_path = metrics_path
        self.logger = logger
        self.evaluator = evaluator
        self.eval_interval = max(1, eval_interval)
        self.start_step = self.global_step = start_step
        self.nonfinite_step = None
        self.overflow_steps = 0
        self.train_start = self.epoch_start = self.window_start = None
        self.epoch_losses = []

    def on_train_begin(self, run_context):
        self.train_start = self.train_start or time.time()

    def on_train_epoch_begin(self, run_context):
        self.epoch_start = self.window_start = time.time()
        self.epoch_losses = []

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        self.global_step += 1
        status, loss = step_status(cb.net_outputs)
        if status == "overflow":
            self.overflow_steps += 1
            return
        if status == "nonfinite":
            self.nonfinite_step = self.global_step
            self.logger.error("non-finite loss %s at global step %d (epoch %d): stopping; the "
                              "newest checkpoint is the last good one", loss, self.global_step,
                              cb.cur_epoch_num)
            run_context.request_stop()
            return
        self.epoch_losses.append(loss)
        step_in_epoch = (self.global_step - 1) % self.steps_per_epoch + 1
        if step_in_epoch % self.log_interval and step_in_epoch != self.steps_per_epoch:
            return
        now = time.time()
        steps = (step_in_epoch - 1) % self.log_interval + 1
        img_per_s = steps * self.global_batch_size / max(now - self.window_start, 1e-9)
        self.window_start = now
        total = len(self.lr)
        eta = (now - self.train_start) / (self.global_step - self.start_step) * (
            total - self.global_step)
        self.logger.info("epoch %d/%d step %d/%d (global %d) loss %.4f lr %.6f "
                         "%.1f img/s eta %s", cb.cur_epoch_num, total // self.steps_per_epoch,
                         step_in_epoch, self.steps_per_epoch, self.global_step, loss,
                         self.lr[self.global_step - 1], img_per_s, _hms(eta))

    def on_train_epoch_end(self, run_context):
        cb = run_context.original_args()
        if self.nonfinite_step or self.global_step % self.steps_per_epoch:
            return  # stopped mid-epoch (signal, non-finite loss): no epoch record, no eval
        seconds = time.time() - self.epoch_start
        record = {"epoch": cb.cur_epoch_num, "step": self.global_step,
                  "loss": float(sum(self.epoch_losses) / len(self.epoch_losses))
                  if self.epoch_losses else None,
                  "lr": float(self.lr[self.global_step - 1]), "time_s": round(seconds, 3),
                  "img_per_s": round(len(self.epoch_losses) * self.global_batch_size
                                     / max(seconds, 1e-9), 2),
                  "overflow_steps": self.overflow_steps}
        last = self.global_step == len(self.lr)
        if self.evaluator and (cb.cur_epoch_num % self.eval_interval == 0 or last):
            record.update(self.evaluator(cb.network))
        self.logger.info("epoch %d done: %s", cb.cur_epoch_num, json.dumps(record))
        if self.metrics_path:
            with open(self.metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")


def _hms(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
