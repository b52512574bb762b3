"""Early stopping (``early_stopping_patience``, ``early_stopping_min_delta``): the decision on
sequences of scores (min_delta, epochs counted between evaluations, LP-FT's probe not counted,
a resume continuing the count), the callback that ends the run (record, TensorBoard text, log
line, stop request; on the EMA's top-1 with best_on_ema), the config checks, and real runs
whose top-1 cannot move: one stops after patience + 1 evaluations, a resume after a kill
stops at the same epoch bit-exact, a stopped run resumed trains nothing. The two-rank run is
in test_distributed.py (``two_hosts``)."""
import json
import logging
import os
import signal

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import RunContext

from src.recipe import check_train_config
from src.training.best import BestCheckpoint
from src.training.callbacks import StepState
from src.training.early_stop import EarlyStop, Patience, ended_early, with_early_stop
from src.training.loop import track_run_end
from src.utils.config import ConfigError, parse_config
from src.utils.tracking import TensorBoardLog
from tests.helpers import run_in_process, sigkill_train_when, train_in_process
from tests.interrupted_run import saved_steps


def stop_epoch(scores, patience, min_delta=0.0, *, first_epoch=0, last_epoch=None):
    """The epoch ``Patience`` stops at, fed ``{epoch: score}`` in epoch order (None: never)."""
    decision = Patience(patience, min_delta, first_epoch=first_epoch, last_epoch=last_epoch)
    for epoch, score in scores.items():
        if decision.observe(score, epoch):
            return epoch
    return None


def every_epoch(*scores):
    return {epoch: score for epoch, score in enumerate(scores, 1)}


@pytest.mark.parametrize("scores, patience, min_delta, expected", [
    # improves until epoch 2, then flat: epochs 3 and 4 without improvement
    (every_epoch(0.1, 0.2, 0.2, 0.2, 0.2, 0.2), 2, 0.0, 4),
    (every_epoch(0.1, 0.2, 0.2, 0.2, 0.2, 0.2), 1, 0.0, 3),
    # a fall counts like a plateau; a later rise resets the count
    (every_epoch(0.5, 0.4, 0.6, 0.5, 0.5, 0.5), 2, 0.0, 5),
    # strictly higher: an equal score is no improvement
    (every_epoch(0.3, 0.3, 0.3), 2, 0.0, 3),
    # rises of 0.005 and 0.003 are below min_delta 0.01: the reference stays at epoch 1
    (every_epoch(0.100, 0.105, 0.108, 0.109), 2, 0.01, 3),
    (every_epoch(0.100, 0.105, 0.108, 0.109), 2, 0.0, None),
    # a rise of more than min_delta over the reference (not over the last score) counts
    (every_epoch(0.100, 0.105, 0.111, 0.111, 0.111), 2, 0.01, 5),
    # 0 = off
    (every_epoch(0.5, 0.1, 0.1, 0.1, 0.1), 0, 0.0, None),
])
def test_the_run_stops_after_patience_epochs_without_improvement(scores, patience, min_delta,
                                                                  expected):
    assert stop_epoch(scores, patience, min_delta) == expected


def test_epochs_are_counted_not_evaluations():
    """Evaluations every 2 epochs (at 2, 4, 6, 8): patience 3 stops at the first evaluation 3
    or more epochs after the best (epoch 6), not after 3 evaluations (epoch 8)."""
    scores = {2: 0.5, 4: 0.4, 6: 0.4, 8: 0.4, 10: 0.4}
    assert stop_epoch(scores, 3) == 6
    assert stop_epoch(scores, 4) == 6
    assert stop_epoch(scores, 5) == 8


def test_lp_ft_counts_the_fine_tuning_phase_only():
    """The linear probe (epochs 1-2) scores higher than fine-tuning's start: not counted, the
    reference is fine-tuning's first evaluation."""
    scores = every_epoch(0.9, 0.9, 0.5, 0.5, 0.5, 0.5, 0.5)
    assert stop_epoch(scores, 2, first_epoch=2) == 5
    assert stop_epoch(scores, 2) == 3  # counted from the probe, it would stop at once


def test_the_last_epoch_is_no_early_stop():
    scores = every_epoch(0.5, 0.5, 0.5)
    assert stop_epoch(scores, 2, last_epoch=3) is None
    assert stop_epoch(scores, 2, last_epoch=4) == 3


