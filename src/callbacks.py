"""Training callbacks: progress lines, one JSON line of metrics per epoch, best checkpoint."""
import json
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


def atomic_save_checkpoint(net, path):
    """Save ``net`` to ``path`` through a temporary file and a rename, so that a crash never
    leaves a truncated checkpoint under the final name."""
    # save_checkpoint appends ".ckpt" to names without it: keep the suffix on the temp name.
    tmp = os.path.splitext(path)[0] + ".partial.ckpt"
    ms.save_checkpoint(net, tmp)
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
    epoch time in seconds, img/s, and top1/top5 when an evaluator runs.

    Args:
        lr (numpy.ndarray): The per-step LR array given to the optimizer.
        global_batch_size (int): Images per step over all devices.
        log_interval (int): Steps between progress lines.
        metrics_path (str, optional): JSON Lines file; None to write none (non-zero ranks).
        logger (logging.Logger): Where lines go.
        evaluator (callable, optional): ``evaluator(net) -> dict`` run after each
            ``eval_interval`` epochs and after the last one.
        eval_interval (int): Epochs between evaluations.
    """

    def __init__(self, lr, global_batch_size, log_interval, metrics_path, logger,
                 evaluator=None, eval_interval=1):
        super().__init__()
        self.lr = lr
        self.global_batch_size = global_batch_size
        self.log_interval = max(1, log_interval)
        self.metrics_path = metrics_path
        self.logger = logger
        self.evaluator = evaluator
        self.eval_interval = max(1, eval_interval)
        self.train_start = self.epoch_start = self.window_start = 0.0
        self.epoch_losses = []

    def on_train_begin(self, run_context):
        self.train_start = time.time()

    def on_train_epoch_begin(self, run_context):
        self.epoch_start = self.window_start = time.time()
        self.epoch_losses = []

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        loss = loss_value(cb.net_outputs)
        self.epoch_losses.append(loss)
        if not np.isfinite(loss):
            self.logger.error("non-finite loss %s at epoch %d, global step %d: stopping",
                              loss, cb.cur_epoch_num, cb.cur_step_num)
            run_context.request_stop()
            return
        step_in_epoch = (cb.cur_step_num - 1) % cb.batch_num + 1
        if step_in_epoch % self.log_interval and step_in_epoch != cb.batch_num:
            return
        now = time.time()
        steps = (step_in_epoch - 1) % self.log_interval + 1
        img_per_s = steps * self.global_batch_size / max(now - self.window_start, 1e-9)
        self.window_start = now
        done = cb.cur_step_num
        total = cb.epoch_num * cb.batch_num
        eta = (now - self.train_start) / done * (total - done)
        self.logger.info("epoch %d/%d step %d/%d (global %d) loss %.4f lr %.6f "
                         "%.1f img/s eta %s", cb.cur_epoch_num, cb.epoch_num, step_in_epoch,
                         cb.batch_num, done, loss, self.lr[done - 1], img_per_s, _hms(eta))

    def on_train_epoch_end(self, run_context):
        cb = run_context.original_args()
        seconds = time.time() - self.epoch_start
        record = {"epoch": cb.cur_epoch_num, "step": cb.cur_step_num,
                  "loss": float(np.mean(self.epoch_losses)) if self.epoch_losses else None,
                  "lr": float(self.lr[cb.cur_step_num - 1]), "time_s": round(seconds, 3),
                  "img_per_s": round(len(self.epoch_losses) * self.global_batch_size
                                     / max(seconds, 1e-9), 2)}
        last = cb.cur_epoch_num == cb.epoch_num
        if self.evaluator and (cb.cur_epoch_num % self.eval_interval == 0 or last):
            record.update(self.evaluator(cb.network))
        self.logger.info("epoch %d done: %s", cb.cur_epoch_num, json.dumps(record))
        if self.metrics_path:
            with open(self.metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")


def _hms(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
