"""Dataset sink mode, our side of it. MindSpore 2.10 runs no sink mode on CPU (``Model.train``
falls back to step by step: checked here), so the training loop's handling of sink calls is
tested by calling the callbacks as ``Model.train`` does on GPU/Ascend: once per sink call of
``sink_size`` steps, with the last step's outputs."""
import logging
import os
from types import SimpleNamespace

import mindspore as ms
import mindspore.nn as nn
import numpy as np
import pytest
from mindspore.train import RunContext

from src.recipe import build_data, resolve_sink_size, run_dataset
from src.training.callbacks import StepState, StopAtStep, TrainMonitor
from src.training.loop import TrainCallbacks, TrainPlan, train_in_sink_calls, train_run
from src.training.saver import CheckpointSaver
from src.training.signals import StopSignals
from src.utils.config import ConfigError, parse_config


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


def test_a_sink_size_larger_than_the_epoch_is_an_error_naming_both():
    # MindSpore would run such an epoch step by step while the log said "1000 steps per call"
    cfg = parse_config(["--device_target", "Ascend", "--sink_size", "1000"])
    with pytest.raises(ConfigError, match="sink_size 1000 is larger than an epoch \\(625 steps"):
        resolve_sink_size(cfg, 625)


def test_a_sink_size_that_does_not_divide_the_epoch_is_an_error_naming_divisors():
    cfg = parse_config(["--device_target", "Ascend", "--sink_size", "100"])
    with pytest.raises(ConfigError, match="sink_size 100 does not divide an epoch of 625 "
                                          "steps.*125"):
        resolve_sink_size(cfg, 625)
    cfg = parse_config(["--device_target", "Ascend", "--sink_size", "125"])
    assert resolve_sink_size(cfg, 625) == 125


class RecordingModel:
    """Stand-in for ``Model`` in sink mode (which MindSpore runs on GPU/Ascend only): records
    each ``train`` call and moves the step count as the real one would."""

    def __init__(self, state, steps_per_epoch, accumulation=1):
        self.state, self.steps_per_epoch, self.calls = state, steps_per_epoch, []
        self.accumulation = accumulation  # Model steps (batches) per optimizer step

    def train(self, epoch, dataset, callbacks, dataset_sink_mode, sink_size=-1,
              initial_epoch=0):
        self.calls.append(dict(epoch=epoch, dataset=dataset, sink=dataset_sink_mode,
                               sink_size=sink_size, initial_epoch=initial_epoch,
                               init_step=dataset.init_step))
        stop_at = [c.step for c in callbacks if isinstance(c, StopAtStep)]
        if dataset_sink_mode:
            self.state.global_step = epoch * sink_size // self.accumulation
        else:
            self.state.global_step = stop_at[0] if stop_at else epoch * self.steps_per_epoch


class FakeDataset:
    def __init__(self):
        self.init_step = 0

    def set_init_step(self, step):
        self.init_step = step


def recording_run(start_step, accumulation=1):
    """Step state, callbacks and a dataset builder that records the pipelines it builds."""
    state = StepState(start_step, accumulation_steps=accumulation)
    built = []

    def build():
        built.append(FakeDataset())
        return built[-1]

    cbs = TrainCallbacks(state=state, saver=SimpleNamespace(error=None),
                         monitor=SimpleNamespace(error=None), all=[state])
    return state, cbs, built, build


def sunk_run(start_step, sink_size, steps_per_epoch=10, epoch_size=4, accumulation=1):
    state, cbs, built, build = recording_run(start_step, accumulation)
    model = RecordingModel(state, steps_per_epoch, accumulation)
    plan = TrainPlan(epoch_size, steps_per_epoch, accumulation, sink_size, run_dataset=build)
    stop = StopSignals(logging.getLogger("test"))
    train_in_sink_calls(model, cbs, plan, start_step, stop=stop)
    return model.calls, built, state


def test_a_sink_mode_run_builds_one_pipeline_and_calls_model_train_once():
    # one dataset object -> one connect_network_with_dataset -> one compiled sunk graph
    calls, built, state = sunk_run(start_step=0, sink_size=5)
    assert len(built) == 1 and len(calls) == 1
    assert calls[0] == dict(epoch=8, dataset=built[0], sink=True, sink_size=5, initial_epoch=0,
                            init_step=0)
    assert state.global_step == 40


