"""Inference (src/deploy/inference.py, eval.py, predict.py): exported models' input shapes are
checked
against the shape they declare and only a real mismatch is reported as one; predict streams a
folder batch by batch; eval counts the images it evaluated."""
import importlib
import json
import os
import shutil

import mindspore as ms
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from src.data import pipeline
from src.data.settings import EvalPreprocess
from src.deploy import formats, inference
from src.deploy.formats import load_predictor
from src.deploy.inference import (
    ModelFileError,
    ModelInputError,
    batched,
    list_images,
    load_mindir,
    mindir_input_shape,
    preprocess_images,
)
from src.deploy.outputs import softmax
from src.models.resnet import create_network
from src.utils import device
from src.utils.config import ConfigError
from src.utils.errors import MissingFileError, UserError
from tests.helpers import ROOT, copy_class_folders

SAMPLE = os.path.join(ROOT, "data", "cifar10_sample")
SHAPE = (2, 3, 4, 4)  # the tiny exported models' input: batch 2, 4x4 pixels


def save_onnx(path, nodes, batch, initializers=()):
    """Write an ONNX graph: input ``image`` float32 (batch, 3, 4, 4) -> ``logits``."""
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                      [batch, 3, 4, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
        initializer=list(initializers))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


@pytest.fixture()
def onnx_mean(tmp_path):
    """Logits = the mean of each of the 3 channels, at batch 2."""
    return save_onnx(str(tmp_path / "mean.onnx"),
                     [helper.make_node("GlobalAveragePool", ["image"], ["pooled"]),
                      helper.make_node("Flatten", ["pooled"], ["logits"])], batch=SHAPE[0])


def images(count, size=4):
    return np.random.default_rng(0).random((count, 3, size, size), dtype=np.float32)


# ---- exported models: shape checks ----

def test_onnx_runs_any_number_of_images_in_exported_batches(onnx_mean):
    x = images(5)
    np.testing.assert_allclose(load_predictor(onnx_mean, "unused", 3, 2)(x),
                               x.mean(axis=(2, 3)), rtol=1e-6)


def test_onnx_shape_mismatch_names_the_file_and_both_shapes(onnx_mean):
    with pytest.raises(ModelInputError, match=r"mean.onnx was exported for input shape "
                                              r"\(2, 3, 4, 4\) but gets \(3, 3, 4, 4\)"):
        load_predictor(onnx_mean, "unused", 3, 3)(images(3))
    with pytest.raises(ModelInputError, match=r"\(2, 3, 4, 4\) but gets \(2, 3, 5, 5\)"):
        load_predictor(onnx_mean, "unused", 3, 2)(images(2, size=5))
    assert issubclass(ModelInputError, UserError)


def test_an_onnx_failure_that_is_no_shape_mismatch_is_not_relabelled(tmp_path):
    # a symbolic batch (no fixed size to check) and a Reshape that fails inside ONNX Runtime
    path = save_onnx(str(tmp_path / "bad.onnx"),
                     [helper.make_node("Reshape", ["image", "shape"], ["logits"])], batch="N",
                     initializers=[helper.make_tensor("shape", TensorProto.INT64, [2], [5, -1])])
    with pytest.raises(Exception) as info:
        load_predictor(path, "unused", 3, 2)(images(2))
    assert not isinstance(info.value, (UserError, ValueError)), info.value
    assert "batch_size" not in str(info.value) and "Reshape" in str(info.value)


def test_a_forward_failure_propagates_unchanged():
    error = RuntimeError("out of memory in the runtime")

    def forward(x):
        raise error

    with pytest.raises(RuntimeError) as info:
        batched(forward, 2, "MindIR", "model.mindir")(images(2))
    assert info.value is error


@pytest.fixture(scope="module")
def tiny_mindir(tmp_path_factory):
    """A MindIR exported at batch 2, 4x4 pixels, whose Dense layer fixes the image size."""
    net = ms.nn.SequentialCell([ms.nn.Flatten(), ms.nn.Dense(48, 3)])
    net.set_train(False)
    path = str(tmp_path_factory.mktemp("mindir") / "tiny")
    ms.export(net, ms.Tensor(images(2)), file_name=path, file_format="MINDIR")
    return path + ".mindir"


def test_mindir_declared_shape_is_checked(tiny_mindir):
    assert mindir_input_shape(tiny_mindir) == SHAPE
    assert load_predictor(tiny_mindir, "unused", 3, 2)(images(3)).shape == (3, 3)
    with pytest.raises(ModelInputError, match=r"tiny.mindir was exported for input shape "
                                              r"\(2, 3, 4, 4\) but gets \(3, 3, 4, 4\)"):
        load_predictor(tiny_mindir, "unused", 3, 3)(images(3))


def test_mindir_without_a_readable_shape_reports_only_a_shape_failure(tiny_mindir):
    graph = load_mindir(tiny_mindir)
    forward = batched(lambda x: graph(ms.Tensor(x)).asnumpy(), 2, "MindIR", tiny_mindir)
    assert forward(images(2)).shape == (2, 3)
    with pytest.raises(ModelInputError, match=r"tiny.mindir cannot take input of shape "
                                              r"\(2, 3, 5, 5\)"):
        forward(images(2, size=5))