@pytest.mark.parametrize("split", range(0, 7))
def test_a_resume_at_any_epoch_stops_where_the_whole_run_does(split):
    """The state stored in a checkpoint (through JSON, as saved) continues the count: a run
    resumed after any epoch stops at the same epoch as the uninterrupted one."""
    scores = every_epoch(0.1, 0.3, 0.2, 0.31, 0.305, 0.3, 0.3, 0.3, 0.3)
    whole = stop_epoch(scores, 3, 0.005, first_epoch=1)
    assert whole == 7
    first = Patience(3, 0.005, first_epoch=1)
    for epoch in range(1, split + 1):
        first.observe(scores[epoch], epoch)
    second = Patience(3, 0.005, first_epoch=1)
    second.restore(json.loads(json.dumps(first.state())) if first.state() else None)
    stops = [e for e in range(split + 1, 10) if second.observe(scores[e], e)]
    assert stops[:1] == [whole]


def test_a_stopped_run_ends_unless_a_larger_patience_is_given():
    stored = {"top1": 0.5, "epoch": 2, "stopped": 5}
    assert ended_early(stored, 5, None)  # patience not given: the decision stands
    assert ended_early(stored, 5, 3) and ended_early(stored, 5, 2)
    assert not ended_early(stored, 5, 4)  # 3 epochs without improvement: 4 trains on
    assert not ended_early(stored, 5, 0)  # early stopping off, given
    assert not ended_early(stored, 4, None)  # a checkpoint before the stop
    assert not ended_early(dict(stored, stopped=None), 5, None) and not ended_early(None, 5, 3)
    larger = Patience(4)
    larger.restore(stored)
    assert [e for e in (6, 7) if larger.observe(0.5, e)][0] == 6  # 4 epochs after epoch 2
    restarted = Patience(3)  # --overwrite: counted from the stop again
    restarted.restore(stored, restart_at=5)
    assert [e for e in (6, 7, 8, 9) if restarted.observe(0.5, e)][0] == 8
    resumed = Patience(3)  # --overwrite on a checkpoint that did not stop: nothing changes
    resumed.restore(dict(stored, stopped=None), restart_at=4)
    assert resumed.epoch == 2


def run_context():
    return RunContext(type("Params", (dict,), {"__getattr__": dict.__getitem__})(
        train_network=nn.Dense(2, 2), net_outputs=ms.Tensor(np.float32(1.0))))


def test_the_callback_stops_on_the_ema_top1_and_records_why(tmp_path, caplog):
    """best_on_ema: the live top-1 rises every epoch, the EMA's stays: the run stops after
    patience epochs; the stop is in the state (the loop and the saver read it), the log line
    names the best epoch, score and checkpoint, metrics.jsonl and TensorBoard get the reason,
    the checkpoints' score carries the count, and Model.train is asked to stop."""
    steps_per_epoch, patience = 3, 2
    best = BestCheckpoint(str(tmp_path / "resnet18-best.ckpt"), on_ema=True, write=False)
    state = StepState()
    decision = Patience(patience, 0.0, last_epoch=10)
    records = tmp_path / "metrics.jsonl"
    tracker = TensorBoardLog(str(tmp_path / "tensorboard"))
    early = EarlyStop(decision, best, state, steps_per_epoch=steps_per_epoch,
                      metrics_path=str(records), logger=logging.getLogger("test"),
                      tracker=tracker)
    stored = with_early_stop(best.score, decision)
    stopped_at = None
    for epoch in range(1, 11):
        context = run_context()
        state.global_step = epoch * steps_per_epoch
        best.update({"top1": 0.1 * epoch, "ema_top1": 0.4}, epoch, nn.Dense(2, 2))
        with caplog.at_level(logging.INFO, logger="test"):
            early.on_train_epoch_end(context)
        if context.get_stop_requested():
            stopped_at = epoch
            break
        assert state.early_stop is None
    tracker.close()
    assert stopped_at == 1 + patience and state.early_stop == stopped_at
    line = [r.getMessage() for r in caplog.records if "early stopping" in r.getMessage()]
    assert len(line) == 1 and f"best epoch 1, ema_top1 0.4: {best.path}" in line[0]
    record = json.loads(records.read_text().splitlines()[-1])
    assert record == {"event": "early_stop", "epoch": 3, "step": 9, "metric": "ema_top1",
                      "patience": 2, "min_delta": 0.0, "reference_epoch": 1, "best_epoch": 1,
                      "best": 0.4, "checkpoint": best.path}
    assert stored()["early_stop"] == {"top1": 0.4, "epoch": 1, "stopped": 3}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    reader = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    reader.Reload()
    (event,) = reader.Tensors("run/early_stop/text_summary")
    assert event.step == 9 and event.tensor_proto.string_val[0].decode() == line[0]


