"""Multi-label models deployed (``src/deploy/outputs.py``): a sigmoid per class on every path
(.ckpt, MindIR, ONNX, int8 ONNX, the SAFETENSORS folder), the task, thresholds and label
names recorded by export.py and read back (``resolve_task``), ``thresholds.json``.

The network is a ResNet-18 of 5 classes with seeded random weights at 32x32: its logits are
small (probabilities near 0.5), so a softmax over 5 classes (near 0.2) is far from them.
"""
import json
import logging
import os
import shutil

import mindspore as ms
import numpy as np
import pytest
import torch

from src.data.settings import EvalPreprocess
from src.deploy import formats
from src.deploy.inference import load_network, preprocess_images
from src.deploy.outputs import TASKS, probabilities
from src.deploy.publish import model_card, timm_config
from src.deploy.records import (
    THRESHOLDS_FILE,
    network_digest,
    read_model_record,
    tuned_values,
    write_tuned_thresholds,
)
from src.models.resnet import create_network
from src.recipe import model_config, resolve_model
from src.utils.checkpoint import CONFIG_KEY
from src.utils.config import ConfigError, load_schema, parse_config
from src.utils.hub import WeightsConfigError, resolve_weights
from src.utils.model_record import ModelRecord, RecordError, from_dict
from src.utils.multilabel_metrics import sigmoid
from src.utils.tasks import PROBLEM_TYPES
from tests.helpers import CIFAR_SAMPLE, run_in_process, succeeded
from tests.test_tta import float32_tolerance

TRAIN = os.path.join(CIFAR_SAMPLE, "train")
TEST = os.path.join(CIFAR_SAMPLE, "test")
IMAGES = 6
CLASSES = 5
NAMES = ["sky", "road", "car", "person", "tree"]
COMMON = ["--config_path", "configs/resnet18_cifar10.yaml", "--class_num", str(CLASSES),
          "--batch_size", str(IMAGES), "--num_parallel_workers", "1"]
EPS = np.finfo(np.float32).eps
ROUNDING = 5e-7  # predict.py prints probabilities rounded to 6 decimals


def config_of(*args):
    return parse_config([*COMMON, *[str(a) for a in args]])


def resolved_task(cfg):
    """The task a run of ``cfg`` uses (``resolve_model``)."""
    return resolve_model(cfg).task


# ---- probabilities ----

def test_probabilities_are_softmax_or_sigmoid_by_task_in_the_logits_dtype():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((7, CLASSES)) * 4).astype(np.float32)
    assert tuple(TASKS) == tuple(load_schema()[2]["task"])
    for dtype in (np.float32, np.float64):
        values = logits.astype(dtype)
        soft, sig = probabilities(values, "multiclass"), probabilities(values, "multilabel")
        assert soft.dtype == dtype and sig.dtype == dtype
        tolerance = 4 * np.finfo(dtype).eps
        np.testing.assert_allclose(soft, torch.softmax(torch.from_numpy(values), 1).numpy(),
                                   rtol=tolerance, atol=0)
        np.testing.assert_allclose(sig, torch.sigmoid(torch.from_numpy(values)).numpy(),
                                   rtol=tolerance, atol=0)
    extreme = probabilities(np.array([[-1000.0, 0.0, 1000.0]], np.float32), "multilabel")
    assert extreme.tolist() == [[0.0, 0.5, 1.0]]  # no overflow
    with pytest.raises(ValueError, match="task must be one of multiclass, multilabel"):
        probabilities(logits, "multilabels")


# ---- thresholds.json (by the weights they were tuned on) and the record's checks ----

