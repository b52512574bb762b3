"""End to end on the shipped multi-label mosaics (data/cifar10_mosaics): a short training run
learns (its mAP above the label-frequency baseline and above every mAP of its own scores shuffled
over the images), eval.py reports the run's own evaluation, thresholds tuned by eval.py reach
predict.py."""
import csv
import json
import os

import numpy as np
import pytest

from src.data.settings import EvalPreprocess
from src.deploy.inference import load_network, preprocess_images
from src.utils.multilabel_metrics import mean_average_precision, sigmoid
from tests.helpers import ROOT, run_entry, run_in_process, succeeded

# every test here trains or runs an entry point on the trained checkpoint: the slow tier
pytestmark = pytest.mark.slow

MOSAICS = os.path.join(ROOT, "data", "cifar10_mosaics")
RECIPE = ["--config_path", "configs/multilabel_quick_start.yaml", "--num_parallel_workers", "2"]
PERMUTATIONS = 199  # the trained mAP above all: p < 1/200 that scores and labels are unrelated


def read_targets(name, classes):
    """(image files, float32 multi-hot targets) of a shipped label file, in row order."""
    with open(os.path.join(MOSAICS, name), encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))[1:]
    targets = np.zeros((len(rows), len(classes)), np.float32)
    for i, (_, tags) in enumerate(rows):
        for tag in tags.split():
            targets[i, classes.index(tag)] = 1
    return [file for file, _ in rows], targets


@pytest.fixture(scope="module")
def ml_run(tmp_path_factory):
    """train.py of configs/multilabel_quick_start.yaml cut to 2 epochs (evaluated after the
    second) in a fresh interpreter; its folder, records, class names and best checkpoint."""
    out = str(tmp_path_factory.mktemp("multilabel_run"))
    succeeded(run_entry("train.py", *RECIPE, "--epoch_size", "2", "--output_dir", out,
                        timeout=900))
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    with open(os.path.join(out, "class_names.txt"), encoding="utf-8") as f:
        classes = f.read().split()
    return {"out": out, "records": records, "classes": classes,
            "ckpt": os.path.join(out, "resnet18-best.ckpt")}


@pytest.fixture(scope="module")
def val_scores(ml_run):
    """The best checkpoint's sigmoid scores of the 150 val mosaics, computed here (network in
    graph mode, eval preprocessing at 64 px), and their targets."""
    net = load_network("resnet18", 10, ml_run["ckpt"])
    files, targets = read_targets("val.csv", ml_run["classes"])
    images = preprocess_images([os.path.join(MOSAICS, f) for f in files],
                               EvalPreprocess(image_size=64, resize=64))
    import mindspore as ms
    logits = np.concatenate([net(ms.Tensor(images[i:i + 50])).asnumpy()
                             for i in range(0, len(images), 50)])
    return sigmoid(logits), targets


def test_the_run_learns_beyond_chance_and_label_frequencies(ml_run, val_scores):
    """The run's mAP on the val mosaics beats (a) the label-frequency baseline: every image
    scored by the class's training frequency, whose AP per class is the class's val prevalence,
    and (b) every one of 199 mAPs of the same scores given to randomly permuted images: if the
    scores knew nothing of the images, the trained mAP would be the largest of the 200 with
    probability 1/200."""
    scores, targets = val_scores
    trained = mean_average_precision(scores, targets)
    _, train_targets = read_targets("train.csv", ml_run["classes"])
    frequencies = np.broadcast_to(train_targets.mean(axis=0), targets.shape)
    baseline = mean_average_precision(frequencies, targets)
    rng = np.random.default_rng(0)
    null = [mean_average_precision(scores[rng.permutation(len(scores))], targets)
            for _ in range(PERMUTATIONS)]
    print(f"\n[multilabel, 2 epochs] val mAP {trained:.4f}; label-frequency baseline "
          f"{baseline:.4f}; shuffled scores at most {max(null):.4f}")
    assert baseline == pytest.approx(targets.mean(axis=0).mean())  # AP = prevalence
    assert trained > max(null) and trained > baseline, (trained, max(null), baseline)


