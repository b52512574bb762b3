"""Multi-label training as the recipe wires it (task multilabel): the keys it refuses and the
defaults it takes, the val_split of a label file and its lists read back by eval.py's
split_file, class_balance loss as pos_weight, the best checkpoint and early stopping on mAP, the
evaluator's scores without a shard's padding. On the shipped mosaics; no training."""
import os
import types

import numpy as np
import pytest
from mindspore.train import RunContext

import src.recipe as recipe
from src.data.multilabel import read_label_file
from src.training.best import BestCheckpoint, stored_score
from src.training.early_stop import Patience
from src.training.evaluator import ScoreCollector
from src.utils.config import ConfigError, parse_config
from src.utils.errors import UserError
from src.utils.multilabel_metrics import sigmoid
from src.utils.tasks import MULTILABEL
from tests.helpers import ROOT

MOSAICS = os.path.join(ROOT, "data", "cifar10_mosaics")
RECIPE = ["--config_path", os.path.join(ROOT, "configs", "multilabel_quick_start.yaml")]


def config(*args):
    return parse_config([*RECIPE, *args])


@pytest.mark.parametrize("args, named", [
    (["--label_file", ""], "label_file is empty"),
    (["--loss", "ce"], "loss ce"),
    (["--label_smoothing", "0.1"], "label_smoothing 0.1"),
    (["--class_balance", "sampler"], "class_balance sampler"),
    (["--kd_teacher", "some.ckpt"], "kd_teacher some.ckpt"),
    (["--eval_label_file", ""], "needs eval_label_file"),
    (["--task", "multiclass"], "label_file"),
    (["--task", "multiclass", "--label_file", "", "--eval_label_file", "", "--loss", "asl"],
     "loss asl"),
])
def test_what_a_multilabel_run_cannot_train_is_refused_by_name(args, named):
    with pytest.raises(ConfigError, match=named):
        recipe.check_train_config(config(*args))


def test_task_multilabel_takes_bce_and_no_smoothing_unless_set():
    """config.yaml's defaults (loss ce, label_smoothing 0.1) are multi-class ones: a multilabel
    run that sets neither trains with bce and 0; one that sets them keeps them (then refused
    above if they cannot work)."""
    cfg = parse_config(["--task", "multilabel", "--data_path", MOSAICS, "--label_file",
                        os.path.join(MOSAICS, "train.csv"), "--class_num", "10"])
    recipe.check_train_config(cfg)  # checked as it trains: bce, no smoothing
    assert (cfg.loss, cfg.label_smoothing) == ("ce", 0.1)  # the checks change nothing
    resolved = recipe.task_defaults(cfg)
    assert (resolved.loss, resolved.label_smoothing) == ("bce", 0.0)
    assert (cfg.loss, cfg.label_smoothing) == ("ce", 0.1)  # a new config
    cfg = config("--loss", "asl")
    recipe.check_train_config(cfg)
    assert recipe.task_defaults(cfg).loss == "asl"


def test_the_val_split_of_a_label_file_is_written_and_read_back_by_split_file(tmp_path):
    """val_split of the training label file: iterative stratification of its rows (disjoint,
    complete), the lists written as for class folders; eval.py's split_file then picks exactly
    the held-out rows of the label file."""
    cfg = config("--eval_data_path", "", "--eval_label_file", "", "--val_split", "0.2",
                 "--output_dir", str(tmp_path))
    table = read_label_file(cfg.label_file, cfg.data_path, check_images=False)
    split = recipe.data_split(cfg)
    assert sorted(np.concatenate([split.train, split.val])) == list(range(len(table.files)))
    assert len(split.val) == pytest.approx(0.2 * len(table.files), abs=1)
    recipe.record_label_file_images(cfg, write=True, log=types.SimpleNamespace(
        info=lambda *a: None, warning=lambda *a: None), checked=(split, []))
    listed = (tmp_path / "val_split.txt").read_text().split()
    assert listed == [table.files[i] for i in split.val]
    evaluated = config("--split_file", str(tmp_path / "val_split.txt"))
    np.testing.assert_array_equal(recipe.split_indices(evaluated), split.val)


def test_class_balance_loss_is_pos_weight_of_the_training_rows():
    """class_balance loss: negatives / positives per class over the rows the run trains on
    (val_split's held-out rows left out), torch's pos_weight rule."""
    cfg = config("--class_balance", "loss", "--eval_data_path", "", "--eval_label_file", "",
                 "--val_split", "0.2")
    table = read_label_file(cfg.label_file, cfg.data_path, check_images=False)
    train = table.targets[recipe.data_split(cfg).train].astype(np.float64)
    expected = (len(train) - train.sum(axis=0)) / train.sum(axis=0)
    np.testing.assert_allclose(recipe.loss_class_weights(cfg), expected, rtol=1e-6)
    assert recipe.loss_kwargs(cfg)["task"] == "multilabel"


