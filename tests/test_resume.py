"""Resume: a run killed mid-epoch and resumed ends bit-identical to an uninterrupted one;
SIGTERM saves and stops; unreadable checkpoints are passed over; non-finite losses stop."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import mindspore as ms
import numpy as np
import pytest

from src.utils.config import ConfigError
from src.utils.errors import UserError
from tests.helpers import ROOT, run_in_process, train_in_process
from tests.interrupted_run import ARGS, FINAL, STEPS, STEPS_PER_EPOCH, saved_steps, train_args

# ARGS: ResNet-18, 32 px, 80 real images, batch 8: 10 steps per epoch, 30 in all, a checkpoint
# every 3 steps (tests/interrupted_run.py). Two data workers, so the data order must be
# deterministic across processes (the uninterrupted references train in the test process, the
# killed runs in their own).


def train_here(data, out, *extra):
    """train.py in the test process with ``ARGS``; asserts it exited 0."""
    assert train_in_process(*ARGS, "--data_path", data, "--output_dir", out, *extra) == 0


def train_cmd(data, out, *extra):
    return [sys.executable, os.path.join(ROOT, "train.py"), *ARGS, "--data_path", data,
            "--output_dir", out, *extra]


def start_and_interrupt(data, out, signum, *extra, steps_per_epoch=STEPS_PER_EPOCH):
    """Start training, send ``signum`` as soon as the first checkpoint it writes exists."""
    before = set(saved_steps(out, steps_per_epoch))
    proc = subprocess.Popen(train_cmd(data, out, *extra), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and not set(saved_steps(out, steps_per_epoch)) - before:
        time.sleep(0.02)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    return proc.returncode, stdout, stderr


@pytest.fixture(scope="module")
def full_run(interrupted_run, tmp_path_factory):
    """The folder of a finished run of 3 epochs (30 steps, a checkpoint every 9 steps and at
    each epoch's end, all kept), the uninterrupted twin of ``interrupted_run`` (its data and
    arguments, evaluated each epoch, TensorBoard on, but for saving every 9 steps, not 3: when
    to save changes nothing trained): the reference of the resumed runs, and the checkpoints
    the checks of resumable files start from (``resnet18-1_9.ckpt``, ``resnet18-1_10.ckpt``)."""
    out = str(tmp_path_factory.mktemp("full"))
    assert train_in_process(*train_args(interrupted_run, out, "--save_checkpoint_steps",
                                        "9")) == 0
    return out


@pytest.fixture(scope="module")
def uninterrupted(full_run):
    """The final state of ``full_run``."""
    return ms.load_checkpoint(os.path.join(full_run, FINAL))


def assert_same_final_state(out, reference, final_name=FINAL):
    final = ms.load_checkpoint(os.path.join(out, final_name))
    assert set(final) == set(reference)
    for name, value in reference.items():
        if name == "run_config":  # the resumed run's config says resume_ckpt: auto
            continue
        if isinstance(value, str):  # best_score: the resumed run's best is the same
            assert final[name] == value, name
            continue
        np.testing.assert_array_equal(final[name].asnumpy(), value.asnumpy(), err_msg=name)
    assert any(n.startswith(("moments.", "adam_m.")) for n in reference)  # optimizer state too


# TrivialAugment-wide, random erasing, mixup/cutmix, stochastic depth, repeated augmentation
# (3 reads of each image drawn, as timm's ResNet strikes back A1/A2), 2 accumulated
# micro-batches of 8 (so 5 optimizer steps per epoch, 15 in all), clipping, AdamW and a weight
# EMA: every random draw and every piece of state must come back after a kill.
MODERN = ["--auto_augment", "trivialaugment_wide", "--random_erasing", "0.25",
          "--mixup_alpha", "0.2", "--cutmix_alpha", "1.0", "--drop_path_rate", "0.3",
          "--aug_repeats", "3", "--ema_decay", "0.9",
          "--ema_warmup", "true", "--grad_accumulation_steps", "2", "--grad_clip_norm", "1.0",
          "--optimizer", "adamw", "--base_lr", "0.002", "--weight_decay", "0.05",
          "--save_checkpoint_steps", "2"]
MODERN_FINAL = "resnet18-3_5.ckpt"
# The runs that are not killed save at their last step only (when to save changes nothing
# trained; each save writes 179 MB: weights, AdamW's two moments and the EMA).
SAVE_AT_THE_END = ["--save_checkpoint_steps", "15"]


@pytest.mark.slow
def test_sigkill_then_resume_is_bit_exact_with_the_modern_recipe(cifar_small, tmp_path,
                                                                  capsys):
    full = str(tmp_path / "full")
    capsys.readouterr()
    train_here(cifar_small["train"], full, *MODERN, *SAVE_AT_THE_END)
    stdout = capsys.readouterr().out
    assert "aug_repeats 3: every image drawn is read 3 times" in stdout
    assert "5 optimizer steps per epoch, 15 in all" in stdout  # repeats keep the epoch's length
    reference = ms.load_checkpoint(os.path.join(full, MODERN_FINAL))
    for prefix in ("ema.", "ema_updates", "adam_m.", "adam_v."):
        assert any(n.startswith(prefix) for n in reference), prefix
    # the stochastic depth counter: every micro-batch (2 per step) of 15 steps
    assert int(reference["drop_path_step"].asnumpy()) == 30
    assert not any(n.startswith("grad_accum") for n in reference)  # zero at saves: not saved
    out = str(tmp_path / "killed")
    code, _, _ = start_and_interrupt(cifar_small["train"], out, signal.SIGKILL, *MODERN,
                                     steps_per_epoch=5)
    assert code == -signal.SIGKILL
    done = saved_steps(out, steps_per_epoch=5)
    assert done and done[-1] < 15 and done[-1] % 5, f"not interrupted mid-epoch: {done}"
    capsys.readouterr()
    train_here(cifar_small["train"], out, *MODERN, *SAVE_AT_THE_END, "--resume_ckpt", "auto")
    assert f"{done[-1]} steps done" in capsys.readouterr().out
    print(f"\n[resume, modern recipe] killed after step {done[-1]} of 15; resumed run ends "
          f"bit-identical")
    assert_same_final_state(out, reference, MODERN_FINAL)


def process_output(stage):
    """A stage of ``interrupted_run``'s output tails, for a failure message."""
    return f"exit {stage['code']}\n{stage.get('stdout', '')[-2000:]}\n{stage['stderr']}"


