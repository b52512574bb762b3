"""ProfileSteps against a real GRAPH-mode training run under MindSpore's profiler: the steps
it profiles (A..B, across epochs, resumed), the files the profiler writes on CPU, the op
table; the statistics readers on the Ascend/GPU layouts; parse_profile_steps."""
import csv
import glob
import logging
import os

import mindspore as ms
import mindspore.dataset as ds
import mindspore.nn as nn
import mindspore.ops as ops
import numpy as np
import pytest
from mindspore.train import Callback, Model

import src.training.profiler as profiler_module
from src.training.callbacks import StepState
from src.training.profiler import ProfileSteps, parse_profile_steps, read_op_statistics, top_ops
from src.utils.config import ConfigError

STEPS_PER_EPOCH = 3
LOGGER = "test_profiler"


class Small(nn.Cell):
    """Conv + BN + dense: Conv2D and MatMul kernels, fast to compile."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Dense(4 * 8 * 8, 5)

    def construct(self, x):
        y = ops.relu(self.bn(self.conv(x)))
        return self.fc(y.reshape(y.shape[0], -1))


class StopAtStep(Callback):
    """Requests a stop after a global step, as a stop signal or a non-finite loss does."""

    def __init__(self, state, step):
        super().__init__()
        self.state, self.step = state, step

    def on_train_step_end(self, run_context):
        if self.state.global_step == self.step:
            run_context.request_stop()


@pytest.fixture(autouse=True)
def graph_mode():
    """Compiled, as train.py runs the step; PyNative (the tests' default) restored after."""
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


@pytest.fixture
def log(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    return logging.getLogger(LOGGER)


class CallState(StepState):
    """StepState as in dataset sink mode: one call of the callbacks counts ``steps_per_call``
    optimizer steps (here each call really trains one step: CPU has no sink mode)."""

    def __init__(self, start_step=0, steps_per_call=2):
        super().__init__(start_step)
        self.steps_per_call = steps_per_call

    def on_train_step_end(self, run_context):
        self.global_step += self.steps_per_call


def train(folder, log, first, last, epochs=2, start_step=0, total_steps=None, stop_at=None,
          state=None):
    """train.py's loop on random data: one Model.train call per epoch, resumed runs skipping
    the batches already trained. Returns (ProfileSteps, StepState)."""
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    n = 8 * STEPS_PER_EPOCH
    images = rng.standard_normal((n, 3, 8, 8)).astype(np.float32)
    labels = rng.integers(0, 5, n).astype(np.int32)
    net = Small()
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.Momentum(net.trainable_params(), 0.01, 0.9))
    state = state or StepState(start_step)
    prof = ProfileSteps(state, first, last, output_dir=folder, logger=log, total_steps=total_steps)
    callbacks = [state, prof] + ([StopAtStep(state, stop_at)] if stop_at else [])
    for epoch in range(start_step // STEPS_PER_EPOCH, epochs):
        data = ds.NumpySlicesDataset({"image": images, "label": labels},
                                     shuffle=False).batch(8)
        skip = max(0, start_step - epoch * STEPS_PER_EPOCH)
        model.train(epoch + 1, data.skip(skip) if skip else data, callbacks=callbacks,
                    dataset_sink_mode=False, initial_epoch=epoch)
        if state.global_step == stop_at:
            break
    prof.close()
    return prof, state


def op_runs(folder):
    """{op instance: times it ran} from the profiler's cpu_op_detail_info file."""
    paths = glob.glob(os.path.join(folder, "*_ascend_ms", "FRAMEWORK",
                                   "cpu_op_detail_info_*.csv"))
    assert len(paths) == 1, paths
    with open(paths[0], newline="", encoding="utf-8") as f:
        return {row["full_op_name"]: int(row["op_occurrences"]) for row in csv.DictReader(f)}


def check_summary(summary, first, last):
    assert summary is not None, "no summary: profiling never ran or its files were not read"
    assert (summary["first_step"], summary["last_step"], summary["steps"]) == (
        first, last, last - first + 1)
    ops_ = summary["ops"]
    assert 0 < len(ops_) <= 10
    shares = [o["share"] for o in ops_]
    assert all(s >= 0 for s in shares) and 0 < sum(shares) <= 1 + 1e-9
    assert shares == sorted(shares, reverse=True)
    assert summary["total_ms"] > 0
    names = {o["op_type"] for o in ops_}
    assert {"Conv2D", "MatMul"} <= names, names


def test_profiles_steps_2_to_3_only(tmp_path, log, caplog, monkeypatch):
    from mindspore import log as ms_log
    warned = []  # MindSpore's warnings (its profiler binds mindspore.log.warning when built)
    monkeypatch.setattr(ms_log, "warning", lambda msg, *args, **kwargs: warned.append(msg))
    folder = str(tmp_path / "profiler")
    prof, state = train(folder, log, 2, 3)
    # the schedule ran to its end before the analysis: stop() before that end warns
    # ("Incorrect schedule: Stop profiler while current state is ...")
    assert not [w for w in warned if "Stop profiler" in w], warned
    assert state.global_step == 2 * STEPS_PER_EPOCH  # training went on after the analysis
    check_summary(prof.summary, 2, 3)
    session = prof.summary["folder"]
    assert os.path.dirname(session) == folder and session.endswith("_ascend_ms")
    for pattern in ("FRAMEWORK/cpu_op_type_info_*.csv", "FRAMEWORK/cpu_op_detail_info_*.csv",
                    "ASCEND_PROFILER_OUTPUT/trace_view.json"):
        assert glob.glob(os.path.join(session, pattern)), pattern
    assert prof.summary["trace_file"].endswith("trace_view.json")
    # every op instance ran once per step: twice means steps 1 and 4.. were not recorded
    runs = op_runs(folder)
    assert runs and set(runs.values()) == {2}, runs
    conv = next(o for o in prof.summary["ops"] if o["op_type"] == "Conv2D")
    assert conv["calls"] == 2
    text = caplog.text
    assert "profile of steps 2..3 (2 optimizer steps" in text
    assert "Conv2D" in text and "MatMul" in text and "%" in text
    assert session in text and "MindStudio Insight" in text


def test_resumed_run_inside_the_range_profiles_from_its_first_step_across_epochs(
        tmp_path, log, caplog):
    folder = str(tmp_path / "profiler")
    # resumed after step 2: this run trains step 3 (end of epoch 1), then 4.. (epoch 2)
    prof, _ = train(folder, log, 2, 4, start_step=2)
    check_summary(prof.summary, 3, 4)
    assert set(op_runs(folder).values()) == {2}
    assert "this run starts at step 3: profiling steps 3..4" in caplog.text


def test_resumed_run_after_the_range_profiles_nothing(tmp_path, log, caplog):
    folder = str(tmp_path / "profiler")
    prof = ProfileSteps(StepState(5), 2, 3, output_dir=folder, logger=log)
    prof.close()
    assert prof.summary is None and not os.path.exists(folder)
    assert "this run starts at step 6, after the range: nothing is profiled" in caplog.text


def test_range_past_the_run_is_cut_to_its_last_step(tmp_path, log, caplog):
    prof = ProfileSteps(StepState(0), 4, 99, output_dir=str(tmp_path / "profiler"), logger=log,
                        total_steps=6)
    assert (prof.start_step, prof.last_step) == (4, 6)
    assert "the run has 6 optimizer steps, profiling up to step 6" in caplog.text


def test_stop_before_the_last_step_analyses_the_steps_done(tmp_path, log, caplog):
    folder = str(tmp_path / "profiler")
    prof, state = train(folder, log, 2, 9, stop_at=3)
    assert state.global_step == 3
    check_summary(prof.summary, 2, 3)
    assert set(op_runs(folder).values()) == {2}
    assert "training ended before step 9" in caplog.text


def test_sink_calls_are_profiled_whole(tmp_path, log, caplog):
    # calls cover steps 1-2 (warm-up), 3-4, 5-6, 7-8 (recorded: they overlap 4..7), 9-10, 11-12
    folder = str(tmp_path / "profiler")
    prof, state = train(folder, log, 4, 7, state=CallState())
    assert state.global_step == 12
    check_summary(prof.summary, 3, 8)
    assert set(op_runs(folder).values()) == {3}  # three calls, one real step each
    assert "whole sink calls of up to 2 steps" in caplog.text


def test_missing_statistics_warns_naming_the_folder(tmp_path, log, caplog, monkeypatch):
    monkeypatch.setattr(profiler_module, "STATS_PATTERNS", (("no_such_file.csv", "none"),))
    folder = str(tmp_path / "profiler")
    prof, state = train(folder, log, 2, 2, epochs=1)
    assert state.global_step == STEPS_PER_EPOCH and prof.summary is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and r.name == LOGGER]
    assert any("no op statistics file" in w and os.path.abspath(folder) in w
               for w in warnings), warnings


def test_reads_ascend_and_cpu_statistics(tmp_path):
    ascend = tmp_path / "op_statistic.csv"
    ascend.write_text("Device_id,OP Type,Core Type,Count,Total Time(us),Min Time(us),"
                      "Avg Time(us),Max Time(us),Ratio(%)\n"
                      "0,Conv2D,AI_CORE,4,3000,700,750,800,75\n"
                      "0,MatMul,AI_CORE,2,1000,500,500,500,25\n")
    stats = read_op_statistics(str(ascend))
    assert {s["op_type"]: (s["time_ms"], s["calls"]) for s in stats} == {
        "Conv2D": (3.0, 4), "MatMul": (1.0, 2)}
    ops_, total = top_ops(stats, top=1)
    assert total == 4.0 and [(o["op_type"], o["share"]) for o in ops_] == [("Conv2D", 0.75)]
    cpu = tmp_path / "cpu_op_type_info_0.csv"
    cpu.write_text("op_type,type_occurrences,execution_frequency(per-step),total_compute_time,"
                   "avg_time(ms),percent\nReLU,2,1,0.5,0.25,0.5\nMatMul,6,3,0.5,0.08,0.5\n\n")
    assert {s["op_type"]: s["time_ms"] for s in read_op_statistics(str(cpu))} == {
        "ReLU": 0.5, "MatMul": 0.5}
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError):
        read_op_statistics(str(bad))


