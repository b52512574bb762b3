"""Out-of-distribution scores (``src/utils/ood.py``, docs/ood.md): the three scores against
PyTorch (pytorch-ood's detectors need torchvision, which does not work here; in its 0.4.0
source MaxSoftmax, EnergyBased and MaxLogit are the negations of ``softmax().max()``,
``torch.logsumexp`` and ``max()``, re-derived below), AUROC / AUPR against scikit-learn, FPR at
95% TPR against the ROC curve; the threshold tuned on in-distribution images, kept in
thresholds.json for the weights it was chosen on, and predict.py's ``unknown`` on a checkpoint
and its ONNX export.
"""
import json
import logging
import os
import shutil

import mindspore as ms
import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score

from src.data.settings import EvalPreprocess
from src.deploy.inference import load_network, preprocess_images
from src.deploy.records import THRESHOLDS_FILE, tuned_values, write_tuned_values
from src.recipe import resolve_model
from src.utils.checkpoint import RECORD_KEY
from src.utils.config import load_schema, parse_config
from src.utils.model_record import ModelRecord, RecordError, from_dict
from src.utils.ood import OOD_SCORES, all_scores, separation, threshold_for_tpr
from tests.helpers import CIFAR_SAMPLE, IMAGENET_SMALL, run_in_process, succeeded
from tests.test_model_record import MULTICLASS_RECORD, MULTILABEL_RECORD, saved

TEST = os.path.join(CIFAR_SAMPLE, "test")
NAMES = MULTICLASS_RECORD.class_names


def roc_points(inside, outside):
    """(TPR, FPR) at every threshold of either side, by counting (in-distribution positive)."""
    thresholds = np.unique(np.r_[inside, outside])
    return (np.array([(inside >= t).mean() for t in thresholds]),
            np.array([(outside >= t).mean() for t in thresholds]))


def score_sets(seed, tied):
    """In-distribution scores shifted above unknown ones, sizes not multiples of 20 (95% of
    them is not a whole number); ``tied``: rounded to one decimal (many ties across sides)."""
    rng = np.random.default_rng(seed)
    inside, outside = rng.normal(1.0, 1.0, 97), rng.normal(0.0, 1.0, 61)
    return (np.round(inside, 1), np.round(outside, 1)) if tied else (inside, outside)


@pytest.mark.parametrize("tied", [False, True])
def test_auroc_and_aupr_are_scikit_learns_and_fpr_is_read_off_the_roc_curve(tied):
    for seed in range(3):
        inside, outside = score_sets(seed, tied)
        labels = np.r_[np.ones(len(inside)), np.zeros(len(outside))]
        both = np.r_[inside, outside]
        got = separation(inside, outside)
        assert got["auroc"] == pytest.approx(roc_auc_score(labels, both), abs=1e-12)
        assert got["aupr"] == pytest.approx(average_precision_score(labels, both), abs=1e-12)
        tpr, fpr = roc_points(inside, outside)
        assert got["fpr_at_95_tpr"] == fpr[tpr >= 0.95].min()
    with pytest.raises(ValueError, match="0 out-of-distribution"):
        separation(inside, outside[:0])


def test_the_three_scores_are_torchs_and_do_not_overflow():
    logits = np.random.default_rng(0).normal(0, 4, (16, 10)).astype(np.float32)
    logits[0] = [1000.0] + [0.0] * 9  # exp would overflow float32 and float64
    logits[1] = -1000.0
    x = torch.from_numpy(logits).double()
    expected = torch.stack([torch.softmax(x, 1).max(1).values, torch.logsumexp(x, 1),
                            x.max(1).values], 1).numpy()
    got = all_scores(logits)
    assert OOD_SCORES == ("msp", "energy", "max_logit") and got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0)
    assert got[1].tolist() == pytest.approx([0.1, -1000 + np.log(10), -1000.0], rel=1e-12)


@pytest.mark.parametrize("tpr", [0.95, 0.9, 0.5, 0.01])
def test_the_threshold_keeps_the_target_share_and_no_higher_one_does(tpr):
    for seed, tied in ((0, False), (1, True)):
        scores = score_sets(seed, tied)[0]
        t = threshold_for_tpr(scores, tpr)
        assert t in scores and (scores >= t).mean() >= tpr
        assert (scores > t).mean() < tpr  # the next higher threshold keeps too few
    with pytest.raises(ValueError, match=r"tpr must be in \(0, 1\), got 1"):
        threshold_for_tpr(scores, 1.0)


# ---- the record and thresholds.json ----