@pytest.mark.slow
def test_sigkill_sigterm_and_sigint_each_resume_exactly(uninterrupted, interrupted_run):
    """One run stopped three times, each time as soon as it wrote a checkpoint: SIGKILL (it
    resumes from its newest checkpoint), then, in the resumed run, SIGTERM, then SIGINT (each
    saves at the step it stops and exits 128 + the signal); each resume continues at the step
    the stop left, and the run ends bit-identical to the uninterrupted one, one record per
    epoch. (The three interruptions were three runs; their checks are kept one by one.)"""
    killed = interrupted_run["killed"]
    assert killed["code"] == -signal.SIGKILL, killed["stderr"]
    done = killed["saved"]
    assert done and done[-1] < STEPS, f"the run was not interrupted mid-way: {done}"
    print(f"\n[resume] killed after step {done[-1]} of {STEPS}")
    step = done[-1]
    for stage in interrupted_run["stops"]:
        stdout = stage["stdout"]
        # it resumed where the last stop left it (a silent restart would also end bit-identical)
        assert f"{step} steps done" in stdout, process_output(stage)
        assert f"(global {step})" not in stdout and f"(global {step + 1})" in stdout
        step = stopped_by_signal(stage, step)
    final = interrupted_run["final"]
    assert final["code"] == 0, process_output(final)  # the last resume: no signal, in-process
    resumed = final["stdout"]
    assert f"{step} steps done" in resumed, resumed[-2000:]
    assert f"(global {step})" not in resumed and f"(global {step + 1})" in resumed
    print(f"[resume] stopped again at step {step}; the resumed run ends bit-identical")
    out = interrupted_run["out"]
    assert_same_final_state(out, uninterrupted)
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["epoch"] for r in records] == [1, 2, 3]  # exactly one record per epoch


@pytest.mark.slow
def test_the_epoch_records_of_the_resumed_run_equal_the_uninterrupted_ones(full_run,
                                                                         interrupted_run):
    """The run stopped three times resumes mid-epoch at least once; each epoch's loss in
    metrics.jsonl is still the mean over all its steps, equal to the uninterrupted run's (the
    checkpoints store the epoch's running sum and count of losses)."""
    resumed_at = [int(stage["stdout"].split(" steps done")[0].split()[-1])
                  for stage in interrupted_run["stops"] + [interrupted_run["final"]]]
    assert any(step % STEPS_PER_EPOCH for step in resumed_at), resumed_at

    def losses(out):
        return [(r["epoch"], r["loss"]) for r in map(json.loads, open(
            os.path.join(out, "metrics.jsonl"), encoding="utf-8"))]
    assert losses(interrupted_run["out"]) == losses(full_run)