def test_missing_model_files_are_user_errors(tmp_path):
    for name in ("none.mindir", "none.onnx", "none.ckpt"):
        with pytest.raises(MissingFileError, match="none"):
            load_predictor(str(tmp_path / name), "resnet18", 10, 2)
    with pytest.raises(MissingFileError, match="neither a file nor a folder"):
        list_images(str(tmp_path / "nowhere"))


# ---- predict.py: a folder in batches ----

@pytest.fixture(scope="module")
def r18_ckpt(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ckpt") / "r18.ckpt")
    ms.save_checkpoint(create_network("resnet18", class_num=10), path)
    return path


def test_predict_preprocesses_a_folder_batch_by_batch(r18_ckpt, tmp_path, monkeypatch, capsys):
    predict = importlib.import_module("predict")
    folder = copy_class_folders(os.path.join(SAMPLE, "test"), str(tmp_path / "images"), 7,
                                classes=["cat"])
    sizes = []

    def spy(paths, *args):
        sizes.append(len(paths))
        return preprocess_images(paths, *args)

    monkeypatch.setattr(inference, "preprocess_images", spy)
    monkeypatch.setattr(device, "setup_device", lambda *args, **kwargs: None)  # context as is
    assert predict.main(["--config_path", "configs/quick_start.yaml", "--checkpoint_path",
                         r18_ckpt, "--image_path", folder, "--batch_size", "3"]) == 0
    assert sizes == [3, 3, 1]

    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    paths = list_images(folder)
    probs = softmax(load_predictor(r18_ckpt, "resnet18", 10, 3)(preprocess_images(
        paths, EvalPreprocess(image_size=32, resize=32))))
    assert [p["image"] for p in printed] == paths
    for item, row in zip(printed, probs):
        assert [t["class"] for t in item["top"]] == list(np.argsort(-row)[:5])
        assert [t["probability"] for t in item["top"]] == [round(float(p), 6)
                                                           for p in np.sort(row)[::-1][:5]]


# ---- eval.py: the image count ----

def test_eval_reports_the_images_it_evaluated(r18_ckpt, tmp_path, monkeypatch, capsys):
    evaluation = importlib.import_module("eval")
    create = pipeline.create_dataset
    monkeypatch.setattr(pipeline, "create_dataset",
                        lambda *args, **kwargs: create(*args, **kwargs).take(2))  # 2 of 25 batches
    monkeypatch.setattr(device, "setup_device", lambda *args, **kwargs: None)
    out = tmp_path / "out"
    assert evaluation.main(["--config_path", "configs/quick_start.yaml", "--checkpoint_path",
                            r18_ckpt, "--data_path", os.path.join(SAMPLE, "test"),
                            "--batch_size", "8", "--num_parallel_workers", "1",
                            "--output_dir", str(out)]) == 0
    report = json.load(open(out / "eval_result.json"))
    assert report["images"] == 16  # not the 200 of the folder
    assert "over 16 images" in capsys.readouterr().out
    assert report["top1"] * 16 == pytest.approx(round(report["top1"] * 16))


def test_predict_refuses_a_model_of_another_class_count(tmp_path, monkeypatch):
    predict = importlib.import_module("predict")
    image = os.path.join(SAMPLE, "test", "cat", os.listdir(os.path.join(SAMPLE, "test", "cat"))[0])
    monkeypatch.setattr(device, "setup_device", lambda *args, **kwargs: None)
    monkeypatch.setattr(formats, "load_predictor",  # an exported 7-class model
                        lambda *args, **kwargs: lambda x: np.zeros((len(x), 7), np.float32))
    with pytest.raises(ConfigError, match="model.onnx outputs 7 classes but class_num is 10: "
                                          "pass --class_num 7"):
        predict.main(["--config_path", "configs/quick_start.yaml", "--checkpoint_path",
                      str(tmp_path / "model.onnx"), "--image_path", image])


def test_image_extensions_in_any_case_are_read_and_other_files_counted(tmp_path, caplog):
    source = os.path.join(SAMPLE, "test", "cat")
    first = sorted(os.listdir(source))[0]
    for name in ("a.jpg", "b.Jpg", "c.JPEG"):
        shutil.copy(os.path.join(source, first), tmp_path / name)
    for name in ("notes.txt", "labels.txt", "README", ".hidden.jpg"):
        (tmp_path / name).write_text("x")
    with caplog.at_level("WARNING"):
        found = list_images(str(tmp_path))
    assert [os.path.basename(p) for p in found] == ["a.jpg", "b.Jpg", "c.JPEG"]
    assert "skipped 4 files that are not images (.txt: 2, hidden: 1, no extension: 1)" in \
        caplog.text


@pytest.mark.parametrize("suffix, kind", [(".mindir", "MindIR"), (".onnx", "ONNX")])
def test_a_corrupt_model_file_is_named(tmp_path, suffix, kind):
    path = tmp_path / f"cut{suffix}"
    path.write_bytes(b"\x08\x01\x12\x04" + os.urandom(3000))  # not a whole protobuf
    with pytest.raises(ModelFileError, match=f"cannot load {kind} file {path}: "):
        load_predictor(str(path), "resnet18", 10, 2)
