"""Dataset sink mode, our side of it. MindSpore 2.10 runs no sink mode on CPU (``Model.train``
falls back to step by step: checked here), so the training loop's handling of sink calls is
tested by calling the callbacks as ``Model.train`` does on GPU/Ascend: once per sink call of
``sink_size`` steps, with the last step's outputs."""
import logging
import os

import mindspore as ms
import mindspore.nn as nn
import numpy as np
import pytest
from mindspore.train import RunContext

from src.training.callbacks import CheckpointSaver, StepState, StopSignals, TrainMonitor
from src.utils.config import ConfigError, parse_config
from train import epoch_calls, resolve_sink_size


@pytest.mark.parametrize("remaining, sink, calls", [
    (10, 0, [(10, 0)]), (10, 5, [(10, 5)]), (10, 4, [(2, 0), (8, 4)]), (3, 5, [(3, 0)]),
    (7, 5, [(2, 0), (5, 5)])])
def test_epoch_calls_end_on_the_uninterrupted_run_s_sink_boundaries(remaining, sink, calls):
    assert epoch_calls(remaining, sink) == calls
    assert sum(steps for steps, _ in calls) == remaining


def test_sink_size_per_device_and_setting():
    cfg = parse_config(["--device_target", "GPU"])
    assert resolve_sink_size(cfg, 100) == 100  # auto: sink mode, one epoch per call
    cfg = parse_config(["--device_target", "Ascend", "--sink_size", "25"])
    assert resolve_sink_size(cfg, 100) == 25
    assert resolve_sink_size(parse_config([]), 100) == 0  # CPU, auto: step by step
    cfg = parse_config(["--device_target", "GPU", "--dataset_sink_mode", "false"])
    assert resolve_sink_size(cfg, 100) == 0
    with pytest.raises(ConfigError, match="no dataset sink mode on CPU"):
        resolve_sink_size(parse_config(["--dataset_sink_mode", "true"]), 100)
    # PyNative: Model.train calls the step callbacks once per step even in sink mode
    pynative = ["--device_target", "GPU", "--mode", "PYNATIVE"]
    assert resolve_sink_size(parse_config(pynative), 100) == 0
    with pytest.raises(ConfigError, match="needs mode GRAPH"):
        resolve_sink_size(parse_config(pynative + ["--dataset_sink_mode", "true"]), 100)


def test_mindspore_has_no_sink_mode_on_cpu():
    """The reason for the error above: on CPU ``Model.train(dataset_sink_mode=True,
    sink_size=2)`` calls the step callbacks once per step and runs whole passes of the data
    per epoch, ignoring ``sink_size``. If this fails after a MindSpore upgrade, sink mode may
    have come to CPU and the error can go."""
    import mindspore.dataset as ds
    from mindspore.train import Callback, Model

    class Count(Callback):
        steps = 0

        def on_train_step_end(self, run_context):
            Count.steps += 1

    net = nn.Dense(4, 2)
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01))
    data = ds.NumpySlicesDataset((np.ones((12, 4), np.float32), np.zeros((12, 2), np.float32)),
                                 shuffle=False).batch(2)
    model.train(2, data, callbacks=[Count()], dataset_sink_mode=True, sink_size=2)
    assert Count.steps == 12  # 2 "epochs" x 6 steps, one callback each: no sink calls


class Params(dict):
    __getattr__ = dict.__getitem__


def sink_run(tmp_path, total_calls, sink, save_steps, steps_per_epoch=10):
    """Drive the callbacks through ``total_calls`` sink calls of ``sink`` steps each."""
    net = nn.Dense(2, 2)
    log = logging.getLogger("test")
    state = StepState()
    state.steps_per_call = sink
    lr = np.full(steps_per_epoch * 2, 0.1, np.float32)
    metrics = str(tmp_path / "metrics.jsonl")
    monitor = TrainMonitor(state, lr, 8, steps_per_epoch, 10, metrics, log)
    saver = CheckpointSaver(state, StopSignals(log), str(tmp_path), "net", steps_per_epoch,
                            len(lr), save_epochs=1, save_steps=save_steps, keep_max=50)
    cb = Params(net_outputs=ms.Tensor(np.float32(1.5)), train_network=net, cur_epoch_num=1)
    context = RunContext(cb)
    callbacks = (state, monitor, saver)
    for callback in callbacks:
        callback.on_train_begin(context)
    for _ in range(total_calls):
        for callback in callbacks:
            callback.on_train_epoch_begin(context)
        for callback in callbacks:
            callback.on_train_step_end(context)
        for callback in callbacks:
            callback.on_train_epoch_end(context)
    return state, metrics


def test_sink_calls_count_steps_and_save_at_the_first_boundary_past_each_multiple(tmp_path):
    state, metrics = sink_run(tmp_path, total_calls=4, sink=5, save_steps=3)
    assert state.global_step == 20
    saved = sorted(n for n in os.listdir(tmp_path) if n.endswith(".ckpt"))
    # multiples of 3: 3 -> step 5, 6 and 9 -> 10, 12 -> 15, 15 and 18 -> 20; epoch ends 10, 20
    assert saved == ["net-1_10.ckpt", "net-1_5.ckpt", "net-2_10.ckpt", "net-2_5.ckpt"]
    stored = ms.load_checkpoint(str(tmp_path / "net-1_5.ckpt"))
    assert int(stored["train_step"].asnumpy()) == 5


def test_sink_calls_write_one_metrics_line_per_epoch(tmp_path):
    import json
    _, metrics = sink_run(tmp_path, total_calls=4, sink=5, save_steps=0)
    records = [json.loads(line) for line in open(metrics)]
    assert [(r["epoch"], r["step"]) for r in records] == [(1, 10), (2, 20)]
    assert all(r["loss"] == 1.5 and r["img_per_s"] > 0 for r in records)