def stopped_by_signal(stage, resumed_at):
    """Checks of a run of ``interrupted_run`` stopped by a signal (resumed at step
    ``resumed_at``): it says so, exits 128 + the signal, tells how to resume, saved the step
    it stopped at and wrote whole epochs' records only. Returns that step."""
    # MindSpore's data engine answers SIGINT (Ctrl-C) by sending the process a SIGTERM, which
    # may be the one train.py sees first: either way it saves and stops cleanly.
    # While a compiled step runs, MindSpore's runtime turns a Ctrl-C into a SIGTERM; the exit
    # status is the shell's for the signal reported (130 SIGINT, 143 SIGTERM). A Ctrl-C that
    # reaches train.py's own handler exits 130 (test_train_safety.py checks it at start-up).
    stdout, code = stage["stdout"], stage["code"]
    names = [stage["signal"]] + (["SIGTERM"] if stage["signal"] == "SIGINT" else [])
    reported = [n for n in names if f"stopped by {n} at global step" in stdout]
    assert reported, process_output(stage)
    name = reported[0]
    assert code == 128 + getattr(signal, name), (code, name)
    assert "--resume_ckpt auto" in stdout
    step = int(stdout.split(f"stopped by {name} at global step ")[1].split(",")[0])
    ends = [f'"step": {e * STEPS_PER_EPOCH}' for e in range(1, 3)]
    assert all(any(e in r for e in ends) for r in stage["records"])  # whole epochs only
    assert step in stage["saved"] and resumed_at < step < STEPS, (resumed_at, step)
    return step


def expected_names(path):
    """Every name a resumable checkpoint holds (network and optimizer), from a good one."""
    return [n for n in ms.load_checkpoint(path) if n not in ("learning_rate", "train_step",
                                                            "run_config")]


@pytest.mark.slow
def test_auto_passes_over_a_truncated_checkpoint(full_run, cifar_small, tmp_path, caplog):
    from src.training.resume import find_resume_checkpoint
    out = str(tmp_path)
    for name in ("resnet18-1_9.ckpt", "resnet18-1_10.ckpt"):
        shutil.copy(os.path.join(full_run, name), out)
    names = expected_names(os.path.join(out, "resnet18-1_9.ckpt"))
    newest = os.path.join(out, "resnet18-1_10.ckpt")
    with open(newest, "r+b") as f:
        f.truncate(1000)
    assert find_resume_checkpoint(out, "resnet18", 10, names) == os.path.join(
        out, "resnet18-1_9.ckpt")
    assert "skipping checkpoint" in caplog.text and "resnet18-1_10.ckpt" in caplog.text
    with pytest.raises(UserError, match="resnet18-1_10.ckpt") as refused:  # exit 2
        train_here(cifar_small["train"], out, "--resume_ckpt", newest)
    assert refused.value.exit_status == 2


