"""Dynamic-batch export (``export.py --dynamic_batch true``, ``src/deploy/exporting.py``): the
ONNX, int8 ONNX and MindIR files declare a symbolic batch in their input and their output, and
eval.py / predict.py run them at any ``--batch_size`` with the logits of the fixed-batch export
(ResNet-18 at 32 px on the shipped CIFAR-10 sample)."""
import importlib
import json
import os

import mindspore as ms
import numpy as np
import onnx
import pytest

import export
from src.data.settings import EvalPreprocess
from src.deploy.formats import declared_batch_dims, load_predictor
from src.deploy.inference import (
    batched,
    list_images,
    load_mindir,
    preprocess_images,
)
from src.models.resnet import create_network
from src.utils import device
from src.utils.cli import run_entry_point
from tests.helpers import CIFAR_SAMPLE

SIZE = ["--eval_image_size", "32", "--eval_resize", "32"]
COMMON = ["--config_path", "configs/resnet18_cifar10.yaml", *SIZE, "--num_parallel_workers", "1"]
EXPORT_BATCH = 2
ATOL = 1e-5  # float32 rounding of the same folded graph (measured: at most 6e-7)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A ResNet-18 checkpoint exported (in-process ``export.main``) at batch 2 as fixed-batch
    ONNX, and with ``--dynamic_batch true`` as ONNX, MINDIR and int8 ONNX (calibrated on 8
    shipped training images)."""
    folder = tmp_path_factory.mktemp("dynamic")
    ckpt = str(folder / "r18.ckpt")
    ms.save_checkpoint(create_network("resnet18", class_num=10), ckpt)
    args = [*COMMON, "--checkpoint_path", ckpt, "--batch_size", str(EXPORT_BATCH)]
    runs = {"fixed.onnx": ["--file_format", "ONNX"],
            "dynamic.onnx": ["--file_format", "ONNX", "--dynamic_batch", "true"],
            "dynamic.mindir": ["--file_format", "MINDIR", "--dynamic_batch", "true"],
            "int8.onnx": ["--file_format", "ONNX", "--dynamic_batch", "true", "--quantize",
                          "int8", "--calibration_data_path", os.path.join(CIFAR_SAMPLE, "train"),
                          "--calibration_images", "8"]}
    paths = {"ckpt": ckpt}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(device, "setup_device", lambda *a, **k: None)  # the context as it is
        for name, extra in runs.items():
            stem = str(folder / os.path.splitext(name)[0])
            assert export.main([*args, *extra, "--file_name", stem]) == 0
            paths[name] = stem + os.path.splitext(name)[1]
    return paths


def sample_images(count=7):
    paths = list_images(os.path.join(CIFAR_SAMPLE, "test", "cat"))[:count]
    return preprocess_images(paths, EvalPreprocess(image_size=32, resize=32))


@pytest.mark.slow
def test_dynamic_files_declare_a_symbolic_batch_in_input_and_output(files):
    assert declared_batch_dims(files["fixed.onnx"]) == (EXPORT_BATCH, EXPORT_BATCH)
    for name in ("dynamic.onnx", "dynamic.mindir", "int8.onnx"):
        assert declared_batch_dims(files[name]) == (None, None), name
    for name in ("dynamic.onnx", "int8.onnx"):
        graph = onnx.load(files[name]).graph
        assert [v.type.tensor_type.shape.dim[0].dim_param for v in (graph.input[0],
                                                                    graph.output[0])] == \
            ["batch", "batch"], name


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dynamic.onnx", "dynamic.mindir"])
def test_any_batch_size_gives_the_logits_of_the_fixed_batch_export(files, name):
    images = sample_images()
    fixed = load_predictor(files["fixed.onnx"], "resnet18", 10, EXPORT_BATCH)(images)
    for batch_size in (3, 7, 1):  # a partial last batch, one batch, one image at a time
        logits = load_predictor(files[name], "resnet18", 10, batch_size)(images)
        np.testing.assert_allclose(logits, fixed, rtol=0, atol=ATOL, err_msg=f"{batch_size}")


@pytest.mark.slow
def test_a_dynamic_mindir_runs_batch_size_after_batch_size_in_one_graph_cell(files):
    # MindSpore 2.10 with the padded CPU stem pool: the 2nd batch size fails in nn.GraphCell
    graph = load_mindir(files["dynamic.mindir"])
    images = sample_images()
    for count in (3, 5, 1, 5):
        assert graph(ms.Tensor(images[:count])).asnumpy().shape == (count, 10)


@pytest.mark.slow
def test_int8_keeps_the_dynamic_batch(files):
    images = sample_images()
    one_run = load_predictor(files["int8.onnx"], "resnet18", 10, 7)(images)
    for batch_size in (3, 1):
        np.testing.assert_allclose(load_predictor(files["int8.onnx"], "resnet18", 10,
                                                  batch_size)(images), one_run, atol=ATOL)


@pytest.mark.slow
def test_eval_and_predict_take_any_batch_size(files, cifar_small, tmp_path, monkeypatch, capsys):
    evaluation, predict = importlib.import_module("eval"), importlib.import_module("predict")
    monkeypatch.setattr(device, "setup_device", lambda *args, **kwargs: None)
    results = {}
    for name, batch_size in (("fixed.onnx", EXPORT_BATCH), ("dynamic.onnx", 7),
                             ("dynamic.mindir", 4)):  # 30 images: last batches of 2 and 2
        out = tmp_path / name
        assert evaluation.main([*COMMON, "--checkpoint_path", files[name], "--data_path",
                                cifar_small["test"], "--batch_size", str(batch_size),
                                "--output_dir", str(out)]) == 0
        results[name] = json.load(open(out / "eval_result.json"))
    capsys.readouterr()
    for name in ("dynamic.onnx", "dynamic.mindir"):
        for key in ("images", "top1", "top5", "confusion_matrix"):
            assert results[name][key] == results["fixed.onnx"][key], (name, key)
        # (the loss is a mean of per-batch means: other batches, another mean)

    folder = os.path.join(cifar_small["test"], "dog")
    printed = {}
    for name, batch_size in (("fixed.onnx", EXPORT_BATCH), ("dynamic.mindir", 3)):
        assert predict.main([*COMMON, "--checkpoint_path", files[name], "--image_path", folder,
                             "--batch_size", str(batch_size)]) == 0
        printed[name] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(printed["fixed.onnx"]) == 3
    for fixed, dynamic in zip(printed["fixed.onnx"], printed["dynamic.mindir"]):
        assert [t["class"] for t in dynamic["top"]] == [t["class"] for t in fixed["top"]]
        np.testing.assert_allclose([t["probability"] for t in dynamic["top"]],
                                   [t["probability"] for t in fixed["top"]], atol=2e-6)


def test_a_symbolic_batch_is_not_padded():
    sizes = []

    def forward(x):
        sizes.append(len(x))
        return x.mean(axis=(2, 3))

    x = np.ones((5, 3, 4, 4), np.float32)
    assert batched(forward, 2, "ONNX", "m.onnx", (None, 3, 4, 4))(x).shape == (5, 3)
    assert batched(forward, 2, "ONNX", "m.onnx", (2, 3, 4, 4))(x).shape == (5, 3)
    assert sizes == [2, 2, 1, 2, 2, 2]  # the fixed batch's last chunk padded to 2


def test_dynamic_batch_air_is_a_config_error(capsys):
    with pytest.raises(SystemExit) as stop:
        run_entry_point(export.main, [*COMMON, "--device_target", "Ascend", "--file_format",
                                      "AIR", "--dynamic_batch", "true", "--checkpoint_path",
                                      "unused.ckpt"])
    assert stop.value.code == 2
    assert "dynamic_batch true needs file_format ONNX or MINDIR (got AIR)" in \
        capsys.readouterr().err


@pytest.mark.parametrize("file_format", ["ONNX", "MINDIR"])
def test_a_fixed_batch_file_is_refused_where_a_dynamic_one_was_asked(tmp_path, file_format):
    """A real ResNet-18 export at 32 px with a fixed batch of 2: ``check_exported`` accepts
    it as it is and refuses it, naming both batch dimensions, when a dynamic batch was
    asked (the check export.py runs after writing); the same network exported with a
    dynamic batch passes."""
    from src.deploy.formats import FORMATS, check_exported, export_model
    from src.utils.errors import WriteError

    dummy = ms.Tensor(np.zeros((EXPORT_BATCH, 3, 32, 32), np.float32))
    suffix = FORMATS[file_format].suffix
    for name, dynamic_batch in (("fixed", False), ("dynamic", True)):
        net = create_network("resnet18", class_num=10)  # one export each, as export.py
        net.set_train(False)
        export_model(net, dummy, str(tmp_path / name), file_format, dynamic_batch)
    fixed, dynamic = (str(tmp_path / f"{name}{suffix}") for name in ("fixed", "dynamic"))
    check_exported(fixed, file_format)
    check_exported(dynamic, file_format, dynamic_batch=True)
    with pytest.raises(WriteError) as refused:
        check_exported(fixed, file_format, dynamic_batch=True)
    assert str(refused.value) == (f"the exported {file_format} file declares a fixed batch "
                                  f"(input 2, output 2) although dynamic_batch is true")