def test_thresholds_file_keeps_each_weights_thresholds_and_malformed_ones_are_named(
        tmp_path, caplog):
    thresholds = np.array([0.1, 0.25, 0.5, 0.75, 0.9], np.float32)
    ckpt = str(tmp_path / "model.ckpt")
    path = write_tuned_thresholds(ckpt, NAMES, thresholds, "a" * 64)
    assert os.path.basename(path) == THRESHOLDS_FILE
    write_tuned_thresholds(str(tmp_path / "other.ckpt"), NAMES, [0.3] * 5, "b" * 64)
    with open(path, encoding="utf-8") as f:
        content = json.load(f)
    assert content["task"] == "multilabel" and len(content["tuned"]) == 2
    record = ModelRecord(class_num=CLASSES, class_names=tuple(NAMES), task="multilabel")
    own = tuned_values(ckpt, record, lambda r: "a" * 64)
    assert list(own.thresholds) == thresholds.tolist()  # float32 exact
    assert own.thresholds_weights == "a" * 64
    assert list(tuned_values(ckpt, record, lambda r: "b" * 64).thresholds) == [0.3] * 5
    with caplog.at_level(logging.WARNING):
        other = tuned_values(ckpt, record, lambda r: "c" * 64)
    assert other.thresholds is None and "values tuned on other weights" in caplog.text
    assert "model.ckpt, other.ckpt" in caplog.text and "0.5 for every class" in caplog.text
    with pytest.raises(RecordError, match="was tuned for a multilabel model of the classes"):
        tuned_values(ckpt, record.with_values(class_names=tuple(reversed(NAMES))),
                     lambda r: "a" * 64)
    with pytest.raises(RecordError, match="thresholds has 2 values but class_num is 5"):
        from_dict({"class_num": 5, "thresholds": [0.5, 0.5]})
    with pytest.raises(RecordError, match="thresholds is 1.5"):
        write_tuned_thresholds(ckpt, NAMES[:2], [0.5, 1.5], "d" * 64)
    for broken, message in (("{", "cannot read .* as JSON"),
                            ('{"task": "regression"}', r"expected a JSON object with a task "
                                                       r"\(multiclass, multilabel\)")):
        (tmp_path / THRESHOLDS_FILE).write_text(broken, encoding="utf-8")
        with pytest.raises(RecordError, match=message):
            tuned_values(ckpt, record, lambda r: "a" * 64)
    old = {"task": "multilabel", "class_names": NAMES, "thresholds": [0.2] * 5}
    (tmp_path / THRESHOLDS_FILE).write_text(json.dumps(old), encoding="utf-8")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert tuned_values(ckpt, record, lambda r: "a" * 64).thresholds is None
    assert "no weights_sha256" in caplog.text


def test_the_record_round_trips_and_malformed_ones_are_named():
    record = ModelRecord(net_name="resnet18", class_num=5, class_names=tuple(NAMES),
                         task="multilabel", thresholds=(0.3,) * 5, thresholds_weights="e" * 64,
                         tta="flip", preprocess={"image_size": 32, "resize": 32,
                                                 "interpolation": "bilinear"},
                         loss={"loss": "asl", "asl_gamma_neg": 4.0})
    assert from_dict(json.loads(record.to_json()), "m.onnx") == record
    with pytest.raises(RecordError, match="m.onnx: field task is 'regression'"):
        from_dict({"task": "regression"}, "m.onnx")
    with pytest.raises(RecordError, match="m.onnx: field thresholds is -0.1"):
        from_dict({"task": "multilabel", "thresholds": [-0.1]}, "m.onnx")
    with pytest.raises(RecordError, match="class_names has 4 values but class_num is 5"):
        from_dict({"class_num": 5, "class_names": NAMES[:4]}, "m.onnx")


def test_the_card_and_config_json_say_multi_label():
    config = timm_config("resnet18", 3, EvalPreprocess(image_size=32, resize=32), NAMES[:3],
                         thresholds=[0.4, 0.5, 0.6])
    assert config["problem_type"] == "multi_label_classification"
    assert PROBLEM_TYPES[config["problem_type"]].name == "multilabel"
    assert config["thresholds"] == [0.4, 0.5, 0.6]
    assert "problem_type" not in timm_config("resnet18", 3, EvalPreprocess(), NAMES[:3])
    card = model_card("m", config, "m.ckpt")
    assert "Multi-label: one sigmoid per class" in card and "0.4, 0.5, 0.6" in card
    # eval.py's eval_result.json of a multi-label model beside the checkpoint: its mAP
    evaluated = {"task": "multilabel", "mAP": 0.40863, "macro_f1": 0.4859, "images": 150,
                 "data_path": "data/cifar10_mosaics"}
    card = model_card("m", config, "m.ckpt", eval_result=evaluated)
    assert "mAP 0.4086, macro F1 0.4859 at its thresholds on 150 images" in card


# ---- the task a run takes ----

def tiny_checkpoint(folder, run_config=None):
    """A one-tensor ``folder/m.ckpt`` with ``run_config`` stored as train.py stores it (only
    the records are read here); returns the path."""
    os.makedirs(folder)
    path = os.path.join(str(folder), "m.ckpt")
    ms.save_checkpoint([{"name": "w", "data": ms.Tensor(np.zeros(1, np.float32))}], path,
                       append_dict={CONFIG_KEY: json.dumps(run_config)} if run_config else None)
    return path


