"""Which weights the best checkpoint holds (``best_on_ema``), and which files a resumed run may
prune (``src.utils.checkpoint.own_checkpoints`` and ``prune``).

``best_on_ema``: an ``Evaluator`` built as ``src.recipe.build_evaluator`` builds it (the live
network's Model, a second network of the same architecture for the EMA's averages,
``best_on_ema`` from the config), on a stand-in network (one Dense layer, a few 2-D points):
it evaluates as a ResNet does (the eval cell of ``src.training.model``, top-1 counted by
``TopKCounter``), in a second instead of a minute. The EMA's averages and the live weights
differ and rank differently over two evaluations, so the checkpoint written tells both which
top-1 chose it and whose weights it holds.

``own_checkpoints``: a resumed run may delete (``keep_checkpoint_max``) only the periodic
checkpoints of the run it continues: ``PREFIX-E_S.ckpt`` in its output folder at or before the
resume step; never another prefix's files, the best checkpoint, partial files, files in
sub-folders (an earlier run moved aside) or files of later steps.
"""
import json
import os

import mindspore as ms
import mindspore.dataset as ds
import mindspore.nn as nn
import numpy as np
import pytest

from src.training.best import BestCheckpoint, EvalKeepingBest
from src.training.evaluator import EvalShard, Evaluator
from src.training.model import eval_model
from src.training.train_step import WeightEma
from src.utils.checkpoint import own_checkpoints, prune

# ---- best_on_ema ----

# 8 points of two classes: class 0 where x0 > 0, class 1 where x0 < 0; x1 is half the time
# on the class's side, half not.
POINTS = np.array([[1, 1], [2, -1], [1.5, 2], [0.5, -2], [-1, 1], [-2, -1], [-0.5, 2],
                   [-1.5, -2]], np.float32)
LABELS = np.array([0, 0, 0, 0, 1, 1, 1, 1], np.int32)
# Dense weights (out, in) and their top-1 on POINTS
RIGHT = np.array([[1.0, 0.0], [-1.0, 0.0]], np.float32)  # top-1 1.0
RIGHT_TOO = np.array([[3.0, 0.5], [-3.0, -0.5]], np.float32)  # top-1 1.0, other weights
HALF = np.array([[0.0, 1.0], [0.0, -1.0]], np.float32)  # top-1 0.5
WRONG = -RIGHT  # top-1 0.0


class StandIn(nn.Cell):
    """The network: one Dense layer, its parameters named as a network's (``fc.weight``)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(2, 2)

    def construct(self, x):
        return self.fc(x)


def set_weights(params, weight):
    """Give the Dense weight ``weight`` and the bias 0 (``params``: name -> Parameter)."""
    for name, param in params.items():
        value = weight if name.endswith("weight") else np.zeros(2, np.float32)
        param.set_data(ms.Tensor(value))


def evaluator(tmp_path, best_on_ema):
    """(evaluation, live net, EMA, best checkpoint path) as train.py's ``build_callbacks``
    makes them: ``build_evaluator``'s ``Evaluator`` (the live network's Model, a second
    network of the same architecture for the averages, whose Model is ``eval_model``'s) and
    a ``BestCheckpoint``, composed by ``EvalKeepingBest``."""
    net = StandIn()
    ema = WeightEma(net, 0.9)
    model = eval_model(net, "O0", 0.1, 2)
    ema_model = eval_model(StandIn(), "O0", 0.1, 2)
    data = ds.NumpySlicesDataset({"image": POINTS, "label": LABELS}, shuffle=False).batch(3)
    best = str(tmp_path / "net-best.ckpt")
    return EvalKeepingBest(Evaluator(model, EvalShard(data), net, ema=ema, ema_model=ema_model),
                           BestCheckpoint(best, on_ema=best_on_ema, write=True)), net, ema, best


def evaluate_twice(tmp_path, best_on_ema):
    """Evaluation 1: live RIGHT (1.0), EMA WRONG (0.0); evaluation 2: live HALF (0.5), EMA
    RIGHT_TOO (1.0). Returns the two results and the best checkpoint's fc.weight."""
    run, net, ema, best = evaluator(tmp_path, best_on_ema)
    live = {p.name: p for p in net.get_parameters()}
    averages = ema.by_network_name()
    assert sorted(averages) == sorted(live) == ["fc.bias", "fc.weight"]
    results = []
    for live_weight, ema_weight in ((RIGHT, WRONG), (HALF, RIGHT_TOO)):
        set_weights(live, live_weight)
        set_weights(averages, ema_weight)
        results.append(run(len(results) + 1))
    saved = ms.load_checkpoint(best)
    # the network's names, no "ema." prefix, and the score it was chosen on (``best_score``)
    assert sorted(saved) == ["best_score", "fc.bias", "fc.weight"]
    assert json.loads(saved["best_score"]) == run.best.score()
    return results, saved["fc.weight"].asnumpy()


