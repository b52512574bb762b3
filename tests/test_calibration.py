"""Calibration (docs/calibration.md): the measures (ECE over equal-width and equal-mass bins,
the reliability bins, NLL, Brier) against torch and scikit-learn re-derivations, the fitted
temperature against torch's LBFGS, ``thresholds.json`` keeping a temperature for the weights
it was fitted on, the refusals of eval.py, and end to end: a trained ResNet-18 calibrated by
eval.py, its temperature applied by predict on the checkpoint and on its ONNX export.
(netcal, the usual reference, pulls numpy 2 and another torch: it cannot be installed beside
MindSpore 2.10, so the references are written here in torch.)
"""
import glob
import json
import logging
import math
import os
import shutil

import mindspore as ms
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import brier_score_loss, log_loss

from src.data.class_names import CIFAR10_CLASSES
from src.deploy.records import THRESHOLDS_FILE, tuned_values, write_tuned_values
from src.utils.calibration import (
    CalibrationError,
    brier_score,
    calibration_scores,
    expected_calibration_error,
    fit_temperature,
    nll,
    reliability_bins,
)
from src.utils.checkpoint import RECORD_KEY
from src.utils.model_record import ModelRecord, RecordError
from tests.helpers import CIFAR_SAMPLE, run_in_process, succeeded

BINS = 15
TEST = os.path.join(CIFAR_SAMPLE, "test")
RECORD = ModelRecord(net_name="resnet18", class_num=10, class_names=tuple(CIFAR10_CLASSES),
                     task="multiclass", tta="none",
                     preprocess={"image_size": 32, "resize": 32, "interpolation": "bilinear"})


