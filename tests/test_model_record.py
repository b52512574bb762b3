"""The model record (``src/utils/model_record.py``, ``src/deploy/records.py``,
``src/recipe/model_record.py``): what every checkpoint and export says of the model it holds,
read back equal from each artifact kind; thresholds that belong to the weights they were tuned
on; where two records (or a record and the data, or the command line) meet, they agree or the
command stops naming both.
"""
import json
import logging
import os

import mindspore as ms
import numpy as np
import pytest

from src.data.class_names import CIFAR10_CLASSES
from src.deploy.inference import load_network
from src.deploy.records import network_digest, read_model_record, write_tuned_thresholds
from src.models.resnet import create_network
from src.recipe import check_teacher_classes, resolve_model
from src.training.best import BestCheckpoint
from src.utils.checkpoint import RECORD_KEY, stored_record_text
from src.utils.config import ConfigError, parse_config
from src.utils.model_record import ModelRecord, RecordError, from_json
from src.utils.tasks import MULTILABEL
from tests.helpers import CIFAR_SAMPLE, run_in_process, succeeded

TEST = os.path.join(CIFAR_SAMPLE, "test")
NAMES = ("sky", "road", "car", "person", "tree")
COMMON = ["--config_path", "configs/resnet18_cifar10.yaml", "--batch_size", "4",
          "--num_parallel_workers", "1"]


def config_of(*args):
    return parse_config([*COMMON, *[str(a) for a in args]])