def test_the_callback_skips_epochs_without_an_evaluation():
    """Epoch ends without an evaluation at that epoch (eval_interval, a sink call inside an
    epoch) leave the count alone."""
    best = BestCheckpoint("unused-best.ckpt", write=False)
    state, decision = StepState(), Patience(1)
    early = EarlyStop(decision, best, state, steps_per_epoch=4, metrics_path=None,
                      logger=logging.getLogger("test"))
    best.update({"top1": 0.5}, 1, None)
    for step in (4, 6, 8, 12):  # epoch 1 (evaluated), a sink call, epochs 2 and 3 (not)
        state.global_step = step
        early.on_train_epoch_end(run_context())
    assert decision.epoch == 1 and state.early_stop is None


def test_the_run_end_hyperparameters_take_the_last_epoch_record_not_the_event(tmp_path):
    """TensorBoard's hparams at the end read metrics.jsonl's last epoch record; the early
    stop's record after it holds no loss or top-1."""
    epoch = {"epoch": 3, "step": 9, "loss": 2.5, "top1": 0.25, "best_top1": 0.5}
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps(epoch) + "\n" + json.dumps({"event": "early_stop", "epoch": 3, "step": 9})
        + "\n")
    written = []
    tracker = type("Tracker", (), {"hparams": lambda self, *args: written.append(args),
                                   "close": lambda self: None})()
    callbacks = type("Callbacks", (), {})()
    callbacks.monitor = type("Monitor", (), {"tracker": tracker})()
    callbacks.state = StepState(9)
    track_run_end(callbacks, str(tmp_path), {"net_name": "resnet18"})
    assert written == [({"net_name": "resnet18"}, {"hparams/loss": 2.5, "hparams/top1": 0.25,
                                                   "hparams/best_top1": 0.5}, 9)]


