"""Resume: a run killed mid-epoch and resumed ends bit-identical to an uninterrupted one;
SIGTERM saves and stops; unreadable checkpoints are passed over; non-finite losses stop."""
import glob
import os
import signal
import subprocess
import sys
import time

import mindspore as ms
import numpy as np
import pytest

from tests.helpers import ROOT, run_entry

# ResNet-18, 64 px, 80 real images, batch 8: 10 steps per epoch, 30 in all, a checkpoint every
# 3 steps. Two data workers, so the data order must be deterministic across processes.
ARGS = ["--config_path", "configs/quick_start.yaml", "--image_size", "64", "--eval_resize", "64",
        "--batch_size", "8", "--epoch_size", "3", "--save_checkpoint_steps", "3",
        "--save_checkpoint_epochs", "1", "--keep_checkpoint_max", "20", "--run_eval", "false",
        "--num_parallel_workers", "2", "--log_interval", "1"]
FINAL = "resnet18-3_10.ckpt"


def train_cmd(data, out, *extra):
    return [sys.executable, os.path.join(ROOT, "train.py"), *ARGS, "--data_path", data,
            "--output_dir", out, *extra]


def start_and_interrupt(data, out, signum):
    """Start training, send ``signum`` as soon as the first checkpoint exists."""
    proc = subprocess.Popen(train_cmd(data, out), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and not glob.glob(os.path.join(out, "resnet18-*_*.ckpt")):
        time.sleep(0.02)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    return proc.returncode, stdout, stderr


def saved_steps(out):
    names = glob.glob(os.path.join(out, "resnet18-*_*.ckpt"))
    return sorted((int(n.split("-")[-1].split("_")[0]) - 1) * 10 + int(n.split("_")[-1][:-5])
                  for n in names)


@pytest.fixture(scope="module")
def uninterrupted(cifar_small, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("full"))
    result = subprocess.run(train_cmd(cifar_small["train"], out), cwd=ROOT, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return ms.load_checkpoint(os.path.join(out, FINAL))


def assert_same_final_state(out, reference):
    final = ms.load_checkpoint(os.path.join(out, FINAL))
    assert set(final) == set(reference)
    for name, value in reference.items():
        np.testing.assert_array_equal(final[name].asnumpy(), value.asnumpy(), err_msg=name)
    assert any(n.startswith("moments.") for n in reference)  # optimizer state compared too


def test_sigkill_mid_epoch_then_resume_auto_is_bit_exact(cifar_small, uninterrupted, tmp_path):
    out = str(tmp_path)
    code, _, _ = start_and_interrupt(cifar_small["train"], out, signal.SIGKILL)
    assert code == -signal.SIGKILL
    done = saved_steps(out)
    assert done and done[-1] < 30, f"the run was not interrupted mid-way: {done}"
    resumed = subprocess.run(train_cmd(cifar_small["train"], out, "--resume_ckpt", "auto"),
                             cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"{done[-1]} steps done" in resumed.stdout
    print(f"\n[resume] killed after step {done[-1]} of 30; resumed run ends bit-identical")
    assert_same_final_state(out, uninterrupted)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_stops_and_resumes_exactly(cifar_small, uninterrupted, tmp_path, signum):
    out = str(tmp_path)
    code, stdout, _ = start_and_interrupt(cifar_small["train"], out, signum)
    # MindSpore's data engine answers SIGINT (Ctrl-C) by sending the process a SIGTERM, which
    # may be the one train.py sees first: either way it saves and stops cleanly.
    names = {signal.Signals(signum).name, "SIGTERM"}
    reported = [n for n in names if f"stopped by {n} at global step" in stdout]
    assert reported and code == 128 + getattr(signal, reported[0]), stdout[-2000:]
    assert "--resume_ckpt auto" in stdout
    step = int(stdout.split(f"stopped by {reported[0]} at global step ")[1].split(",")[0])
    metrics = os.path.join(out, "metrics.jsonl")
    records = open(metrics).readlines() if os.path.exists(metrics) else []
    assert all('"step": 10' in r or '"step": 20' in r for r in records)  # whole epochs only
    assert step in saved_steps(out) and step < 30
    resumed = subprocess.run(train_cmd(cifar_small["train"], out, "--resume_ckpt", "auto"),
                             cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_same_final_state(out, uninterrupted)


def test_auto_passes_over_a_truncated_checkpoint(cifar_small, tmp_path, caplog):
    from src.resume import find_resume_checkpoint
    out = str(tmp_path)
    result = run_entry("train.py", *ARGS, "--epoch_size", "1", "--data_path",
                       cifar_small["train"], "--output_dir", out)
    assert result.returncode == 0, result.stderr[-2000:]
    newest = os.path.join(out, "resnet18-1_10.ckpt")
    with open(newest, "r+b") as f:
        f.truncate(1000)
    assert find_resume_checkpoint(out, "resnet18", 10) == os.path.join(out, "resnet18-1_9.ckpt")
    assert "skipping unreadable checkpoint" in caplog.text and "resnet18-1_10.ckpt" in caplog.text
    explicit = run_entry("train.py", *ARGS, "--data_path", cifar_small["train"], "--output_dir",
                         out, "--resume_ckpt", newest)
    assert explicit.returncode == 2 and "resnet18-1_10.ckpt" in explicit.stderr


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(cifar_small, tmp_path):
    out = str(tmp_path)
    result = run_entry("train.py", *ARGS, "--base_lr", "1e8", "--warmup_epochs", "0",
                       "--save_checkpoint_steps", "1", "--data_path", cifar_small["train"],
                       "--output_dir", out)
    assert result.returncode == 3, result.stdout[-2000:] + result.stderr[-2000:]
    step = int(result.stdout.split("non-finite loss at global step ")[1].split(";")[0])
    saved = saved_steps(out)
    assert saved and max(saved) < step
    newest = ms.load_checkpoint(os.path.join(out, f"resnet18-1_{max(saved)}.ckpt"))
    assert all(np.isfinite(v.asnumpy()).all() for v in newest.values())


def test_overflowed_steps_are_counted_not_fatal(tmp_path):
    """Loss scaling on GPU/Ascend: MindSpore's loss-scale cell skips an overflowed update and
    returns (loss, overflow, scale). Its overflow check has no CPU kernel, so this checks our
    side with such outputs: counted, training goes on, saving is not blocked."""
    import logging

    from mindspore.train import RunContext

    from src.callbacks import TrainMonitor, step_status
    from src.resume import CheckpointSaver

    def outputs(loss, overflow):
        return (ms.Tensor(np.float32(loss)), ms.Tensor(overflow), ms.Tensor(np.float32(1024)))

    assert step_status(outputs(np.inf, True))[0] == "overflow"
    assert step_status(outputs(2.3, False)) == ("ok", pytest.approx(2.3))
    assert step_status(ms.Tensor(np.float32(np.nan)))[0] == "nonfinite"

    class Params(dict):
        __getattr__ = dict.__getitem__

    monitor = TrainMonitor(np.full(4, 0.1, np.float32), 8, 4, 100, None, logging.getLogger("t"))
    saver = CheckpointSaver(str(tmp_path), "net", 4, 4)
    cb = Params(net_outputs=outputs(np.inf, True), cur_epoch_num=1)
    context = RunContext(cb)
    for callback in (monitor, saver):
        callback.on_train_begin(context)
        callback.on_train_epoch_begin(context)
    saver._install_signal_handlers = lambda: None  # no handlers needed in this unit test
    for step_outputs in (outputs(np.inf, True), outputs(2.3, False), outputs(np.nan, True)):
        cb["net_outputs"] = step_outputs
        monitor.on_train_step_end(context)
        saver.on_train_step_end(context)
    assert monitor.overflow_steps == 2 and monitor.nonfinite_step is None
    assert not saver.failed and not context.get_stop_requested()