def saved(path, record, seed=0, class_num=None):
    """A ResNet-18 (seeded weights) saved at ``path`` with ``record`` stored as training
    stores it; returns the path."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ms.set_seed(seed)
    net = create_network("resnet18", class_num=class_num or record.class_num)
    ms.save_checkpoint(net, path, append_dict={RECORD_KEY: record.to_json()})
    return path


MULTILABEL_RECORD = ModelRecord(net_name="resnet18", class_num=5, class_names=NAMES,
                                task="multilabel", tta="none",
                                preprocess={"image_size": 32, "resize": 32,
                                            "interpolation": "bilinear"},
                                loss={"loss": "bce", "label_smoothing": 0.0})
MULTICLASS_RECORD = ModelRecord(net_name="resnet18", class_num=10,
                                class_names=tuple(CIFAR10_CLASSES), task="multiclass",
                                tta="none", preprocess={"image_size": 32, "resize": 32,
                                                        "interpolation": "bilinear"})


# ---- checkpoints hold it ----

def test_the_best_checkpoint_holds_the_record_and_reads_back_equal(tmp_path):
    best = BestCheckpoint(str(tmp_path / "r18-best.ckpt"), task=MULTILABEL,
                          model_record=MULTILABEL_RECORD.to_json())
    net = create_network("resnet18", class_num=5)
    assert best.update({"mAP": 0.25}, 1, net)
    assert from_json(stored_record_text(best.path)) == MULTILABEL_RECORD
    assert read_model_record(best.path) == MULTILABEL_RECORD


def test_a_record_without_config_gives_predict_its_network_classes_task_and_preprocess(
        tmp_path):
    """No --config_path, no --task, no --class_num: the checkpoint's record decides, and the
    config object itself is left as it was."""
    ckpt = saved(str(tmp_path / "run" / "r18-best.ckpt"), MULTILABEL_RECORD)
    cfg = parse_config(["--checkpoint_path", ckpt])
    model = resolve_model(cfg)
    assert (model.net_name, model.class_num, model.task, model.class_names) == (
        "resnet18", 5, "multilabel", NAMES)
    assert model.preprocess["image_size"] == 32
    assert (cfg.net_name, cfg.class_num, cfg.task) == ("resnet50", 1000, "multiclass")


# ---- thresholds belong to weights ----

def test_thresholds_tuned_on_checkpoint_a_are_not_applied_to_b_of_the_same_folder(
        tmp_path, caplog):
    folder = tmp_path / "run"
    a = saved(str(folder / "a.ckpt"), MULTILABEL_RECORD, seed=1)
    b = saved(str(folder / "b.ckpt"), MULTILABEL_RECORD, seed=2)  # other weights
    digest_a = network_digest(load_network("resnet18", 5, a))
    assert digest_a != network_digest(load_network("resnet18", 5, b))
    tuned = [0.1, 0.2, 0.3, 0.4, 0.6]
    write_tuned_thresholds(a, NAMES, tuned, digest_a)
    on_a = resolve_model(parse_config(["--checkpoint_path", a]))
    assert list(on_a.thresholds) == tuned and on_a.thresholds_weights == digest_a
    with caplog.at_level(logging.WARNING):
        on_b = resolve_model(parse_config(["--checkpoint_path", b]))
    assert on_b.thresholds is None  # 0.5 each when predicting
    assert "thresholds.json holds values tuned on other weights (a.ckpt)" in caplog.text
    assert "b.ckpt has other weights" in caplog.text
    # the same weights under another name (a copy) take them
    copy = str(folder / "copy.ckpt")
    ms.save_checkpoint(load_network("resnet18", 5, a), copy,
                       append_dict={RECORD_KEY: MULTILABEL_RECORD.to_json()})
    assert list(resolve_model(parse_config(["--checkpoint_path", copy])).thresholds) == tuned


# ---- where records meet: they agree, or the command stops naming both ----

def test_task_multilabel_on_a_multiclass_checkpoint_is_refused_naming_both(tmp_path):
    ckpt = saved(str(tmp_path / "mc.ckpt"), MULTICLASS_RECORD)
    with pytest.raises(ConfigError, match=r"task multilabel: .*mc.ckpt is a multiclass model"):
        resolve_model(config_of("--checkpoint_path", ckpt, "--task", "multilabel"))
    with pytest.raises(ConfigError, match=r"class_num 7: .*mc.ckpt records class_num 10"):
        resolve_model(config_of("--checkpoint_path", ckpt, "--class_num", 7))
    result = run_in_process("predict.py", "--checkpoint_path", ckpt, "--image_path", TEST,
                            "--task", "multilabel")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "is a multiclass model" in result.stderr


def test_eval_on_a_folder_of_other_class_names_is_refused(tmp_path):
    renamed = ModelRecord(**{**MULTICLASS_RECORD.recorded(),
                             "class_names": tuple(reversed(CIFAR10_CLASSES))})
    ckpt = saved(str(tmp_path / "renamed.ckpt"), renamed)
    result = run_in_process("eval.py", "--checkpoint_path", ckpt, "--data_path", TEST,
                            "--output_dir", tmp_path / "out")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"data_path {TEST} has other classes than" in result.stderr
    assert "0: airplane / truck" in result.stderr
    assert not (tmp_path / "out").exists()


def test_eval_on_the_models_own_classes_runs_and_names_the_loss(tmp_path):
    ckpt = saved(str(tmp_path / "own.ckpt"), MULTICLASS_RECORD)
    result = succeeded(run_in_process("eval.py", "--checkpoint_path", ckpt, "--data_path", TEST,
                                      "--output_dir", tmp_path / "out", "--batch_size", "20"))
    with open(tmp_path / "out" / "eval_result.json", encoding="utf-8") as f:
        evaluated = json.load(f)
    assert evaluated["images"] == 200 and evaluated["net_name"] == "resnet18", result.stdout
    assert evaluated["loss_name"] == "cross-entropy (label_smoothing 0.1)"


def test_a_teacher_of_other_class_names_is_refused_and_one_without_names_noted(
        tmp_path, caplog):
    teacher = saved(str(tmp_path / "teacher.ckpt"), ModelRecord(
        **{**MULTICLASS_RECORD.recorded(),
           "class_names": (*CIFAR10_CLASSES[1:], CIFAR10_CLASSES[0])}))
    cfg = config_of("--kd_teacher", teacher)
    with pytest.raises(ConfigError, match=r"kd_teacher .*teacher.ckpt was trained on other "
                                          r"classes than data_path's \(label: teacher / data: "
                                          r"0: automobile / airplane"):
        check_teacher_classes(cfg, CIFAR10_CLASSES)
    same = saved(str(tmp_path / "same.ckpt"), MULTICLASS_RECORD)
    check_teacher_classes(config_of("--kd_teacher", same), CIFAR10_CLASSES)
    plain = str(tmp_path / "plain.ckpt")
    ms.save_checkpoint(create_network("resnet18", class_num=10), plain)
    with caplog.at_level(logging.INFO):
        check_teacher_classes(config_of("--kd_teacher", plain), CIFAR10_CLASSES)
    assert "records no class names" in caplog.text


def test_train_refuses_a_teacher_of_other_classes_before_training(tmp_path):
    teacher = saved(str(tmp_path / "teacher.ckpt"), ModelRecord(
        **{**MULTICLASS_RECORD.recorded(), "class_names": tuple(reversed(CIFAR10_CLASSES))}))
    result = run_in_process("train.py", "--config_path", "configs/quick_start.yaml",
                            "--kd_teacher", teacher, "--kd_net_name", "resnet18",
                            "--output_dir", tmp_path / "out")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "was trained on other classes than data_path's" in result.stderr
    assert not any(name.endswith(".ckpt") for name in os.listdir(tmp_path / "out")) \
        if (tmp_path / "out").exists() else True


def test_class_names_path_other_than_the_record_is_refused(tmp_path):
    ckpt = saved(str(tmp_path / "m.ckpt"), MULTILABEL_RECORD)
    names = tmp_path / "names.txt"
    names.write_text("\n".join(reversed(NAMES)) + "\n", encoding="utf-8")
    with pytest.raises(RecordError, match="lists other class names than"):
        resolve_model(parse_config(["--checkpoint_path", ckpt, "--class_names_path", str(names)]))
    names.write_text("\n".join(NAMES) + "\n", encoding="utf-8")
    assert resolve_model(parse_config(["--checkpoint_path", ckpt, "--class_names_path",
                                       str(names)])).class_names == NAMES


# ---- every artifact kind: the record read back equals the one written ----

@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A multi-class and a multi-label checkpoint with records (32 px), each exported to
    ONNX, MINDIR and SAFETENSORS with no --config_path, --task or --class_num."""
    root = tmp_path_factory.mktemp("records")
    files = {}
    for kind, record in (("multiclass", MULTICLASS_RECORD), ("multilabel", MULTILABEL_RECORD)):
        ckpt = saved(str(root / kind / "r18-best.ckpt"), record)
        files[kind, "CKPT"] = ckpt
        for fmt, suffix in (("ONNX", ".onnx"), ("MINDIR", ".mindir"), ("SAFETENSORS", "")):
            name = root / kind / f"exported_{fmt.lower()}"
            succeeded(run_in_process("export.py", "--checkpoint_path", ckpt, "--file_format",
                                     fmt, "--batch_size", "4", "--file_name", name))
            files[kind, fmt] = str(name) + suffix
    return files


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["multiclass", "multilabel"])
@pytest.mark.parametrize("fmt", ["CKPT", "ONNX", "MINDIR", "SAFETENSORS"])
def test_the_record_read_back_from_each_artifact_equals_the_one_written(exports, kind, fmt):
    written = MULTICLASS_RECORD if kind == "multiclass" else MULTILABEL_RECORD
    assert read_model_record(exports[kind, fmt]) == written


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["ONNX", "MINDIR"])
def test_a_multiclass_graph_names_its_classes_in_predict(exports, fmt):
    result = succeeded(run_in_process("predict.py", "--checkpoint_path",
                                      exports["multiclass", fmt], "--image_path", TEST,
                                      "--batch_size", "4", "--top_k", "3"))
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 200
    assert all(entry["name"] == CIFAR10_CLASSES[entry["class"]]
               for line in lines for entry in line["top"])


