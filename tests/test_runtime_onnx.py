"""``--runtime onnxruntime`` (``src/deploy/inference.py``): eval.py and predict.py run a
checkpoint in ONNX Runtime through a temporary dynamic-batch ONNX export (BatchNorms folded,
the folder removed) with the results of MindSpore, name the runtime in their output, and
refuse the combinations that cannot work (exit status 2). ResNet-18 at 32 px on real CIFAR-10
images of the shipped sample."""
import importlib
import json
import os
import tempfile

import mindspore as ms
import mindspore.nn as nn
import numpy as np
import pytest

from src.deploy import formats, inference
from src.deploy.formats import model_runtime
from src.models.resnet import create_network
from src.utils import device
from src.utils.cli import run_entry_point

COMMON = ["--config_path", "configs/resnet18_cifar10.yaml", "--eval_image_size", "32",
          "--eval_resize", "32", "--num_parallel_workers", "1"]


@pytest.fixture(scope="module")
def r18_ckpt(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("runtime") / "r18.ckpt")
    ms.save_checkpoint(create_network("resnet18", class_num=10), path)
    return path


@pytest.fixture
def spied(monkeypatch, tmp_path):
    """The entry points with the device context left as is, the temporary folder of the ONNX
    export under ``tmp_path/tmp``, and every network exported for ONNX Runtime recorded
    (whether it still held a BatchNorm, the ``dynamic_batch`` flag)."""
    monkeypatch.setattr(device, "setup_device", lambda *args, **kwargs: None)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    exports = []
    export_model = formats.export_model

    def record(net, dummy, file_name, file_format, dynamic_batch=False):
        exports.append({"batchnorm": any(isinstance(cell, nn.BatchNorm2d)
                                         for _, cell in net.cells_and_names()),
                        "dynamic_batch": dynamic_batch, "format": file_format})
        return export_model(net, dummy, file_name, file_format, dynamic_batch)
    monkeypatch.setattr(formats, "export_model", record)
    return {"exports": exports, "temp": temp}


def test_eval_in_onnxruntime_gives_the_mindspore_results(r18_ckpt, cifar_small, spied,
                                                         tmp_path, capsys):
    evaluation = importlib.import_module("eval")
    results = {}
    for runtime in ("mindspore", "onnxruntime"):
        out = tmp_path / runtime
        assert evaluation.main([*COMMON, "--checkpoint_path", r18_ckpt, "--data_path",
                                cifar_small["test"], "--batch_size", "8",  # 30: last batch 6
                                "--runtime", runtime, "--output_dir", str(out)]) == 0
        printed = capsys.readouterr().out
        results[runtime] = json.load(open(out / "eval_result.json"))
        assert results[runtime]["runtime"] == runtime
        assert f'"runtime": "{runtime}"' in printed
    assert spied["exports"] == [{"batchnorm": False, "dynamic_batch": True, "format": "ONNX"}]
    assert os.listdir(spied["temp"]) == []  # the temporary folder is gone
    ours, theirs = results["onnxruntime"], results["mindspore"]
    for key in ("images", "top1", "top5", "confusion_matrix"):
        assert ours[key] == theirs[key], key
    assert ours["images"] == 30
    assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-5)
    assert [(m["image"], m["predicted"]) for m in ours["misclassified"]] == \
        [(m["image"], m["predicted"]) for m in theirs["misclassified"]]
    np.testing.assert_allclose([m["probability"] for m in ours["misclassified"]],
                               [m["probability"] for m in theirs["misclassified"]], atol=1e-5)


@pytest.mark.slow
def test_predict_in_onnxruntime_gives_the_mindspore_results(r18_ckpt, cifar_small, spied,
                                                            capsys):
    predict = importlib.import_module("predict")
    folder = os.path.join(cifar_small["test"], "ship")
    printed, header = {}, {}
    for runtime in ("mindspore", "onnxruntime"):
        assert predict.main([*COMMON, "--checkpoint_path", r18_ckpt, "--image_path", folder,
                             "--batch_size", "2", "--runtime", runtime]) == 0
        out, err = capsys.readouterr()
        printed[runtime] = [json.loads(line) for line in out.splitlines()]
        header[runtime] = [line for line in err.splitlines() if ", model " in line]
    assert header["onnxruntime"] == [f"predict: 3 images, model {r18_ckpt}, runtime onnxruntime"]
    assert header["mindspore"] == [f"predict: 3 images, model {r18_ckpt}, runtime mindspore"]
    assert len(printed["onnxruntime"]) == 3 and len(spied["exports"]) == 1
    for ours, theirs in zip(printed["onnxruntime"], printed["mindspore"]):
        assert ours["image"] == theirs["image"]
        assert [t["class"] for t in ours["top"]] == [t["class"] for t in theirs["top"]]
        np.testing.assert_allclose([t["probability"] for t in ours["top"]],
                                   [t["probability"] for t in theirs["top"]], atol=2e-6)


def test_the_temporary_folder_goes_also_when_loading_fails(spied, monkeypatch):
    def fail(path):
        raise inference.ModelFileError(f"cannot load ONNX file {path}")

    monkeypatch.setattr(formats, "load_onnx", fail)
    net = create_network("resnet18", class_num=10)
    net.set_train(False)
    with pytest.raises(inference.ModelFileError):
        formats.onnx_of_network(net, (3, 32, 32))
    assert len(spied["exports"]) == 1 and os.listdir(spied["temp"]) == []


@pytest.mark.parametrize("entry, args, message", [
    ("eval", ["--device_target", "GPU"],
     "runtime onnxruntime runs on the CPU (the onnxruntime package of requirements.txt is ONNX "
     "Runtime's CPU build) but device_target is GPU: pass --device_target CPU, or --runtime "
     "mindspore"),
    ("predict", ["--device_target", "Ascend"], "but device_target is Ascend"),
    ("eval", ["--checkpoint_path", "model.mindir"],
     "runtime onnxruntime cannot run checkpoint_path 'model.mindir': a .mindir runs in "
     "MindSpore only"),
    ("predict", ["--checkpoint_path", "model.mindir"], "a .mindir runs in MindSpore only")])
def test_runtime_onnxruntime_where_it_cannot_run_exits_2(entry, args, message, cifar_small,
                                                         spied, capsys):
    module = importlib.import_module(entry)
    with pytest.raises(SystemExit) as stop:  # before any model file is read
        run_entry_point(module.main, [*COMMON, "--checkpoint_path", "model.ckpt", "--runtime",
                                      "onnxruntime", "--data_path", cifar_small["test"],
                                      "--image_path", cifar_small["test"], *args])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_the_runtime_named_is_the_one_that_runs_the_file():
    assert model_runtime("m.onnx", "mindspore") == "onnxruntime"
    assert model_runtime("m.mindir", "mindspore") == "mindspore"
    assert model_runtime("m.ckpt", "onnxruntime") == "onnxruntime"
    assert model_runtime("m.ckpt", "mindspore") == "mindspore"


@pytest.mark.parametrize("runtime", ["mindspore", "onnxruntime"])
def test_the_throughput_mode_without_a_checkpoint_runs_in_the_runtime_asked(runtime, spied,
                                                                          capsys):
    evaluation = importlib.import_module("eval")
    assert evaluation.main([*COMMON, "--batch_size", "2", "--benchmark_steps", "1",
                            "--runtime", runtime]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["runtime"] == runtime and record["mode"] == "benchmark_eval"
    expected = [{"batchnorm": False, "dynamic_batch": True, "format": "ONNX"}]
    assert spied["exports"] == (expected if runtime == "onnxruntime" else [])