def test_a_run_takes_the_checkpoints_task_and_refuses_another(tmp_path):
    stored = tiny_checkpoint(tmp_path / "stored", {"task": "multilabel"})
    cfg = config_of("--checkpoint_path", stored)
    model = resolve_model(cfg)
    assert model.task == "multilabel" and model_config(cfg, model).task == "multilabel"
    assert cfg.task == "multiclass"  # the config object is left as it was
    os.makedirs(tmp_path / "plain")
    plain = str(tmp_path / "plain" / "m.ckpt")
    ms.set_seed(1)
    ms.save_checkpoint(create_network("resnet18", class_num=CLASSES), plain)
    assert resolved_task(config_of("--checkpoint_path", plain)) == "multiclass"
    assert resolved_task(config_of("--checkpoint_path", plain, "--task", "multilabel")) == \
        "multilabel"
    digest = network_digest(load_network("resnet18", CLASSES, plain))
    write_tuned_thresholds(plain, NAMES, [0.5] * CLASSES, digest)  # tuned on its weights
    assert resolved_task(config_of("--checkpoint_path", plain)) == "multilabel"
    for path in (stored, plain):
        with pytest.raises(ConfigError, match=r"task multiclass: .* is a multilabel model"):
            resolved_task(config_of("--checkpoint_path", path, "--task", "multiclass"))


def test_a_folder_read_back_is_multi_label(tmp_path):
    folder = tmp_path / "hub"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    for problem, task in (*((p, t.name) for p, t in PROBLEM_TYPES.items()), (None, None)):
        config = {"num_classes": 2} if problem is None else {"problem_type": problem}
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
        assert resolve_weights(str(folder)).task == task
    (folder / "config.json").write_text('{"problem_type": "regression"}', encoding="utf-8")
    with pytest.raises(WeightsConfigError, match="problem_type is 'regression'"):
        assert resolve_weights(str(folder)).task


# ---- every path: export, then predict ----