def overconfident(seed=0, images=600, classes=10, scale=3.0):
    """Logits (images, classes) three times those whose softmax the labels were drawn from:
    overconfident by a temperature near ``scale``."""
    rng = np.random.default_rng(seed)
    true = rng.standard_normal((images, classes)) * 1.5
    probs = np.exp(true - true.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    labels = np.array([rng.choice(classes, p=p) for p in probs])
    return true * scale, labels


# ---- torch re-derivations of the measures ----

def torch_bins(confidence, correct, equal_mass):
    """(images, mean confidence, accuracy) per bin: equal width ((m-1)/M, m/M] by
    ``torch.bucketize``, equal mass by a stable sort cut with ``torch.tensor_split``."""
    confidence = torch.as_tensor(confidence, dtype=torch.float64)
    correct = torch.as_tensor(correct, dtype=torch.float64)
    if equal_mass:
        groups = torch.tensor_split(torch.sort(confidence, stable=True).indices, BINS)
    else:
        upper = torch.arange(1, BINS + 1, dtype=torch.float64) / BINS
        index = torch.bucketize(confidence, upper, right=False)  # upper[i-1] < x <= upper[i]
        groups = [torch.nonzero(index == m).flatten() for m in range(BINS)]
    return [(len(g), confidence[g].mean().item() if len(g) else None,
             correct[g].mean().item() if len(g) else None) for g in groups if len(g)
            or not equal_mass]


def torch_ece(confidence, correct, equal_mass):
    n = len(confidence)
    return sum(count / n * abs(acc - conf)
               for count, conf, acc in torch_bins(confidence, correct, equal_mass) if count)


def confidences(seed=1):
    """Top-1 confidences with values on every bin edge (k / 15, 0 and 1) and correctness."""
    rng = np.random.default_rng(seed)
    values = np.concatenate([rng.uniform(0.1, 1.0, 400), np.arange(BINS + 1) / BINS,
                             np.arange(1, BINS + 1) / BINS])
    return values, rng.uniform(size=len(values)) < values


@pytest.mark.parametrize("equal_mass", [False, True])
def test_ece_and_reliability_bins_equal_the_torch_binning(equal_mass):
    conf, correct = confidences()
    bins = reliability_bins(conf, correct, BINS, equal_mass=equal_mass)
    ours = [(b["images"], b["confidence"], b["accuracy"]) for b in bins]
    reference = torch_bins(conf, correct, equal_mass)
    assert [o[0] for o in ours] == [r[0] for r in reference]  # the edge values' bins too
    for (_, c, a), (_, rc, ra) in zip(ours, reference):
        assert (c is None) == (rc is None)
        if c is not None:
            assert c == pytest.approx(rc, rel=1e-12) and a == pytest.approx(ra, rel=1e-12)
    assert expected_calibration_error(conf, correct, BINS, equal_mass=equal_mass) == \
        pytest.approx(torch_ece(conf, correct, equal_mass), rel=1e-12, abs=1e-15)
    if not equal_mass:  # the bin of a confidence on an edge: the one it closes
        assert [b["images"] for b in reliability_bins([1 / 15, 2 / 15, 0.0], [1, 1, 1], BINS)][
            :3] == [2, 1, 0]


def test_nll_and_brier_equal_scikit_learn_and_torch():
    logits, labels = overconfident(images=200)
    for temperature in (1.0, 2.5):
        probs = torch.softmax(torch.from_numpy(logits) / temperature, 1).numpy()
        expected = log_loss(labels, probs, labels=list(range(10)))
        assert nll(logits, labels, temperature) == pytest.approx(expected, rel=1e-9)
        torch_nll = F.cross_entropy(torch.from_numpy(logits) / temperature,
                                    torch.from_numpy(labels)).item()
        assert nll(logits, labels, temperature) == pytest.approx(torch_nll, rel=1e-12)
        by_hand = np.mean(np.sum((probs - np.eye(10)[labels]) ** 2, axis=1))
        assert brier_score(probs, labels) == pytest.approx(by_hand, rel=1e-12)
        assert brier_score(probs, labels) == pytest.approx(
            brier_score_loss(labels, probs, labels=list(range(10))), rel=1e-9)


def torch_temperature(logits, labels):
    """T minimizing the NLL of softmax(logits / T): Newton's method on log T in float64, its
    first and second derivatives by torch autograd (torch.optim's first use costs seconds of
    imports; one dimension needs no LBFGS). One thread: torch's pool beside MindSpore's makes
    these tiny steps slow."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return newton_temperature(torch.from_numpy(logits), torch.from_numpy(labels))
    finally:
        torch.set_num_threads(threads)


def newton_temperature(logits, labels):
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    for _ in range(100):
        loss = F.cross_entropy(logits / log_t.exp(), labels)
        (grad,) = torch.autograd.grad(loss, log_t, create_graph=True)
        (hessian,) = torch.autograd.grad(grad, log_t)
        step = (grad / hessian if hessian > 0 else grad.sign() * 0.5).detach()  # convex in 1/T
        with torch.no_grad():
            log_t -= step
        if abs(step) < 1e-12:
            break
    return log_t.exp().item()


@pytest.mark.parametrize("scale", [0.5, 3.0])
def test_the_fitted_temperature_equals_torch_newton(scale):
    logits, labels = overconfident(scale=scale)
    temperature, at_end = fit_temperature(logits, labels)
    assert temperature == pytest.approx(torch_temperature(logits, labels), rel=1e-5)
    assert not at_end and abs(math.log(temperature / scale)) < 0.25  # drawn at T = scale
    scores = calibration_scores(logits, labels, temperature)
    before = calibration_scores(logits, labels)
    assert scores["ece"] < before["ece"] / 2 and scores["top1"] == before["top1"]


def test_too_few_images_to_fit_are_named():
    logits, labels = overconfident(images=9)
    with pytest.raises(CalibrationError, match=r"9 images cannot fit a temperature for 10 "
                                               r"classes: give at least 10 \(one per class\)"):
        fit_temperature(logits, labels)


# ---- thresholds.json: a temperature belongs to the weights it was fitted on ----

def write_tuned(checkpoint, temperature, digest):
    """A temperature recorded for the weights ``digest`` in thresholds.json beside
    ``checkpoint`` (a 10-class single-label model)."""
    return write_tuned_values(checkpoint, CIFAR10_CLASSES, {"temperature": temperature},
                              digest, task="multiclass")


def test_tuned_file_keeps_each_weights_temperature_and_refuses_bad_ones(tmp_path, caplog):
    ckpt = str(tmp_path / "a.ckpt")
    path = write_tuned(ckpt, 1.75, "a" * 64)
    write_tuned(str(tmp_path / "b.ckpt"), 2.5, "b" * 64)
    assert os.path.basename(path) == THRESHOLDS_FILE
    assert tuned_values(ckpt, RECORD, lambda r: "a" * 64).temperature == 1.75
    assert tuned_values(ckpt, RECORD, lambda r: "b" * 64).temperature == 2.5
    with caplog.at_level(logging.WARNING):
        other = tuned_values(ckpt, RECORD, lambda r: "c" * 64)
    assert other.temperature is None
    assert "holds values tuned on other weights (a.ckpt, b.ckpt)" in caplog.text
    assert "no temperature (T = 1)" in caplog.text
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(RecordError, match="field temperature is"):
            write_tuned(ckpt, bad, "d" * 64)
    with open(path, encoding="utf-8") as f:
        content = json.load(f)
    for bad, expected in ((-2.0, "a number above 0"), (float("nan"), "a finite number"),
                          ("warm", "a finite number")):
        content["tuned"][0]["temperature"] = bad
        with open(path, "w", encoding="utf-8") as f:
            json.dump(content, f)
        with pytest.raises(RecordError, match=rf"a.ckpt \(.*{THRESHOLDS_FILE}\): field "
                                              rf"temperature is .*; expected {expected}"):
            tuned_values(ckpt, RECORD, lambda r: "a" * 64)


def record_only(path, record_json):
    """A checkpoint of one tensor and the record ``record_json``: enough for the checks made
    before any weights are loaded (a network's random init costs seconds)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ms.save_checkpoint([{"name": "fc.bias", "data": ms.Tensor(np.zeros(10, np.float32))}], path,
                       append_dict={RECORD_KEY: record_json})
    return path


def test_a_record_with_a_bad_temperature_is_refused_by_name(tmp_path):
    record = RECORD.to_dict()
    record["temperature"] = float("nan")
    ckpt = record_only(str(tmp_path / "nan.ckpt"), json.dumps(record))
    result = run_in_process("predict.py", "--checkpoint_path", ckpt, "--image_path",
                            os.path.join(TEST, "cat"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "nan.ckpt: field temperature is nan; expected a finite number" in result.stderr


def test_eval_refuses_to_calibrate_a_multilabel_model_or_too_few_images(tmp_path):
    multilabel = RECORD.with_values(task="multilabel")
    ckpt = record_only(str(tmp_path / "ml" / "ml.ckpt"), multilabel.to_json())
    mosaics = os.path.join(os.path.dirname(CIFAR_SAMPLE), "cifar10_mosaics")
    result = run_in_process("eval.py", "--checkpoint_path", ckpt, "--data_path", mosaics,
                            "--label_file", os.path.join(mosaics, "val.csv"), "--calibrate",
                            "temperature", "--output_dir", tmp_path / "out")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "is a multilabel model (a sigmoid per class); temperature scaling is for " \
           "single-label (softmax) models here" in result.stderr
    split = tmp_path / "split.txt"  # 7 images of 10 classes
    split.write_text("".join(f"{c}/{sorted(os.listdir(os.path.join(TEST, c)))[0]}\n"
                             for c in CIFAR10_CLASSES[:7]), encoding="utf-8")
    mc = record_only(str(tmp_path / "mc" / "mc.ckpt"), RECORD.to_json())
    result = run_in_process("eval.py", "--checkpoint_path", mc, "--data_path", TEST,
                            "--split_file", split, "--calibrate", "temperature",
                            "--output_dir", tmp_path / "out")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "7 images cannot fit a temperature for 10 classes: give at least 10" in result.stderr
    assert not os.path.exists(tmp_path / "mc" / THRESHOLDS_FILE)
    assert not os.path.exists(tmp_path / "out")  # refused before anything was written


# ---- end to end: a trained ResNet-18 calibrated by eval.py, applied by every runtime ----

def predicted(result):
    """predict.py's lines as an (images, 10) array of probabilities, class order."""
    rows = []
    for line in result.stdout.splitlines():
        probs = np.zeros(10)
        for entry in json.loads(line)["top"]:
            probs[entry["class"]] = entry["probability"]
        rows.append(probs)
    return np.array(rows)


@pytest.mark.slow
def test_eval_calibrates_a_checkpoint_and_predict_applies_it_also_from_its_onnx(
        quick_start, tmp_path, caplog):
    """The quick start's ResNet-18 calibrated on the 200 shipped test images: the temperature
    is torch's fit on the network's logits, the measures before and after are the torch
    binning's, predict on the checkpoint and on its ONNX export gives softmax(logits / T), as
    do the ONNX's eval and its misclassified images, a checkpoint of the folder with other
    weights stays at T = 1, an ONNX is not calibrated."""
    from src.data.settings import EvalPreprocess
    from src.deploy.inference import load_network, preprocess_images
    from src.deploy.records import read_model_record
    from src.recipe import resolve_model
    from src.utils.config import parse_config

    run = tmp_path / "run"
    run.mkdir()
    a, b = str(run / "a.ckpt"), str(run / "b.ckpt")
    shutil.copy(quick_start["ckpt"], a)
    shutil.copy(glob.glob(os.path.join(quick_start["out"], "resnet18-4_*.ckpt"))[0], b)
    out = tmp_path / "eval"
    succeeded(run_in_process("eval.py", "--checkpoint_path", a, "--data_path", TEST,
                             "--calibrate", "temperature", "--batch_size", "50",
                             "--cam_images", "0", "--output_dir", out))
    with open(out / "eval_result.json", encoding="utf-8") as f:
        calibration = json.load(f)["calibration"]
    classes = sorted(os.listdir(TEST))
    paths = [os.path.join(TEST, c, n) for c in classes for n in sorted(os.listdir(
        os.path.join(TEST, c)))]
    labels = np.repeat(np.arange(10), [len(os.listdir(os.path.join(TEST, c))) for c in classes])
    net = load_network("resnet18", 10, a)
    logits = net(ms.Tensor(preprocess_images(paths, EvalPreprocess(image_size=32, resize=32)))
                 ).asnumpy().astype(np.float64)
    temperature = calibration["temperature"]
    assert temperature == pytest.approx(torch_temperature(logits, labels), rel=1e-5)
    for side, t in (("before", 1.0), ("after", temperature)):
        probs = torch.softmax(torch.from_numpy(logits) / t, 1)
        conf, top = probs.max(1)
        correct = (top == torch.from_numpy(labels)).numpy()
        assert calibration[side]["ece"] == pytest.approx(torch_ece(conf, correct, False),
                                                         rel=1e-6)
        assert calibration[side]["adaptive_ece"] == pytest.approx(
            torch_ece(conf, correct, True), rel=1e-6)
        assert calibration[side]["nll"] == pytest.approx(
            log_loss(labels, probs.numpy(), labels=list(range(10))), rel=1e-6)
        assert calibration[side]["top1"] == correct.mean()
    assert calibration["after"]["nll"] < calibration["before"]["nll"]
    with open(out / "reliability_diagram.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    page = (out / "report.html").read_text(encoding="utf-8")
    assert 'id="calibration"' in page and 'id="reliability-diagram"' in page

    assert resolve_model(parse_config(["--checkpoint_path", a])).temperature == temperature
    with caplog.at_level(logging.WARNING):
        assert resolve_model(parse_config(["--checkpoint_path", b])).temperature is None
    assert "thresholds.json holds values tuned on other weights (a.ckpt)" in caplog.text
    cats = [i for i, path in enumerate(paths) if os.path.dirname(path).endswith("cat")]
    expected = torch.softmax(torch.from_numpy(logits[cats]) / temperature, 1).numpy()
    on_ckpt = predicted(succeeded(run_in_process(
        "predict.py", "--checkpoint_path", a, "--image_path", os.path.join(TEST, "cat"),
        "--top_k", "10", "--batch_size", "20")))
    np.testing.assert_allclose(on_ckpt, expected, rtol=0, atol=2e-6)

    onnx = str(tmp_path / "a")
    succeeded(run_in_process("export.py", "--checkpoint_path", a, "--file_format", "ONNX",
                             "--file_name", onnx, "--dynamic_batch", "true"))
    assert read_model_record(onnx + ".onnx").temperature == temperature
    on_onnx = predicted(succeeded(run_in_process(
        "predict.py", "--checkpoint_path", onnx + ".onnx", "--image_path",
        os.path.join(TEST, "cat"), "--top_k", "10", "--batch_size", "20")))
    np.testing.assert_allclose(on_onnx, expected, rtol=0, atol=1e-5)  # BatchNorms folded
    split = tmp_path / "cats.txt"  # eval of the ONNX: its recorded T, in the mistakes too
    split.write_text("".join(f"cat/{os.path.basename(paths[i])}\n" for i in cats),
                     encoding="utf-8")
    succeeded(run_in_process("eval.py", "--checkpoint_path", onnx + ".onnx", "--data_path", TEST,
                             "--split_file", split, "--batch_size", "20", "--cam_images", "0",
                             "--output_dir", tmp_path / "eval_onnx"))
    with open(tmp_path / "eval_onnx" / "eval_result.json", encoding="utf-8") as f:
        on_cats = json.load(f)
    assert on_cats["calibration"]["temperature"] == temperature
    assert not on_cats["calibration"]["fitted_here"] and on_cats["misclassified"]
    names = [os.path.basename(paths[i]) for i in cats]
    for entry in on_cats["misclassified"]:
        row = expected[names.index(os.path.basename(entry["image"]))]
        assert entry["probability"] == pytest.approx(row.max(), abs=1e-5)
    refused = run_in_process("eval.py", "--checkpoint_path", onnx + ".onnx", "--data_path",
                             TEST, "--calibrate", "temperature", "--output_dir", out)
    assert refused.returncode == 2, refused.stderr
    assert "calibrate temperature writes thresholds.json beside a .ckpt checkpoint; " \
           f"{onnx}.onnx is not one (calibrate the checkpoint, then export it" in refused.stderr