def test_the_best_checkpoint_and_early_stopping_follow_and_store_map(tmp_path):
    """A multilabel run's best score and patience state are stored under mAP (what they
    measure), read back as such; a stored top-1 (a multiclass run's) reads as before."""
    best = BestCheckpoint(str(tmp_path / "best.ckpt"), write=False, task=MULTILABEL)
    assert best.metric == "mAP"
    assert not best.update({"mAP": float("nan")}, 1, None) and best.update({"mAP": 0.4}, 2, None)
    assert best.score() == {"mAP": 0.4, "epoch": 2}
    assert best.record({"mAP": 0.4, "eval_images": 9}) == {"mAP": 0.4, "best_mAP": 0.4,
                                                           "eval_images": 9}
    again = BestCheckpoint(str(tmp_path / "best.ckpt"), write=False, task=MULTILABEL)
    again.restore({"mAP": 0.3, "epoch": 1}, {"mAP": 0.4, "epoch": 2})
    assert (again.top1, again.epoch) == (0.4, 2)
    assert BestCheckpoint("x", on_ema=True, task=MULTILABEL).metric == "ema_mAP"
    patience = Patience(2, task=MULTILABEL)
    patience.observe(0.4, 1)
    assert patience.state() == {"mAP": 0.4, "epoch": 1, "stopped": None}
    assert stored_score({"top1": 0.7, "epoch": 3}) == 0.7
    with pytest.raises(KeyError, match="top1, mAP"):
        stored_score({"epoch": 3})


def test_the_scores_of_a_shard_leave_its_padding_out():
    """ScoreCollector keeps the sigmoid scores and targets of the first ``limit`` rows only
    (a data-parallel shard's padding repeats images of the start) and sums their losses."""
    import mindspore as ms
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 4, 5)).astype(np.float32)
    targets = (rng.random((3, 4, 5)) < 0.4).astype(np.float32)
    losses = rng.random((3, 4)).astype(np.float32)
    collector = ScoreCollector(limit=10)
    for step in range(3):
        outputs = (ms.Tensor(losses[step]), ms.Tensor(logits[step]), ms.Tensor(targets[step]))
        params = type("Params", (dict,), {"__getattr__": dict.__getitem__})(net_outputs=outputs)
        collector.on_eval_step_end(RunContext(params))
    kept = collector.counts()
    assert kept.images == 10
    np.testing.assert_array_equal(kept.scores, sigmoid(logits.reshape(12, 5)[:10]))
    np.testing.assert_array_equal(kept.targets, targets.reshape(12, 5)[:10])
    assert kept.loss_sum == pytest.approx(float(losses.reshape(-1)[:10].astype(np.float64).sum()))


def test_the_curves_of_a_multilabel_run_draw_its_map():
    """The training curves' eval panel shows mAP for multi-label records (no top1), top-1
    otherwise, in %."""
    import io

    from src.utils.curves import plot_runs, score_of
    multilabel = [{"epoch": 1, "loss": 0.6, "lr": 0.1, "mAP": 0.3},
                  {"epoch": 2, "loss": 0.5, "lr": 0.05, "mAP": 0.4}]
    assert score_of([("run", multilabel)]) == "mAP"
    assert score_of([("run", [dict(r, top1=0.5) for r in multilabel])]) == "top1"
    import matplotlib.pyplot as plt
    drawn = []
    original = plt.Axes.plot
    try:
        plt.Axes.plot = lambda ax, *a, **k: drawn.append((ax.get_title(), a)) or original(
            ax, *a, **k)
        plot_runs([("run", multilabel)], io.BytesIO())
    finally:
        plt.Axes.plot = original
    assert ((1, 2), (30.0, 40.0)) in [a for _, a in drawn]


def test_predict_gives_each_image_of_the_label_file_its_true_labels():
    """predict.py's label_file: the rows relative to data_path (else the image_path folder),
    each listed image's names in class order; a training config's label file (other images)
    gives none; refused for a multiclass model."""
    import predict
    classes = read_label_file(os.path.join(MOSAICS, "train.csv"), MOSAICS,
                              check_images=False).class_names
    cfg = parse_config(["--task", "multilabel", "--image_path", MOSAICS, "--label_file",
                        os.path.join(MOSAICS, "val.csv")])
    truth = predict.true_labels(cfg, classes)
    assert len(truth) == 150
    assert truth[os.path.normpath(os.path.join(MOSAICS, "val", "0001.jpg"))] == [
        "cat", "dog", "frog"]
    trained_on = predict.true_labels(config("--image_path", os.path.join(MOSAICS, "val")),
                                     classes)
    assert os.path.normpath(os.path.join(MOSAICS, "val", "0001.jpg")) not in trained_on
    with pytest.raises(ConfigError, match="multi-label"):
        predict.true_labels(parse_config(["--image_path", MOSAICS, "--label_file",
                                          os.path.join(MOSAICS, "val.csv")]), classes)


@pytest.mark.parametrize("content, error, message", [
    (b"airplane\nautomobile\nbird\ncat\ncat\ndog\nfrog\nhorse\nship\ntruck\n",
     ConfigError, r"class_names.txt names a class more than once \(cat\)"),
    (b"\xff\xfeairplane\n", UserError, r"class_names.txt is not UTF-8 text .*save it as UTF-8")])
def test_a_bad_class_names_file_beside_the_label_file_is_refused_by_name(tmp_path, content,
                                                                        error, message):
    """class_names.txt beside a label file sets the class order; a name given twice (which
    label is "cat"?) or a file that is not UTF-8 is one named error, not a traceback."""
    label_file = tmp_path / "train.csv"
    label_file.write_text(open(os.path.join(MOSAICS, "train.csv")).read())
    (tmp_path / "class_names.txt").write_bytes(content)
    cfg = parse_config(["--task", "multilabel", "--data_path", MOSAICS, "--label_file",
                        str(label_file), "--class_num", "10"])
    with pytest.raises(error, match=message):
        recipe.label_classes(cfg)