@pytest.mark.parametrize("flag, value, message", [
    ("early_stopping_patience", "-1", "early_stopping_patience must be 0 or positive, got -1"),
    ("early_stopping_patience", "2.5", "key 'early_stopping_patience' expects an integer"),
    ("early_stopping_min_delta", "-0.1", "early_stopping_min_delta must be in [0, 1), got -0.1"),
    ("early_stopping_min_delta", "1", "early_stopping_min_delta must be in [0, 1), got 1.0"),
])
def test_bad_values_are_named(flag, value, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        parse_config([f"--{flag}", value])


def test_early_stopping_without_evaluation_exits_2_naming_the_key(tmp_path):
    cfg = parse_config(["--data_path", str(tmp_path), "--early_stopping_patience", "3"])
    with pytest.raises(ConfigError, match="early_stopping_patience 3 needs an evaluation "
                                          "during training: set run_eval true"):
        check_train_config(cfg)
    result = run_in_process("train.py", "--data_path", tmp_path, "--output_dir",
                            tmp_path / "out", "--early_stopping_patience", "3")
    assert result.returncode == 2 and "error: early_stopping_patience 3" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


# ResNet-18 at 32 px on 80 real images, 2 steps of 40 per epoch, 30 eval images; an LR of
# 1e-30 moves no weight (each step changes a parameter by far less than its float32 spacing)
# and frozen BatchNorm keeps its statistics: the top-1 stays where it starts.
PLATEAU = ["--config_path", "configs/quick_start.yaml", "--batch_size", "40",
           "--epoch_size", "6", "--warmup_epochs", "0", "--base_lr", "1e-30",
           "--freeze_bn", "true", "--run_eval", "true", "--eval_interval", "1",
           "--save_checkpoint_epochs", "2", "--num_parallel_workers", "1",
           "--early_stopping_patience", "2"]
STEPS_PER_EPOCH = 2


@pytest.mark.slow
def test_a_plateau_stops_after_patience_and_a_resume_stops_at_the_same_epoch(
        cifar_small, tmp_path, capsys):
    """On 1 device: a run whose top-1 cannot move stops after patience + 1 evaluations (exit
    0, the epoch's checkpoint saved off the save cadence, the reason recorded last in
    metrics.jsonl). The same run killed with SIGKILL mid-epoch 2 (after the evaluation the
    count starts from) and resumed stops at the same epoch, bit-exact, with the same records.
    The stopped run resumed trains nothing; resumed with a larger patience, it trains on."""
    args = [*PLATEAU, "--data_path", cifar_small["train"], "--eval_data_path",
            cifar_small["test"]]
    whole = tmp_path / "whole"
    assert train_in_process(*args, "--output_dir", whole) == 0
    lines = (whole / "metrics.jsonl").read_text().splitlines()
    epochs, event = [json.loads(line) for line in lines[:-1]], json.loads(lines[-1])
    assert len({r["top1"] for r in epochs}) == 1  # the premise: a plateau from epoch 1
    assert [r["epoch"] for r in epochs] == [1, 2, 3]  # patience 2 + 1 evaluations of 6
    assert event["event"] == "early_stop" and event["epoch"] == 3 and event["best_epoch"] == 1
    final = "resnet18-3_2.ckpt"
    assert sorted(p.name for p in whole.glob("resnet18-*_*.ckpt")) == ["resnet18-2_2.ckpt",
                                                                        final]
    assert "resnet18-best.ckpt" in event["checkpoint"]
    assert f"best epoch 1, top1 {epochs[0]['top1']:.6g}" in (whole / "train.log").read_text()

    # The same run in a process of its own, saving every step, killed with SIGKILL once it
    # has saved a step after epoch 1's evaluation (the reference of the count) and before the
    # stopping epoch's checkpoint; resumed, it stops at the same epoch, bit-exact.
    killed = tmp_path / "killed"
    run = sigkill_train_when(
        [*args, "--output_dir", killed, "--save_checkpoint_steps", "1"],
        lambda: saved_steps(killed, STEPS_PER_EPOCH)[-1:] >= [STEPS_PER_EPOCH + 1])
    assert run.returncode == -signal.SIGKILL, f"not killed: exit {run.returncode}\n" \
                                              f"{run.stderr[-3000:]}"
    done = saved_steps(killed, STEPS_PER_EPOCH)
    assert STEPS_PER_EPOCH < done[-1] < 3 * STEPS_PER_EPOCH, f"killed after step {done}"
    capsys.readouterr()
    assert train_in_process(*args, "--output_dir", killed, "--resume_ckpt", "auto") == 0
    assert f"{done[-1]} steps done" in capsys.readouterr().out
    resumed = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("event") or r["epoch"] for r in resumed] == [1, 2, 3, "early_stop"]
    timing = ("time_s", "img_per_s")
    assert [{k: v for k, v in r.items() if k not in timing} for r in resumed[:-1]] == [
        {k: v for k, v in r.items() if k not in timing} for r in epochs]  # loss, top-1, best
    assert resumed[-1] == dict(event, checkpoint=event["checkpoint"].replace("whole", "killed"))
    reference, again = (ms.load_checkpoint(str(folder / final)) for folder in (whole, killed))
    assert set(again) == set(reference)
    assert any(n.startswith("moments.") for n in reference)  # the optimizer state too
    for name, value in reference.items():
        if name != "run_config":  # it says resume_ckpt auto
            if isinstance(value, str):
                assert again[name] == value, name  # the best score and the count
            else:
                np.testing.assert_array_equal(again[name].asnumpy(), value.asnumpy(), name)

    capsys.readouterr()
    before = sorted(os.listdir(whole))
    assert train_in_process(*args, "--output_dir", whole, "--resume_ckpt", "auto") == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "stopped early" in line]
    assert len(said) == 1 and "after epoch 3" in said[0] and "nothing to train" in said[0]
    assert sorted(os.listdir(whole)) == before and len(
        (whole / "metrics.jsonl").read_text().splitlines()) == len(lines)

    assert train_in_process(*args, "--output_dir", killed, "--resume_ckpt", "auto",
                            "--early_stopping_patience", "3") == 0
    extended = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("event") or r["epoch"] for r in extended] == [1, 2, 3, "early_stop", 4,
                                                                 "early_stop"]
    assert extended[-1]["epoch"] == 4 and extended[-1]["reference_epoch"] == 1
