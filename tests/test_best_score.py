"""The best evaluation score survives a resume (stored in every training checkpoint, restored
before the first evaluation), and the run's other writes: the epoch's record before a step
save on the epoch's last step, a record that cannot be written stops the run."""
import logging
import os

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.train import RunContext

from src.training.best import BestCheckpoint, EvalKeepingBest
from src.training.callbacks import NOT_WRITTEN, StepState, TrainMonitor
from src.training.evaluator import EvalCounts, EvalShard, Evaluator
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


def one_epoch(monitor, state, steps=10):
    """Drive ``monitor`` through one epoch of ``steps`` steps as Model.train calls it; returns
    the run context (its stop request tells whether training was asked to stop)."""
    run = context(nn.Dense(2, 2))
    monitor.on_train_begin(run)
    monitor.on_train_epoch_begin(run)
    for _ in range(steps):
        state.on_train_step_end(run)
        monitor.on_train_step_end(run)
    monitor.on_train_epoch_end(run)
    return run


def test_every_training_checkpoint_stores_the_best_score_and_eval_ignores_it(tmp_path):
    net = nn.Dense(2, 2)
    state = StepState()
    best = BestCheckpoint(str(tmp_path / "net-best.ckpt"))
    best.restore({"top1": 0.51, "epoch": 2})
    saver = CheckpointSaver(state, StopSignals(LOG), output_dir=str(tmp_path), prefix="net",
                            steps_per_epoch=10, total_steps=20, best=best.score)
    state.global_step = 10
    saver.on_train_epoch_end(context(net))
    params = read_checkpoint(saver.last_saved)
    assert stored_best(params) == {"top1": 0.51, "epoch": 2}
    assert params["best_score"] == '{"top1": 0.51, "epoch": 2}'  # the string, as before
    load_into_network(nn.Dense(2, 2), saver.last_saved)  # strict: the key is metadata


def evaluator_scoring(tmp_path, top1_counts, name="net-best.ckpt"):
    """train.py's ``EvalKeepingBest`` of an ``Evaluator`` whose evaluations give
    ``top1_counts`` / 1000 in turn and a ``BestCheckpoint`` writing ``name``."""
    net = nn.Dense(2, 2)
    evaluator = Evaluator(None, EvalShard(None), net)
    scores = iter(top1_counts)
    evaluator.count = lambda model, confusion=False: EvalCounts(next(scores), 990, 1000, 0.0)
    return EvalKeepingBest(evaluator, BestCheckpoint(str(tmp_path / name)))


def test_a_resumed_evaluator_keeps_the_best_of_the_checkpoint(tmp_path):
    # seen before the fix: best 0.510, then 0.477 after a resume overwrote the best file
    evaluate = evaluator_scoring(tmp_path, [477, 530, 530])
    best, path = evaluate.best, tmp_path / "net-best.ckpt"
    best.restore({"top1": 0.51, "epoch": 2})
    assert evaluate(3)["best_top1"] == 0.51
    assert not path.exists() and not best.is_new
    assert best.score() == {"top1": 0.51, "epoch": 2}
    assert evaluate(4)["best_top1"] == 0.53 and path.exists() and best.is_new
    assert best.score() == {"top1": 0.53, "epoch": 4}
    assert stored_best(read_checkpoint(str(path))) == {"top1": 0.53, "epoch": 4}
    os.remove(path)
    # a tie is no new best: the epoch stays, nothing is written
    assert evaluate(5)["best_top1"] == 0.53 and not best.is_new and not path.exists()
    assert best.score() == {"top1": 0.53, "epoch": 4}


def test_a_fresh_evaluator_has_no_best_to_store(tmp_path):
    evaluate = evaluator_scoring(tmp_path, [100])
    evaluate.best.restore(None)
    assert evaluate.best.score() is None
    evaluate(1)
    assert evaluate.best.score() == {"top1": 0.1, "epoch": 1}


def test_a_resume_starts_from_the_higher_of_the_checkpoint_s_and_the_folder_s_best(tmp_path):
    ours, folder = {"top1": 0.5, "epoch": 2}, {"top1": 0.6, "epoch": 3}
    for stored, in_folder, expected in ((ours, folder, folder), (folder, ours, folder),
                                        (ours, None, ours), (None, folder, folder),
                                        (ours, {"top1": 0.5, "epoch": 3}, ours),
                                        (None, None, None)):
        best = BestCheckpoint(str(tmp_path / "net-best.ckpt"))
        best.restore(stored, in_folder)
        assert best.score() == expected, (stored, in_folder)


def test_an_epoch_record_s_evaluation_keys_in_their_order(tmp_path):
    # metrics.jsonl's records: the evaluator's numbers, best_top1, then eval_images
    assert list(evaluator_scoring(tmp_path, [100])(1)) == [
        "top1", "top5", "eval_loss", "best_top1", "eval_images"]


def test_a_best_checkpoint_that_cannot_be_written_stops_the_run(tmp_path):
    (tmp_path / "blocked-best.ckpt" / "keep").mkdir(parents=True)  # a folder in its place
    evaluate = evaluator_scoring(tmp_path, [100, 200], "blocked-best.ckpt")
    state = StepState()
    monitor = TrainMonitor(state, lr=np.zeros(10, np.float32), global_batch_size=8,
                           steps_per_epoch=10, log_interval=100,
                           metrics_path=str(tmp_path / "metrics.jsonl"), logger=LOG,
                           evaluator=evaluate)
    run = one_epoch(monitor, state)
    assert monitor.error.startswith(f"cannot write the best checkpoint {tmp_path}")
    assert state.failure == NOT_WRITTEN and run.get_stop_requested()  # train.py: exit 4
    # recorded, not raised; no second attempt after a failure
    (tmp_path / "blocked-best.ckpt" / "keep").rmdir()
    (tmp_path / "blocked-best.ckpt").rmdir()
    evaluate(2)
    assert evaluate.best.score() == {"top1": 0.2, "epoch": 2}
    assert not (tmp_path / "blocked-best.ckpt").exists()


def test_a_step_save_on_an_epoch_s_last_step_waits_for_the_epoch_s_record(tmp_path):
    state = StepState()
    monitor = TrainMonitor(state, lr=np.zeros(20, np.float32), global_batch_size=8,
                           steps_per_epoch=10, log_interval=100,
                           metrics_path=str(tmp_path / "metrics.jsonl"), logger=LOG)
    saver = CheckpointSaver(state, StopSignals(LOG), output_dir=str(tmp_path), prefix="net",
                            steps_per_epoch=10, total_steps=20, save_epochs=100, save_steps=5)
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
    monitor = TrainMonitor(state, lr=np.zeros(20, np.float32), global_batch_size=8,
                           steps_per_epoch=10, log_interval=100,
                           metrics_path=str(tmp_path / "metrics.jsonl"), logger=LOG)
    run = one_epoch(monitor, state)
    assert monitor.error.endswith("metrics.jsonl: No space left on device")
    assert run.get_stop_requested()