def test_best_checkpoint_holds_the_live_weights_chosen_by_their_top1(tmp_path):
    (first, second), weight = evaluate_twice(tmp_path, best_on_ema=False)
    assert (first["top1"], first["ema_top1"], second["top1"], second["ema_top1"]) == (
        1.0, 0.0, 0.5, 1.0)
    assert first["best_top1"] == second["best_top1"] == 1.0  # the live top-1
    assert list(first) == ["top1", "top5", "eval_loss", "ema_top1", "ema_top5",
                           "ema_eval_loss", "best_top1", "eval_images"]  # the record's order
    # written at evaluation 1 (the live weights' best), not replaced at evaluation 2
    np.testing.assert_array_equal(weight, RIGHT)


def test_best_on_ema_checkpoint_holds_the_averages_chosen_by_their_top1(tmp_path):
    (first, second), weight = evaluate_twice(tmp_path, best_on_ema=True)
    assert (first["best_top1"], second["best_top1"]) == (0.0, 1.0)  # the EMA's top-1
    # replaced at evaluation 2, when the EMA's top-1 rose, by the averages, not the live HALF
    np.testing.assert_array_equal(weight, RIGHT_TOO)


# ---- the eval loss and the confusion matrix (TensorBoard's eval/loss and picture) ----

@pytest.mark.parametrize("ranks", [1, 2])
def test_eval_loss_and_confusion_count_the_shard_s_own_images_over_the_ranks(tmp_path, ranks):
    """Live weights HALF on a shard of 7 images (the 8th row is padding): ``eval_loss`` is the
    mean over the 7 of PyTorch's cross-entropy with the run's label smoothing, the confusion
    matrix counts their top-1 (row = true class). Two ranks are stood in for by collectives
    that double every sum: the same mean, twice the counts."""
    import torch
    net = StandIn()
    set_weights({p.name: p for p in net.get_parameters()}, HALF)
    data = ds.NumpySlicesDataset({"image": POINTS, "label": LABELS}, shuffle=False).batch(3)
    double = {} if ranks == 1 else {"sum_over_ranks": lambda v: [2 * x for x in v],
                                    "broadcast": lambda arrays: arrays,
                                    "sum_arrays": lambda a: 2 * a}
    run = Evaluator(eval_model(net, "O0", 0.1, 2), EvalShard(data, 7, **double), net,
                    class_num=2, confusion_of="top1")
    result = run()
    logits = torch.from_numpy(POINTS[:7].astype(np.float64) @ HALF.T)
    expected = torch.nn.functional.cross_entropy(logits, torch.from_numpy(LABELS[:7]).long(),
                                                 label_smoothing=0.1)
    # MindSpore's float32 log-softmax on CPU: within 1.5e-6 of the float64 value, seen
    assert result["eval_loss"] == pytest.approx(float(expected), rel=1e-5)
    confusion = np.zeros((2, 2), np.int64)
    np.add.at(confusion, (LABELS[:7], logits.numpy().argmax(1)), 1)
    np.testing.assert_array_equal(run.confusion, ranks * confusion)
    assert result["eval_images"] == 7 * ranks
    assert result["top1"] == np.trace(confusion) / 7


