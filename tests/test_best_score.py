"""The best evaluation score survives a resume (stored in every training checkpoint, restored
before the first evaluation), and the run's other writes: the epoch's record before a step
save on the epoch's last step, a record that cannot be written stops the run."""
import logging
import os

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.train import RunContext

from src.training.callbacks import StepState, TrainMonitor
from src.training.evaluator import BestCheckpointEvaluator, EvalCounts, EvalShard
from src.training.saver import CheckpointSaver
from src.training.signals import StopSignals
from src.utils.checkpoint import load_into_network, read_checkpoint, stored_best
from src.utils.errors import WriteError

LOG = logging.getLogger("test")


class Params(dict):
    __getattr__ = dict.__getitem__


def context(net):
    return RunContext(Params(train_network=net, cur_epoch_num=1,
                             net_outputs=ms.Tensor(np.float32(1.0))))


def test_every_training_checkpoint_stores_the_best_score_and_eval_ignores_it(tmp_path):
    net = nn.Dense(2, 2)
    state = StepState()
    saver = CheckpointSaver(state, StopSignals(LOG), str(tmp_path), "net", 10, 20,
                            best=lambda: {"top1": 0.51, "epoch": 2})
    state.global_step = 10
    saver.on_train_epoch_end(context(net))
    params = read_checkpoint(saver.last_saved)
    assert stored_best(params) == {"top1": 0.51, "epoch": 2}
    load_into_network(nn.Dense(2, 2), saver.last_saved)  # strict: the key is metadata


def evaluator_scoring(tmp_path, top1_counts):
    """A ``BestCheckpointEvaluator`` whose evaluations give ``top1_counts`` / 1000 in turn."""
    net = nn.Dense(2, 2)
    evaluator = BestCheckpointEvaluator(None, EvalShard(None), str(tmp_path / "net-best.ckpt"),
                                        net)
    scores = iter(top1_counts)
    evaluator.count = lambda model, confusion=False: EvalCounts(next(scores), 990, 1000, 0.0)
    return evaluator


def test_a_resumed_evaluator_keeps_the_best_of_the_checkpoint(tmp_path):
    # seen before the fix: best 0.510, then 0.477 after a resume overwrote the best file
    evaluator = evaluator_scoring(tmp_path, [477, 530])
    evaluator.restore({"top1": 0.51, "epoch": 2})
    assert evaluator(3)["best_top1"] == 0.51
    assert not os.path.exists(tmp_path / "net-best.ckpt")
    assert evaluator.best_score() == {"top1": 0.51, "epoch": 2}
    assert evaluator(4)["best_top1"] == 0.53 and os.path.exists(tmp_path / "net-best.ckpt")
    assert evaluator.best_score() == {"top1": 0.53, "epoch": 4}


def test_a_fresh_evaluator_has_no_best_to_store(tmp_path):
    evaluator = evaluator_scoring(tmp_path, [100])
    evaluator.restore(None)
    assert evaluator.best_score() is None
    evaluator(1)
    assert evaluator.best_score() == {"top1": 0.1, "epoch": 1}


def test_a_step_save_on_an_epoch_s_last_step_waits_for_the_epoch_s_record(tmp_path):
    state = StepState()
    monitor = TrainMonitor(state, np.zeros(20, np.float32), 8, 10, 100,
                           str(tmp_path / "metrics.jsonl"), LOG)
    saver = CheckpointSaver(state, StopSignals(LOG), str(tmp_path), "net", 10, 20,
                            save_epochs=100, save_steps=5)
    run = context(nn.Dense(2, 2))
    monitor.on_train_begin(run)
    monitor.on_train_epoch_begin(run)
    listed = []
    for _ in range(10):
        for callback in (state, monitor, saver):
            callback.on_train_step_end(run)
        listed.append(sorted(os.listdir(tmp_path)))
    assert listed[4] == ["net-1_5.ckpt"]  # a multiple inside the epoch: saved at once
    assert listed[9] == ["net-1_5.ckpt"]  # on the epoch's last step: not before its record
    monitor.on_train_epoch_end(run)
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "net-1_5.ckpt"]
    saver.on_train_epoch_end(run)
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "net-1_10.ckpt", "net-1_5.ckpt"]


def test_a_record_that_cannot_be_written_stops_the_run(tmp_path, monkeypatch):
    import src.utils.files as files

    def full_disk(path, text):
        raise WriteError(f"cannot write {path}: No space left on device")

    monkeypatch.setattr(files, "atomic_write_text", full_disk)
    state = StepState()
    monitor = TrainMonitor(state, np.zeros(20, np.float32), 8, 10, 100,
                           str(tmp_path / "metrics.jsonl"), LOG)
    run = context(nn.Dense(2, 2))
    monitor.on_train_begin(run)
    monitor.on_train_epoch_begin(run)
    for _ in range(10):
        state.on_train_step_end(run)
        monitor.on_train_step_end(run)
    monitor.on_train_epoch_end(run)
    assert monitor.error.endswith("metrics.jsonl: No space left on device")
    assert run.get_stop_requested()