def test_thresholds_json_keeps_each_weights_ood_threshold(tmp_path, caplog):
    ckpt = str(tmp_path / "a.ckpt")
    record = ModelRecord(class_num=10, class_names=NAMES, task="multiclass")
    write_tuned_values(ckpt, NAMES, {"ood_score": "msp", "ood_threshold": 0.3}, "a" * 64,
                       task="multiclass")
    write_tuned_values(str(tmp_path / "b.ckpt"), NAMES,
                       {"ood_score": "energy", "ood_threshold": 4.5}, "b" * 64,
                       task="multiclass")
    write_tuned_values(ckpt, NAMES, {"ood_score": "max_logit", "ood_threshold": 2.0}, "a" * 64,
                       task="multiclass")  # tuned again: replaces a's entry
    with open(tmp_path / THRESHOLDS_FILE, encoding="utf-8") as f:
        assert len(json.load(f)["tuned"]) == 2
    on_a = tuned_values(ckpt, record, lambda r: "a" * 64)
    assert (on_a.ood_score, on_a.ood_threshold, on_a.thresholds_weights) == (
        "max_logit", 2.0, "a" * 64)
    assert tuned_values(ckpt, record, lambda r: "b" * 64).ood_threshold == 4.5
    with caplog.at_level(logging.WARNING):
        other = tuned_values(ckpt, record, lambda r: "c" * 64)
    assert other.ood_threshold is None and "tuned on other weights (b.ckpt, a.ckpt)" in \
        caplog.text and "no out-of-distribution threshold" in caplog.text
    with pytest.raises(RecordError, match="holds values for a multiclass model .* not a "
                                          "multilabel one"):
        write_tuned_values(ckpt, NAMES, {"thresholds": [0.5] * 10}, "a" * 64, task="multilabel")
    with pytest.raises(RecordError, match="tuned for a multiclass model .* records a "
                                          "multilabel model"):
        tuned_values(ckpt, record.with_values(task="multilabel"), lambda r: "a" * 64)


def test_a_record_with_a_malformed_ood_pair_is_named():
    with pytest.raises(RecordError, match="m.onnx: field ood_score is 'entropy'; expected one "
                                          "of msp, energy, max_logit"):
        from_dict({"ood_score": "entropy", "ood_threshold": 0.5}, "m.onnx")
    with pytest.raises(RecordError, match="m.onnx: records ood_score None and ood_threshold "
                                          "0.5; expected both or neither"):
        from_dict({"ood_threshold": 0.5}, "m.onnx")
    with pytest.raises(RecordError, match="field ood_score is 'msp'; expected none in a "
                                          "multilabel record"):
        from_dict({"task": "multilabel", "ood_score": "msp", "ood_threshold": 0.5}, "m.onnx")
    record = MULTICLASS_RECORD.with_values(ood_score="energy", ood_threshold=-1.5)
    assert from_dict(json.loads(record.to_json())) == record
    assert load_schema()[2]["ood_score"] == list(OOD_SCORES)


# ---- bad input: one line naming it, exit 2, before any evaluation ----