@pytest.mark.slow
def test_eval_on_a_multilabel_onnx_needs_no_class_num(exports, tmp_path):
    mosaics = os.path.join(os.path.dirname(CIFAR_SAMPLE), "cifar10_mosaics")
    table = tmp_path / "val.csv"
    with open(os.path.join(mosaics, "val.csv"), encoding="utf-8") as f:
        rows = f.read().splitlines()[:9]
    names = {"airplane": "sky", "automobile": "road", "bird": "car", "cat": "person",
             "deer": "tree"}
    kept = [rows[0]] + [f"{path},{' '.join(names[t] for t in tags.split() if t in names)}"
                        for path, tags in (row.split(",", 1) for row in rows[1:])]
    table.write_text("\n".join(kept) + "\n", encoding="utf-8")
    result = succeeded(run_in_process(
        "eval.py", "--checkpoint_path", exports["multilabel", "ONNX"], "--data_path", mosaics,
        "--label_file", table, "--batch_size", "4", "--output_dir", tmp_path / "out"))
    with open(tmp_path / "out" / "eval_result.json", encoding="utf-8") as f:
        evaluated = json.load(f)
    assert evaluated["task"] == "multilabel" and evaluated["images"] == 8, result.stdout
    assert [c["name"] for c in evaluated["per_class"]] == list(NAMES)
    assert evaluated["loss_name"] == "bce (label_smoothing 0.0)"
    assert np.isfinite(evaluated["loss"])


def test_model_probabilities_apply_the_recorded_temperature():
    import torch

    from src.deploy.outputs import model_probabilities
    logits = np.random.default_rng(4).standard_normal((6, 10)).astype(np.float32) * 5
    for temperature in (None, 0.5, 2.0):
        got = model_probabilities(logits, MULTICLASS_RECORD.with_values(temperature=temperature))
        expected = torch.softmax(torch.from_numpy(logits) / (temperature or 1.0), 1).numpy()
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expected, rtol=4 * np.finfo(np.float32).eps, atol=1e-9)
    sig = model_probabilities(logits[:, :5], MULTILABEL_RECORD.with_values(temperature=2.0))
    np.testing.assert_allclose(sig, torch.sigmoid(torch.from_numpy(logits[:, :5]) / 2).numpy(),
                               rtol=4 * np.finfo(np.float32).eps, atol=1e-9)
    with pytest.raises(RecordError, match="field temperature is -1"):
        MULTICLASS_RECORD.with_values(temperature=-1.0)
