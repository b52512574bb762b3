"""Multi-label models deployed (``src/deploy/outputs.py``): a sigmoid per class on every path
(.ckpt, MindIR, ONNX, int8 ONNX, the SAFETENSORS folder), the task, thresholds and label
names recorded by export.py and read back (``resolve_task``), ``thresholds.json``.

The network is a ResNet-18 of 5 classes with seeded random weights at 32x32: its logits are
small (probabilities near 0.5), so a softmax over 5 classes (near 0.2) is far from them.
"""
import json
import os
import shutil

import mindspore as ms
import numpy as np
import pytest
import torch

from src.data.settings import EvalPreprocess
from src.deploy import formats
from src.deploy.exporting import mindir_metadata, onnx_metadata
from src.deploy.inference import load_network, preprocess_images
from src.deploy.outputs import (
    TASKS,
    THRESHOLDS_FILE,
    ThresholdsError,
    metadata_record,
    probabilities,
    read_metadata_record,
    read_thresholds,
    sigmoid,
    write_thresholds,
)
from src.deploy.publish import model_card, timm_config
from src.models.resnet import create_network
from src.recipe import resolve_task
from src.utils.checkpoint import CONFIG_KEY
from src.utils.config import ConfigError, load_schema, parse_config
from src.utils.hub import PROBLEM_TYPES, WeightsConfigError, resolve_weights
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


# ---- thresholds.json and the metadata record ----

def test_thresholds_file_round_trips_and_malformed_ones_are_named(tmp_path):
    thresholds = np.array([0.1, 0.25, 0.5, 0.75, 0.9], np.float32)
    path = write_thresholds(str(tmp_path), NAMES, thresholds)
    assert os.path.basename(path) == THRESHOLDS_FILE
    with open(path, encoding="utf-8") as f:
        assert json.load(f)["task"] == "multilabel"
    ckpt = str(tmp_path / "model.ckpt")
    assert read_thresholds(ckpt, CLASSES).tolist() == thresholds.tolist()  # float32 exact
    assert read_thresholds(str(tmp_path / "elsewhere" / "m.ckpt"), CLASSES) is None
    with pytest.raises(ThresholdsError, match="class_names lists 5 names but the model has 4"):
        read_thresholds(ckpt, 4)
    with pytest.raises(ThresholdsError, match=r"thresholds\[1\] is 1.5"):
        write_thresholds(str(tmp_path), NAMES[:2], [0.5, 1.5])
    for broken, message in (("{", "cannot read .* as JSON"),
                            ('{"task": "multiclass"}', "expected a JSON object with task "
                                                       "multilabel"),
                            (json.dumps({"task": "multilabel", "class_names": NAMES,
                                         "thresholds": [0.5] * 4}),
                             "thresholds is 4 values; expected a list of 5 numbers")):
        (tmp_path / THRESHOLDS_FILE).write_text(broken, encoding="utf-8")
        with pytest.raises(ThresholdsError, match=message):
            read_thresholds(ckpt, CLASSES)


def test_the_metadata_record_round_trips():
    assert metadata_record("multiclass", NAMES, [0.5] * 5) == {"task": "multiclass"}
    record = read_metadata_record(metadata_record("multilabel", NAMES, [0.3] * 5), "m.onnx")
    assert (record.task, record.thresholds.tolist(), record.label_names) == (
        "multilabel", [0.3] * 5, NAMES)
    old = read_metadata_record({}, "old.onnx")  # exported before the task was recorded
    assert (old.task, old.thresholds, old.label_names) == ("multiclass", None, None)
    with pytest.raises(ThresholdsError, match="records task 'regression'"):
        read_metadata_record({"task": "regression"}, "m.onnx")
    with pytest.raises(ThresholdsError, match=r"m.onnx: thresholds\[0\] is -0.1"):
        read_metadata_record({"task": "multilabel", "thresholds": "[-0.1]"}, "m.onnx")


def test_the_card_and_config_json_say_multi_label():
    config = timm_config("resnet18", 3, EvalPreprocess(image_size=32, resize=32), NAMES[:3],
                         thresholds=[0.4, 0.5, 0.6])
    assert config["problem_type"] == "multi_label_classification"
    assert PROBLEM_TYPES[config["problem_type"]] == "multilabel"
    assert config["thresholds"] == [0.4, 0.5, 0.6]
    assert "problem_type" not in timm_config("resnet18", 3, EvalPreprocess(), NAMES[:3])
    card = model_card("m", config, "m.ckpt")
    assert "Multi-label: one sigmoid per class" in card and "0.4, 0.5, 0.6" in card
    # eval.py's eval_result.json of a multi-label model beside the checkpoint: its mAP
    evaluated = {"task": "multilabel", "mAP": 0.40863, "macro_f1": 0.4859, "images": 150,
                 "data_path": "data/cifar10_mosaics"}
    card = model_card("m", config, "m.ckpt", eval_result=evaluated)
    assert "mAP 0.4086, macro F1 0.4859 at its thresholds on 150 images" in card


# ---- resolve_task ----

def tiny_checkpoint(folder, run_config=None):
    """A one-tensor ``folder/m.ckpt`` with ``run_config`` stored as train.py stores it (only
    the records are read here); returns the path."""
    os.makedirs(folder)
    path = os.path.join(str(folder), "m.ckpt")
    ms.save_checkpoint([{"name": "w", "data": ms.Tensor(np.zeros(1, np.float32))}], path,
                       append_dict={CONFIG_KEY: json.dumps(run_config)} if run_config else None)
    return path


def test_resolve_task_takes_the_checkpoints_record_and_refuses_another(tmp_path):
    stored = tiny_checkpoint(tmp_path / "stored", {"task": "multilabel"})
    cfg = config_of("--checkpoint_path", stored)
    assert resolve_task(cfg) == "multilabel" and cfg.task == "multilabel"
    plain = tiny_checkpoint(tmp_path / "plain")
    assert resolve_task(config_of("--checkpoint_path", plain)) == "multiclass"
    assert resolve_task(config_of("--checkpoint_path", plain, "--task", "multilabel")) == \
        "multilabel"
    write_thresholds(str(tmp_path / "plain"), NAMES, [0.5] * CLASSES)
    assert resolve_task(config_of("--checkpoint_path", plain)) == "multilabel"
    for path in (stored, plain):
        with pytest.raises(ConfigError, match=r"task multiclass: .* is a multilabel model"):
            resolve_task(config_of("--checkpoint_path", path, "--task", "multiclass"))


def test_a_folder_read_back_is_multi_label(tmp_path):
    folder = tmp_path / "hub"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    for problem, task in (*PROBLEM_TYPES.items(), (None, None)):
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
    write_thresholds(str(root / "run"), NAMES, thresholds)
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
    for name, read in (("MINDIR", mindir_metadata), ("ONNX", onnx_metadata),
                       ("INT8", onnx_metadata)):
        record = read_metadata_record(read(files[name]), files[name])
        assert (record.task, record.label_names) == ("multilabel", NAMES), name
        assert record.thresholds.tolist() == thresholds.tolist(), name
    with open(os.path.join(files["SAFETENSORS"], "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert (config["problem_type"], config["label_names"], config["thresholds"]) == (
        "multi_label_classification", NAMES, thresholds.tolist())
    assert resolve_weights(files["SAFETENSORS"]).task == "multilabel"
    for source in files.values():
        with pytest.raises(ConfigError, match="task multiclass: .* is a multilabel model"):
            resolve_task(config_of("--checkpoint_path", source, "--task", "multiclass"))