def record_only(path, record):
    """A checkpoint holding one tensor and ``record`` (enough for the checks before eval)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ms.save_checkpoint([{"name": "w", "data": ms.Tensor(np.zeros(1, np.float32))}], path,
                       append_dict={RECORD_KEY: record.to_json()})
    return path


def test_bad_ood_input_is_named_with_exit_status_2(tmp_path):
    multiclass = record_only(str(tmp_path / "mc" / "m.ckpt"), MULTICLASS_RECORD)
    multilabel = record_only(str(tmp_path / "ml" / "m.ckpt"), MULTILABEL_RECORD.with_values(
        class_num=10, class_names=NAMES))  # the mosaics' classes
    empty = tmp_path / "empty"
    os.makedirs(empty / "sub")
    (empty / "notes.txt").write_text("no image", encoding="utf-8")
    mosaics = os.path.join("data", "cifar10_mosaics")
    cases = {
        f"ood_data_path {empty}: no images to score as unknown": [
            "--checkpoint_path", multiclass, "--data_path", TEST, "--ood_data_path", empty],
        f"ood_data_path {tmp_path / 'none'} is not a folder": [
            "--checkpoint_path", multiclass, "--data_path", TEST, "--ood_data_path",
            tmp_path / "none"],
        f"ood_data_path {IMAGENET_SMALL}: out-of-distribution scores are single-label here": [
            "--checkpoint_path", multilabel, "--data_path", mosaics, "--label_file",
            os.path.join(mosaics, "val.csv"), "--ood_data_path", IMAGENET_SMALL],
        "ood_tpr must be in (0, 1), got 1.0": ["--checkpoint_path", multiclass, "--data_path",
                                               TEST, "--tune_ood", "true", "--ood_tpr", "1.0"],
        "ood_tpr 0.9 is only read with tune_ood true (tune_ood is False): use tune_ood true, "
        "or leave ood_tpr at its default 0.95": [
            "--checkpoint_path", multiclass, "--data_path", TEST, "--ood_tpr", "0.9"],
        f"tune_ood writes thresholds.json beside a .ckpt checkpoint; {tmp_path}/m.onnx is not":
            ["--checkpoint_path", tmp_path / "m.onnx", "--class_num", 10, "--data_path", TEST,
             "--tune_ood", "true"],
    }
    for message, args in cases.items():
        result = run_in_process("eval.py", *args, "--output_dir", tmp_path / "out")
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert message in result.stderr, (message, result.stderr)
    assert not (tmp_path / "out").exists()
    # given at their defaults, they are not "set": the checks pass on to the evaluation
    result = run_in_process("eval.py", "--checkpoint_path", multiclass, "--data_path", TEST,
                            "--ood_tpr", "0.95", "--ood_score", "msp", "--output_dir",
                            tmp_path / "out")
    assert "only read with" not in result.stderr and "missing in checkpoint" in result.stderr


# ---- end to end: tuned by eval.py, applied by predict.py on the checkpoint and its export ----

@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """Checkpoints a and b (other weights) of one folder; a's MSP threshold tuned by eval.py on
    40 shipped CIFAR-10 test images (4 per class) with the 26 shipped ImageNet images as the
    unknown ones; a exported to ONNX."""
    root = tmp_path_factory.mktemp("ood")
    images = root / "images"
    for name in NAMES:
        os.makedirs(images / name)
        for file in sorted(os.listdir(os.path.join(TEST, name)))[:4]:
            shutil.copy(os.path.join(TEST, name, file), images / name / file)
    a = saved(str(root / "run" / "a.ckpt"), MULTICLASS_RECORD, seed=1)
    b = saved(str(root / "run" / "b.ckpt"), MULTICLASS_RECORD, seed=2)
    result = succeeded(run_in_process("eval.py", "--checkpoint_path", a, "--data_path", images,
                                      "--batch_size", 2, "--tune_ood", "true",
                                      "--ood_data_path", IMAGENET_SMALL,
                                      "--output_dir", root / "out"))
    succeeded(run_in_process("export.py", "--checkpoint_path", a, "--file_format", "ONNX",
                             "--dynamic_batch", "true", "--file_name", root / "a"))
    preprocess = EvalPreprocess(image_size=32, resize=32)
    net = load_network("resnet18", 10, a)
    paths = {side: sorted(os.path.join(d, f) for d, _, files in os.walk(folder) for f in files)
             for side, folder in (("inside", images), ("outside", IMAGENET_SMALL))}
    msp = {side: torch.softmax(torch.from_numpy(net(ms.Tensor(preprocess_images(
        p, preprocess))).asnumpy()).double(), 1).max(1).values.numpy()
        for side, p in paths.items()}
    return {"root": root, "a": a, "b": b, "onnx": str(root / "a.onnx"), "msp": msp,
            "paths": paths, "stdout": result.stdout}


@pytest.mark.slow
def test_eval_tunes_a_threshold_keeping_95_percent_and_reports_the_scores(tuned):
    with open(tuned["root"] / "out" / "eval_result.json", encoding="utf-8") as f:
        ood = json.load(f)["ood"]
    inside = np.sort(tuned["msp"]["inside"])[::-1]
    assert len(inside) == 40 and ood["in_distribution_images"] == 40 and ood["images"] == 26
    expected = inside[37]  # the 38th highest of 40: ceil(0.95 * 40) = 38 kept
    assert ood["threshold"]["score"] == "msp"
    assert ood["threshold"]["value"] == pytest.approx(expected, rel=1e-5)
    assert ood["threshold"]["tpr"] == 0.95
    assert set(ood["scores"]) == set(OOD_SCORES) and ood["histogram"] == "ood_histogram.png"
    assert os.path.getsize(tuned["root"] / "out" / "ood_histogram.png") > 0
    page = (tuned["root"] / "out" / "report.html").read_text(encoding="utf-8")
    assert 'id="out-of-distribution"' in page and 'id="ood-histogram"' in page
    assert "out-of-distribution: 26 unknown images against 40" in tuned["stdout"]


@pytest.mark.slow
def test_predict_marks_unknown_below_the_threshold_on_the_checkpoint_and_its_export(
        tuned, caplog):
    with open(tuned["root"] / "out" / "eval_result.json", encoding="utf-8") as f:
        threshold = json.load(f)["ood"]["threshold"]["value"]
    msp = dict(zip(tuned["paths"]["outside"], tuned["msp"]["outside"]))
    for source in (tuned["a"], tuned["onnx"]):
        result = succeeded(run_in_process("predict.py", "--checkpoint_path", source,
                                          "--image_path", IMAGENET_SMALL, "--batch_size", 13))
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        assert len(lines) == 26
        for line in lines:
            value = msp[line["image"]]
            assert line["ood"]["score"] == "msp" and line["ood"]["threshold"] == threshold
            assert line["ood"]["value"] == pytest.approx(value, abs=1e-5)
            if abs(value - threshold) > 1e-5:  # clear of float32 differences
                assert line["unknown"] == bool(value < threshold), (source, line)
        assert {line["unknown"] for line in lines} == {True, False}  # both kinds seen
    result = succeeded(run_in_process("predict.py", "--checkpoint_path", tuned["b"],
                                      "--image_path", tuned["paths"]["outside"][0]))
    assert "unknown" not in result.stdout and "ood" not in json.loads(result.stdout)
    with caplog.at_level(logging.WARNING):  # b: same folder, other weights: not its threshold
        other = resolve_model(parse_config(["--checkpoint_path", tuned["b"]]))
    assert other.ood_threshold is None and "b.ckpt has other weights" in caplog.text