@pytest.mark.parametrize("value, expected", [([], None), (None, None), ([2, 3], (2, 3)),
                                             ((4, 4), (4, 4))])
def test_parse_profile_steps(value, expected):
    assert parse_profile_steps(value) == expected


@pytest.mark.parametrize("value", [[3], [1, 2, 3], [0, 2], [-1, 2], [3, 2], ["a", 2],
                                   [True, 2], [1.5, 2], "2,3"])
def test_parse_profile_steps_rejects(value):
    with pytest.raises(ConfigError, match="profile_steps"):
        parse_profile_steps(value)


@pytest.mark.slow
def test_train_py_profile_steps_end_to_end(cifar_small, tmp_path):
    """train.py --profile_steps 2,3 (its main, in this process) writes the profiler's files
    under output_dir/profiler and logs the operator table; training ends normally. (No
    evaluation at the epoch's end: it compiles a graph of its own, and nothing here reads it.)"""
    from tests.helpers import run_in_process
    out = tmp_path / "run"
    result = run_in_process("train.py", "--config_path", "configs/quick_start.yaml",
                            "--data_path", cifar_small["train"], "--batch_size", "16",
                            "--epoch_size", "1", "--profile_steps", "2,3", "--run_eval",
                            "false", "--output_dir", out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert glob.glob(str(out / "profiler" / "*" / "FRAMEWORK" / "cpu_op_type_info_*.csv"))
    assert "Conv2D" in result.stdout and "profiled steps 2..3" in result.stdout
    assert os.path.isfile(out / "resnet18-1_5.ckpt")