def test_with_accumulation_a_sink_call_runs_k_batches_per_optimizer_step():
    """grad_accumulation_steps 3, sink_size 5 optimizer steps: Model.train gets calls of 15
    batches, and a run resumed at optimizer step 13 starts the pipeline at batch 39 (the head
    up to step 15 step by step), the sunk part at batch 45."""
    calls, built, state = sunk_run(start_step=0, sink_size=5, accumulation=3)
    assert calls[0]["sink_size"] == 15 and calls[0]["epoch"] == 8 and state.global_step == 40
    assert state.model_steps_per_call == 15 and state.steps_per_call == 5
    calls, built, state = sunk_run(start_step=13, sink_size=5, accumulation=3)
    head, sunk = calls
    assert not head["sink"] and head["init_step"] == 39
    assert sunk["init_step"] == 45 and sunk["initial_epoch"] == 3 and sunk["sink_size"] == 15


def test_a_sink_mode_run_resumed_at_an_epoch_boundary_starts_its_one_pipeline_there():
    calls, built, state = sunk_run(start_step=20, sink_size=10)
    assert len(built) == 1 and len(calls) == 1
    assert calls[0]["init_step"] == 20 and calls[0]["initial_epoch"] == 2
    assert calls[0]["epoch"] == 4 and calls[0]["sink"] and state.global_step == 40


def test_a_sink_mode_run_resumed_off_a_call_boundary_trains_the_head_step_by_step():
    calls, built, state = sunk_run(start_step=13, sink_size=5)
    assert len(built) == 2 and len(calls) == 2
    head, sunk = calls
    assert not head["sink"] and head["init_step"] == 13 and head["initial_epoch"] == 1
    assert sunk["sink"] and sunk["init_step"] == 15 and sunk["initial_epoch"] == 3
    assert sunk["epoch"] == 8 and state.global_step == 40


def lp_ft_run(start_step, switch=20, sink_size=10, steps_per_epoch=10, epoch_size=4):
    state, cbs, built, build = recording_run(start_step)
    probe, tuned = RecordingModel(state, steps_per_epoch), RecordingModel(state, steps_per_epoch)
    plan = TrainPlan(epoch_size, steps_per_epoch, 1, sink_size, run_dataset=build)
    train_run(probe, cbs, plan, start_step, StopSignals(logging.getLogger("test")),
              probe_end=switch, fine_tune=lambda model: tuned)
    return probe.calls, tuned.calls, built, state


def test_lp_ft_in_sink_mode_is_one_call_per_phase_the_second_started_at_the_switch():
    probe, tuned, built, state = lp_ft_run(start_step=0)
    assert len(built) == 2 and len(probe) == 1 and len(tuned) == 1  # two compiled graphs
    assert probe[0]["sink"] and probe[0]["epoch"] == 2 and probe[0]["init_step"] == 0
    assert tuned[0]["sink"] and tuned[0]["init_step"] == 20 and tuned[0]["initial_epoch"] == 2
    assert tuned[0]["epoch"] == 4 and state.global_step == 40
    # resumed after the switch: main() passes the fine-tuning model; no second switch
    given, switched, built, _ = lp_ft_run(start_step=30)
    assert len(given) == 1 and not switched and given[0]["init_step"] == 30


def test_the_run_pipeline_resumed_at_an_epoch_boundary_keeps_the_data_order(cifar_small):
    """``Dataset.set_init_step`` on the one pipeline of a sink-mode run: the epochs after the
    resume step hold the same images in the same order as the uninterrupted run's (fast
    recovery: the random crops differ, which is what the docs say)."""
    cfg = parse_config(["--config_path", "configs/quick_start.yaml", "--data_path",
                        cifar_small["train"], "--batch_size", "16", "--class_num", "10"])
    data = build_data(cfg, 0, 1)

    def labels(dataset, epochs, first):
        it = dataset.create_tuple_iterator(num_epochs=cfg.epoch_size, output_numpy=True)
        return [[b[1].tolist() for b in it] for _ in range(epochs)][first:]

    steps = data.steps_per_epoch
    uninterrupted = labels(run_dataset(cfg, data), 3, 1)
    resumed = run_dataset(cfg, data)
    resumed.set_init_step(steps)
    assert labels(resumed, 2, 0) == uninterrupted
    assert uninterrupted[0] != uninterrupted[1]  # reshuffled every epoch


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
    state.set_call_size(sink)
    lr = np.full(steps_per_epoch * 2, 0.1, np.float32)
    metrics = str(tmp_path / "metrics.jsonl")
    monitor = TrainMonitor(state, lr=lr, global_batch_size=8, steps_per_epoch=steps_per_epoch,
                           log_interval=10, metrics_path=metrics, logger=log)
    saver = CheckpointSaver(state, StopSignals(log), output_dir=str(tmp_path), prefix="net",
                            steps_per_epoch=steps_per_epoch, total_steps=len(lr), save_epochs=1,
                            save_steps=save_steps, keep_max=50)
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