@pytest.mark.slow
def test_auto_passes_over_a_checkpoint_cut_at_a_record_boundary(full_run, tmp_path, caplog):
    """A file cut between two records still parses (a checkpoint is a sequence of records),
    with the optimizer's step but without the later parameters: not resumable."""
    from src.training.resume import find_resume_checkpoint
    out = str(tmp_path)
    shutil.copy(os.path.join(full_run, "resnet18-1_9.ckpt"), out)
    full = ms.load_checkpoint(os.path.join(full_run, "resnet18-1_10.ckpt"))
    first_half = ["global_step"] + [n for n in full if n != "global_step"][:len(full) // 2]
    cut = os.path.join(out, "resnet18-1_10.ckpt")
    ms.save_checkpoint([{"name": n, "data": full[n]} for n in first_half
                        if not isinstance(full[n], str)], cut)
    assert "global_step" in ms.load_checkpoint(cut)  # it parses
    names = expected_names(os.path.join(out, "resnet18-1_9.ckpt"))
    assert find_resume_checkpoint(out, "resnet18", 10, names) == os.path.join(
        out, "resnet18-1_9.ckpt")
    assert "expected parameters absent" in caplog.text and "resnet18-1_10.ckpt" in caplog.text


@pytest.mark.slow
def test_checkpoints_store_the_run_config_and_resume_checks_it(full_run, cifar_small):
    from src.utils.checkpoint import stored_config
    stored = stored_config(ms.load_checkpoint(os.path.join(full_run, "resnet18-1_10.ckpt")))
    assert stored["batch_size"] == 8 and stored["device_num"] == 1 and stored["epoch_size"] == 3
    resume = ["--data_path", cifar_small["train"], "--output_dir", full_run, "--resume_ckpt",
              os.path.join(full_run, "resnet18-1_9.ckpt")]
    # as a user sees it: train.py exits 2 with the key named (its run_entry_point, in-process)
    result = run_in_process("train.py", *ARGS, "--epoch_size", "2", *resume)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "other epoch_size" in result.stderr and "--resume_ignore_config true" in result.stderr
    for key, value in (("batch_size", "4"), ("base_lr", "0.3")):  # the same check in-process
        with pytest.raises(ConfigError, match=f"other {key}.*--resume_ignore_config true"):
            train_in_process(*ARGS, f"--{key}", value, *resume)


@pytest.mark.slow
def test_resume_ignore_config_resumes_with_another_epoch_size(full_run, cifar_small, tmp_path,
                                                              capsys):
    out = str(tmp_path)
    shutil.copy(os.path.join(full_run, "resnet18-1_10.ckpt"), out)
    capsys.readouterr()
    train_here(cifar_small["train"], out, "--epoch_size", "2", "--resume_ignore_config", "true",
               "--resume_ckpt", "auto")
    assert "10 steps done" in capsys.readouterr().out and os.path.isfile(
        os.path.join(out, "resnet18-2_10.ckpt"))


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(cifar_small, tmp_path,
                                                                  capsys):
    out = str(tmp_path)
    capsys.readouterr()
    status = train_in_process(*ARGS, "--base_lr", "1e8", "--warmup_epochs", "0",
                              "--save_checkpoint_steps", "1", "--data_path",
                              cifar_small["train"], "--output_dir", out)
    stdout = capsys.readouterr().out
    assert status == 3, stdout[-2000:]  # train.py's exit status
    # the parameters overflow one step before the loss does: whichever is seen first stops it
    step = int(re.search(r"stopped: non-finite \w+ at global step (\d+)", stdout)[1])
    saved = saved_steps(out)
    assert saved and max(saved) < step
    newest = f"resnet18-1_{max(saved)}.ckpt"
    assert f"last good checkpoint: {os.path.join(out, newest)}" in stdout
    values = ms.load_checkpoint(os.path.join(out, newest))
    assert all(np.isfinite(v.asnumpy()).all() for v in values.values() if not isinstance(v, str))


def test_overflowed_steps_are_counted_not_fatal(tmp_path):
    """Loss scaling on GPU/Ascend: MindSpore's loss-scale cell skips an overflowed update and
    returns (loss, overflow, scale). Its overflow check has no CPU kernel, so this checks our
    side with such outputs: counted, training goes on, saving is not blocked."""
    import logging

    from mindspore.train import RunContext

    from src.training.callbacks import StepState, TrainMonitor, step_status
    from src.training.saver import CheckpointSaver
    from src.training.signals import StopSignals

    def outputs(loss, overflow):
        return (ms.Tensor(np.float32(loss)), ms.Tensor(overflow), ms.Tensor(np.float32(1024)))

    assert step_status(outputs(np.inf, True))[0] == "overflow"
    assert step_status(outputs(2.3, False)) == ("ok", pytest.approx(2.3))
    assert step_status(ms.Tensor(np.float32(np.nan)))[0] == "nonfinite"

    class Params(dict):
        __getattr__ = dict.__getitem__

    state = StepState()
    monitor = TrainMonitor(state, lr=np.full(4, 0.1, np.float32), global_batch_size=8,
                           steps_per_epoch=4, log_interval=100, metrics_path=None,
                           logger=logging.getLogger("t"))
    saver = CheckpointSaver(state, StopSignals(logging.getLogger("t")), output_dir=str(tmp_path),
                            prefix="net", steps_per_epoch=4, total_steps=4)
    cb = Params(net_outputs=outputs(np.inf, True), cur_epoch_num=1)
    context = RunContext(cb)
    for callback in (state, monitor, saver):
        callback.on_train_begin(context)
        callback.on_train_epoch_begin(context)
    for step_outputs in (outputs(np.inf, True), outputs(2.3, False), outputs(np.nan, True)):
        cb["net_outputs"] = step_outputs
        for callback in (state, monitor, saver):
            callback.on_train_step_end(context)
    assert state.overflow_steps == 2 and state.nonfinite_step is None and state.global_step == 3
    assert saver.error is None and not context.get_stop_requested()