# ---- own_checkpoints and prune ----

PREFIX, STEPS_PER_EPOCH, RESUME_STEP = "resnet18", 4, 10
OWN = ["resnet18-1_4.ckpt", "resnet18-2_4.ckpt", "resnet18-3_2.ckpt"]  # steps 4, 8, 10
NOT_OWN = [
    "resnet18-3_4.ckpt",  # step 12: later than the resume step (a run resumed from step 10)
    "resnet18-4_1.ckpt",  # step 13
    "resnet18-best.ckpt",  # the best checkpoint
    "resnet50-1_4.ckpt",  # another network's run in the same folder
    "resnet18_v2-1_4.ckpt", "xresnet18-2_4.ckpt",  # other prefixes
    "resnet18-2_4.partial.ckpt", "resnet18-2_4.partial.tmp",  # a save that did not finish
    "resnet18-2_4.ckpt.bak", "resnet18-1_4.ckpt.txt", "notes.txt",
    os.path.join("previous_run_20250101-000000", "resnet18-1_4.ckpt"),  # moved aside
    os.path.join("previous_run_20250101-000000", "resnet18-2_4.ckpt"),
]


@pytest.fixture
def run_folder(tmp_path):
    """An output folder with the files of the run resumed at step 10 and everything else."""
    for name in OWN + NOT_OWN:
        os.makedirs(os.path.dirname(tmp_path / name), exist_ok=True)
        (tmp_path / name).write_bytes(b"ckpt")
    return str(tmp_path)


def listing(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder)
                  for d, _, files in os.walk(folder) for f in files)


def test_own_checkpoints_are_this_runs_files_up_to_the_resume_step(run_folder):
    own = own_checkpoints(run_folder, PREFIX, STEPS_PER_EPOCH, RESUME_STEP)
    assert [os.path.basename(p) for p in own] == OWN  # oldest first
    assert all(os.path.dirname(p) == run_folder for p in own)
    # resumed at the very first saved step, or before any
    assert [os.path.basename(p) for p in own_checkpoints(
        run_folder, PREFIX, STEPS_PER_EPOCH, 4)] == OWN[:1]
    assert own_checkpoints(run_folder, PREFIX, STEPS_PER_EPOCH, 3) == []


@pytest.mark.parametrize("keep", [1, 2, 3, 5])
def test_pruning_a_resumed_run_deletes_only_its_oldest_own_files(run_folder, keep):
    """As ``CheckpointSaver`` after its first save at step 12 (the same name as the later
    file, overwritten): the run's files then that one, ``keep_checkpoint_max`` kept."""
    own = own_checkpoints(run_folder, PREFIX, STEPS_PER_EPOCH, RESUME_STEP)
    saved = os.path.join(run_folder, "resnet18-3_4.ckpt")
    kept = prune(own + [saved], keep)
    expected_kept = (OWN + ["resnet18-3_4.ckpt"])[-keep:]
    assert [os.path.basename(p) for p in kept] == expected_kept
    deleted = [n for n in OWN if n not in expected_kept]
    assert listing(run_folder) == sorted(set(OWN + NOT_OWN) - set(deleted))


def test_a_longer_prefix_is_another_runs(run_folder):
    """``resnet18-run2-1_4.ckpt`` is a file of prefix ``resnet18-run2`` (say a copy kept by
    hand), not ``resnet18``'s checkpoint of epoch "run2-1": never this run's to prune."""
    for name in ("resnet18-run2-1_4.ckpt", "resnet18-best-2_4.ckpt", "resnet18--1_4.ckpt"):
        with open(os.path.join(run_folder, name), "wb") as f:
            f.write(b"ckpt")
    own = own_checkpoints(run_folder, PREFIX, STEPS_PER_EPOCH, RESUME_STEP)
    assert [os.path.basename(p) for p in own] == OWN