@pytest.fixture(scope="module")
def multilabel_model(tmp_path_factory):
    """The network saved as ``r18.ckpt`` with ``class_names.txt`` and ``thresholds.json``
    beside it (each class's threshold between its 2nd and 3rd largest probability on the
    images: 2 of the 6 images get each label, unlike at 0.5), exported to MINDIR, ONNX, int8
    ONNX (calibrated on 12 shipped training images) and SAFETENSORS in another folder (no
    class names there: they come from the records)."""
    root = tmp_path_factory.mktemp("multilabel")
    images = root / "images"
    for name in sorted(os.listdir(TEST))[:3]:
        os.makedirs(images / name)
        for file in sorted(os.listdir(os.path.join(TEST, name)))[:IMAGES // 3]:
            shutil.copy(os.path.join(TEST, name, file), images / name / file)
    ms.set_seed(3)
    ckpt = str(root / "run" / "r18.ckpt")
    os.makedirs(root / "run")
    ms.save_checkpoint(create_network("resnet18", class_num=CLASSES), ckpt)
    (root / "run" / "class_names.txt").write_text("\n".join(NAMES) + "\n", encoding="utf-8")
    paths = sorted(str(images / c / f) for c in os.listdir(images)
                   for f in os.listdir(images / c))
    x = preprocess_images(paths, EvalPreprocess(image_size=32, resize=32))
    logits = load_network("resnet18", CLASSES, ckpt)(ms.Tensor(x)).asnumpy()
    ranked = np.sort(sigmoid(logits.astype(np.float64)), axis=0)[::-1]
    thresholds = ((ranked[1] + ranked[2]) / 2).astype(np.float32)
    write_tuned_thresholds(ckpt, NAMES, thresholds,
                           network_digest(load_network("resnet18", CLASSES, ckpt)))
    out = root / "exported"
    files = {"CKPT": ckpt}
    for name, extra in {"MINDIR": ["--file_format", "MINDIR"],
                        "ONNX": ["--file_format", "ONNX"],
                        "INT8": ["--file_format", "ONNX", "--quantize", "int8",
                                 "--calibration_data_path", TRAIN, "--calibration_images", "12"],
                        "SAFETENSORS": ["--file_format", "SAFETENSORS"]}.items():
        succeeded(run_in_process("export.py", *COMMON, "--checkpoint_path", ckpt, *extra,
                                 "--file_name", out / name.lower()))
        files[name] = str(out / name.lower()) + formats.FORMATS[extra[1]].suffix
    return {"files": files, "images": str(images), "paths": paths, "x": x, "logits": logits,
            "thresholds": thresholds.astype(np.float64)}


def predicted(source, images, *args):
    """predict.py's JSON lines on ``images`` (all 5 classes in ``top``)."""
    result = succeeded(run_in_process("predict.py", *COMMON, "--checkpoint_path", source,
                                      "--image_path", images, "--top_k", str(CLASSES), *args))
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.slow
def test_every_format_predicts_sigmoid_labels_above_the_models_thresholds(multilabel_model):
    files, logits = multilabel_model["files"], multilabel_model["logits"]
    thresholds = multilabel_model["thresholds"]
    expected = sigmoid(logits.astype(np.float64))
    tolerance = float32_tolerance(logits) + ROUNDING
    at_half = [[k for k in np.argsort(-row) if row[k] >= 0.5] for row in expected]
    runs = {**{name: (source,) for name, source in files.items()},
            "CKPT in ONNX Runtime": (files["CKPT"], "--runtime", "onnxruntime")}
    for name, (source, *args) in runs.items():
        lines = predicted(source, multilabel_model["images"], *args)
        assert [line["image"] for line in lines] == multilabel_model["paths"], name
        probs = np.zeros((IMAGES, CLASSES))
        for i, line in enumerate(lines):
            for entry in line["top"]:
                probs[i, entry["class"]] = entry["probability"]
        if name == "INT8":  # its own logits: sigmoid of them, and they follow the network's
            from tests.test_quantize import MIN_MEAN_COSINE

            own = formats.load_predictor(source, "resnet18", CLASSES, IMAGES)(
                multilabel_model["x"])
            np.testing.assert_allclose(probs, sigmoid(own.astype(np.float64)), rtol=0,
                                       atol=float32_tolerance(own) + ROUNDING)
            cosine = (own * logits).sum(1) / np.linalg.norm(own, axis=1) / np.linalg.norm(
                logits, axis=1)
            assert cosine.mean() > MIN_MEAN_COSINE, cosine
        else:
            np.testing.assert_allclose(probs, expected, rtol=0, atol=tolerance, err_msg=name)
        labels = [[entry["class"] for entry in line["labels"]] for line in lines]
        assert labels == [[k for k in np.argsort(-row, kind="stable") if row[k] >= thresholds[k]]
                          for row in probs], name
        assert labels != at_half and all(len(row) < CLASSES for row in labels), name
        assert all(entry["name"] == NAMES[entry["class"]] for line in lines
                   for entry in line["labels"] + line["top"]), name

    # the records: every exported file says multilabel, with the thresholds and names
    for name in ("MINDIR", "ONNX", "INT8", "SAFETENSORS"):
        record = read_model_record(files[name])
        assert (record.task, record.class_names) == ("multilabel", tuple(NAMES)), name
        assert list(record.thresholds) == thresholds.tolist(), name
    with open(os.path.join(files["SAFETENSORS"], "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert (config["problem_type"], config["label_names"], config["thresholds"]) == (
        "multi_label_classification", NAMES, thresholds.tolist())
    assert resolve_weights(files["SAFETENSORS"]).task == "multilabel"
    for source in files.values():
        with pytest.raises(ConfigError, match="task multiclass: .* is a multilabel model"):
            resolved_task(config_of("--checkpoint_path", source, "--task", "multiclass"))


# ---- the three mutations of outputs.py the audit listed ----

def test_softmax_of_large_logits_has_no_nan_and_labels_include_the_threshold_itself():
    """softmax shifts by the row's maximum (without it exp(1000) is inf and the row NaN);
    a label is given at a probability equal to its threshold (eval's ``>=``); torch is the
    reference."""
    from src.deploy.outputs import labels_above

    logits = np.array([[1000.0, 0.0, -1000.0], [89.0, 88.0, 0.0]], np.float32)
    got = probabilities(logits, "multiclass")
    np.testing.assert_allclose(got, torch.softmax(torch.from_numpy(logits), 1).numpy(),
                               rtol=1e-6, atol=0)
    assert np.isfinite(got).all()
    probs = np.array([0.5, 0.3, 0.7], np.float64)
    labels = labels_above(probs, np.array([0.5, 0.31, 0.7]), ["a", "b", "c"])
    assert [entry["name"] for entry in labels] == ["c", "a"]


def test_a_json_true_is_no_threshold(tmp_path):
    """``true`` in a record's thresholds (JSON's boolean, which Python's ``int`` would take as
    1) is refused naming the field, in a record, in thresholds.json and in old metadata."""
    with pytest.raises(RecordError, match="field thresholds is True"):
        from_dict({"class_num": 2, "task": "multilabel", "thresholds": [True, 0.5]}, "m.onnx")
    ckpt = str(tmp_path / "m.ckpt")
    (tmp_path / THRESHOLDS_FILE).write_text(json.dumps(
        {"task": "multilabel", "class_names": NAMES,
         "tuned": [{"weights_sha256": "a" * 64, "thresholds": [True, 0.5, 0.5, 0.5, 0.5]}]}),
        encoding="utf-8")
    record = ModelRecord(class_num=CLASSES, class_names=tuple(NAMES), task="multilabel")
    with pytest.raises(RecordError, match="field thresholds is True"):
        tuned_values(ckpt, record, lambda r: "a" * 64)
