"""Loss scaling: which scale each device and setting gets, the dynamic scale's updates, a
fixed scale on CPU trains as fp32 does, and a run whose steps keep overflowing stops.

MindSpore's overflow check runs on GPU and Ascend only, so the skipping of overflowed steps
itself cannot run here; what the training loop does with such steps is tested with the
outputs the loss-scale cell gives there: (loss, overflow flag, scale)."""
import json
import logging

import mindspore as ms
import mindspore.nn as nn
import numpy as np
import pytest
from mindspore.train import RunContext

from src.training.callbacks import StepState, TrainMonitor
from src.training.precision import loss_scale_setup, resolve_loss_scale_type
from src.training.train_step import TrainStep
from src.utils.config import ConfigError
from tests.test_train_step import batches, make, params


@pytest.fixture(autouse=True)
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


@pytest.mark.parametrize("device, requested, expected", [
    ("GPU", "auto", "dynamic"), ("Ascend", "auto", "dynamic"), ("CPU", "auto", "fixed"),
    ("GPU", "fixed", "fixed"), ("Ascend", "dynamic", "dynamic")])
def test_resolved_type(device, requested, expected):
    assert resolve_loss_scale_type(requested, device) == expected


def test_dynamic_on_cpu_is_an_error_naming_the_key():
    with pytest.raises(ConfigError, match="loss_scale_type dynamic .* GPU and Ascend only"):
        loss_scale_setup("O2", "CPU", 1024.0, loss_scale_type="dynamic")


def test_setup_per_device():
    assert loss_scale_setup("O0", "GPU", 1024.0) == (None, False, "none")
    scale, check, kind = loss_scale_setup("O2", "CPU", 512.0)
    assert (float(scale.asnumpy()), check, kind) == (512.0, False, "fixed")
    cell, check, kind = loss_scale_setup("O2", "GPU", 4096.0, loss_scale_type="auto",
                                         scale_factor=3.0, scale_window=7)
    assert isinstance(cell, nn.DynamicLossScaleUpdateCell) and (check, kind) == (True, "dynamic")
    assert cell.get_loss_scale() == 4096.0
    assert float(cell.scale_factor.asnumpy()) == 3.0 and int(cell.scale_window.asnumpy()) == 7
    cell, check, kind = loss_scale_setup("O2", "Ascend", 128.0, loss_scale_type="fixed")
    assert isinstance(cell, nn.FixedLossScaleUpdateCell) and (check, kind) == (True, "fixed")


def test_dynamic_scale_shrinks_on_overflow_and_grows_after_the_window():
    """The configured factor and window reach MindSpore's update cell: an overflow divides
    the scale by the factor, ``scale_window`` clean steps multiply it."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    cell, _, _ = loss_scale_setup("O2", "GPU", 1024.0, loss_scale_type="dynamic", scale_factor=4.0,
                                  scale_window=3)
    scale = ms.Parameter(ms.Tensor(1024.0, ms.float32), name="scale")
    values = []
    for overflow in (True, False, False, False, False):
        cell(scale, ms.Tensor(overflow))
        values.append(float(scale.asnumpy()))
    assert values == [256.0, 256.0, 256.0, 1024.0, 1024.0]


def test_fixed_scale_on_cpu_trains_like_fp32():
    """A power-of-two scale multiplied into the loss and divided out of the gradients changes
    no bit (barring over/underflow): the CPU O2 path's scaling is exact."""
    data = batches(3)
    results = []
    for scale in (None, ms.Tensor(1024.0, ms.float32)):
        net, opt, with_loss = make()
        step = TrainStep(with_loss, opt, scale_sense=scale)
        step.set_train()
        for image, label in data:
            step(image, label)
        results.append(params(net))
    for name, value in results[0].items():
        np.testing.assert_array_equal(results[1][name], value, err_msg=name)


class Params(dict):
    __getattr__ = dict.__getitem__


def outputs(overflow, scale=1024.0, loss=2.0):
    return (ms.Tensor(np.float32(np.inf if overflow else loss)), ms.Tensor(overflow),
            ms.Tensor(np.float32(scale)))


def run_steps(state, flags, callbacks=()):
    cb = Params(net_outputs=None, cur_epoch_num=1)
    context = RunContext(cb)
    for callback in (state, *callbacks):
        callback.on_train_begin(context)
        callback.on_train_epoch_begin(context)
    for flag in flags:
        cb["net_outputs"] = outputs(flag)
        for callback in (state, *callbacks):
            callback.on_train_step_end(context)
    return context


@pytest.mark.parametrize("overflowed, stops", [(50, False), (51, True)])
def test_too_many_overflowed_steps_stop_training(overflowed, stops):
    state = StepState(max_overflow_fraction=0.5)
    flags = [True] * overflowed + [False] * (100 - overflowed)
    context = run_steps(state, flags)
    assert state.overflow_steps == overflowed
    assert context.get_stop_requested() == stops and state.must_stop == stops
    if stops:
        assert "51 of the last 100 steps overflowed" in state.overflow_stop
        assert "loss scale 1024.0" in state.overflow_stop


def test_overflow_fraction_counts_only_the_last_100_steps():
    state = StepState(max_overflow_fraction=0.5)
    context = run_steps(state, [True] * 45 + [False] * 55 + [True] * 45)
    assert state.overflow_steps == 90 and not context.get_stop_requested()


def test_metrics_record_the_loss_scale_and_skipped_steps(tmp_path):
    state = StepState()
    metrics = tmp_path / "metrics.jsonl"
    monitor = TrainMonitor(state, lr=np.full(4, 0.1, np.float32), global_batch_size=8,
                           steps_per_epoch=4, log_interval=100, metrics_path=str(metrics),
                           logger=logging.getLogger("test"))
    context = run_steps(state, [True, False, False, True], [monitor])
    monitor.on_train_epoch_end(context)
    record = json.loads(metrics.read_text())
    assert record["overflow_steps"] == 2 and record["loss_scale"] == 1024.0