def test_the_run_evaluates_on_map_and_keeps_the_best(ml_run, val_scores):
    """The epoch record carries mAP (not top-1), best_mAP and the 150 val images; the best
    checkpoint's scores computed here give the recorded mAP."""
    last = ml_run["records"][-1]
    assert "top1" not in last and last["eval_images"] == 150
    assert last["best_mAP"] == max(r["mAP"] for r in ml_run["records"] if "mAP" in r)
    assert mean_average_precision(*val_scores) == pytest.approx(last["best_mAP"], abs=1e-6)


def test_eval_reports_the_runs_map_and_tuned_thresholds_reach_predict(ml_run, tmp_path):
    """eval.py (the task read from the checkpoint) gives the run's own mAP; with
    tune_thresholds it writes thresholds.json beside the checkpoint, and predict.py then
    labels an image with exactly the classes at or above those thresholds."""
    result = succeeded(run_in_process(
        "eval.py", *RECIPE, "--checkpoint_path", ml_run["ckpt"], "--label_file",
        os.path.join(MOSAICS, "val.csv"), "--tune_thresholds", "true",
        "--output_dir", str(tmp_path)))
    with open(tmp_path / "eval_result.json", encoding="utf-8") as f:
        evaluated = json.load(f)
    assert evaluated["task"] == "multilabel" and evaluated["images"] == 150
    assert evaluated["mAP"] == pytest.approx(ml_run["records"][-1]["best_mAP"], abs=1e-6)
    for name in ("per_class.csv", "per_class.md", "pr_curves.png", "report.html"):
        assert (tmp_path / name).is_file(), result.stdout
    with open(os.path.join(ml_run["out"], "thresholds.json"), encoding="utf-8") as f:
        (entry,) = json.load(f)["tuned"]  # one entry: the weights of the best checkpoint
    assert entry["checkpoint"] == "resnet18-best.ckpt"
    tuned = np.array(entry["thresholds"], np.float32)
    assert [c["threshold"] for c in evaluated["per_class"]] == pytest.approx(tuned.tolist())
    image = os.path.join(MOSAICS, "val", "0001.jpg")
    predicted = succeeded(run_in_process("predict.py", *RECIPE, "--checkpoint_path",
                                         ml_run["ckpt"], "--image_path", image, "--top_k", "10"))
    line = json.loads(predicted.stdout.strip().splitlines()[-1])
    probabilities = {c["class"]: c["probability"] for c in line["top"]}
    assert len(probabilities) == 10
    expected = [k for k in range(10) if np.float32(probabilities[k]) >= tuned[k]]
    assert sorted(c["class"] for c in line["labels"]) == expected


def test_the_best_checkpoint_alone_predicts_evaluates_and_exports_as_multilabel(ml_run,
                                                                                tmp_path):
    """No --config_path, --task or --class_num: the best checkpoint's record gives its
    network, classes and their names, task and eval preprocessing to predict.py, eval.py and
    export.py (whose ONNX file then evaluates the same, again with nothing else given)."""
    best = ml_run["ckpt"]
    from src.deploy.records import read_model_record
    periodic = [n for n in os.listdir(ml_run["out"]) if n.endswith(".ckpt") and "best" not in n]
    assert periodic and all(read_model_record(os.path.join(ml_run["out"], name))
                            == read_model_record(best) for name in periodic)
    assert read_model_record(best).class_names == tuple(ml_run["classes"])
    image = os.path.join(MOSAICS, "val", "0001.jpg")
    line = json.loads(succeeded(run_in_process(
        "predict.py", "--checkpoint_path", best, "--image_path", image, "--top_k", "10")
    ).stdout.strip().splitlines()[-1])
    assert "labels" in line and [c["name"] for c in line["top"]] != []
    assert {c["name"] for c in line["top"]} == set(ml_run["classes"])
    assert sum(c["probability"] for c in line["top"]) > 1.5  # sigmoids, not a softmax
    evaluated = {}
    for name, source in (("ckpt", best), ("onnx", str(tmp_path / "best.onnx"))):
        if name == "onnx":
            succeeded(run_in_process("export.py", "--checkpoint_path", best, "--file_format",
                                     "ONNX", "--batch_size", "1", "--dynamic_batch", "true",
                                     "--file_name", tmp_path / "best"))
        succeeded(run_in_process("eval.py", "--checkpoint_path", source, "--data_path",
                                 MOSAICS, "--label_file", os.path.join(MOSAICS, "val.csv"),
                                 "--output_dir", tmp_path / name))
        with open(tmp_path / name / "eval_result.json", encoding="utf-8") as f:
            evaluated[name] = json.load(f)
    assert evaluated["ckpt"]["task"] == evaluated["onnx"]["task"] == "multilabel"
    assert evaluated["ckpt"]["mAP"] == pytest.approx(ml_run["records"][-1]["best_mAP"],
                                                     abs=1e-6)
    assert evaluated["onnx"]["mAP"] == pytest.approx(evaluated["ckpt"]["mAP"], abs=1e-4)
    assert evaluated["ckpt"]["loss_name"] == "bce (label_smoothing 0.0)"
    assert evaluated["ckpt"]["loss"] == pytest.approx(ml_run["records"][-1]["eval_loss"],
                                                      rel=1e-4)


# Every fine-tuning key at once on 32 mosaics (24 train after val_split, 32 px, 2 accumulated
# micro-batches of 4: 3 optimizer steps per epoch, 9 in all): LP-FT's switch after epoch 1,
# frozen stages and BatchNorm, layer decay, an EMA chosen on, class_balance loss (pos_weight),
# multi-hot mixup, early stopping's state, mAP evaluated every epoch.
FINE_TUNING = ["--eval_data_path", "", "--eval_label_file", "", "--val_split", "0.25",
               "--train_image_size", "32", "--eval_image_size", "32", "--eval_resize", "32",
               "--batch_size", "4", "--grad_accumulation_steps", "2", "--epoch_size", "3",
               "--eval_interval", "1", "--linear_probe_epochs", "1", "--ema_decay", "0.9",
               "--best_on_ema", "true", "--layer_decay", "0.8", "--trainable_layers", "3",
               "--freeze_bn", "true", "--class_balance", "loss", "--mixup_alpha", "0.2",
               "--early_stopping_patience", "5", "--save_checkpoint_steps", "2",
               "--keep_checkpoint_max", "20"]


def test_fine_tuning_keys_train_multilabel_and_resume_bit_exact(tmp_path):
    """A multi-label run with every fine-tuning key trains, evaluates mAP and its EMA's, and a
    copy of its folder resumed from the step-4 checkpoint (mid-epoch 2, after LP-FT's switch)
    ends bit-identical to it: weights, optimizer state, EMA, best and early-stop state."""
    import shutil

    import mindspore as ms

    from tests.helpers import train_in_process
    with open(os.path.join(MOSAICS, "train.csv"), encoding="utf-8") as f:
        (tmp_path / "train.csv").write_text("".join(f.readlines()[:33]))
    args = [*RECIPE, "--label_file", str(tmp_path / "train.csv"), *FINE_TUNING]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    assert train_in_process(*args, "--output_dir", str(full)) == 0
    records = [json.loads(line) for line in open(full / "metrics.jsonl", encoding="utf-8")]
    assert [r["epoch"] for r in records if "ema_mAP" in r] == [1, 2, 3]
    # its best checkpoint (chosen on the EMA, with early stopping's state) says what it holds
    from src.deploy.records import read_model_record
    record = read_model_record(str(full / "resnet18-best.ckpt"))
    assert (record.task, record.class_num, record.preprocess["image_size"]) == (
        "multilabel", 10, 32)
    assert record.loss["loss"] == "bce" and len(record.loss["pos_weight"]) == 10
    line = json.loads(succeeded(run_in_process(
        "predict.py", "--checkpoint_path", full / "resnet18-best.ckpt", "--image_path",
        os.path.join(MOSAICS, "val", "0001.jpg"))).stdout.strip().splitlines()[-1])
    assert "labels" in line
    shutil.copytree(full, resumed)
    for name in ("resnet18-2_3.ckpt", "resnet18-3_2.ckpt", "resnet18-3_3.ckpt"):
        os.remove(resumed / name)
    assert train_in_process(*args, "--output_dir", str(resumed), "--resume_ckpt", "auto") == 0
    reference = ms.load_checkpoint(str(full / "resnet18-3_3.ckpt"))
    final = ms.load_checkpoint(str(resumed / "resnet18-3_3.ckpt"))
    assert set(final) == set(reference)
    assert any(n.startswith("ema.") for n in reference)
    for name, value in reference.items():
        if name == "run_config":  # the resumed run's says resume_ckpt auto
            continue
        if isinstance(value, str):
            assert final[name] == value, name
        else:
            np.testing.assert_array_equal(final[name].asnumpy(), value.asnumpy(), err_msg=name)
