"""Test-time augmentation (``tta``, ``src/models/tta.py``): the flip-averaged logits against the
image's and its mirror's computed apart; the exported graphs (MindIR, ONNX, int8 ONNX) holding
it and giving eval's numbers, their recorded ``tta`` and its checks; the SAFETENSORS record
read back; bad values named."""
import json
import os

import mindspore as ms
import numpy as np
import onnx
import pytest

from src.data.settings import EvalPreprocess
from src.deploy import formats
from src.deploy.exporting import mindir_metadata, onnx_metadata, record_mindir
from src.deploy.inference import load_mindir, preprocess_images
from src.deploy.publish import model_card, save_hub_folder, timm_config, torchvision_state
from src.deploy.records import read_model_record
from src.models.resnet import create_network
from src.models.tta import TTA_MODES, FlipTTA, inner_network, with_tta
from src.recipe import resolve_model
from src.utils.config import ConfigError, load_schema, parse_config
from src.utils.hub import WeightsConfigError
from src.utils.model_record import RecordError
from tests.helpers import CIFAR_SAMPLE, run_in_process, succeeded

TRAIN = os.path.join(CIFAR_SAMPLE, "train")
TEST = os.path.join(CIFAR_SAMPLE, "test")
IMAGES = 8
COMMON = ["--config_path", "configs/resnet18_cifar10.yaml", "--batch_size", str(IMAGES),
          "--num_parallel_workers", "1"]
EPS = np.finfo(np.float32).eps


@pytest.fixture(scope="module")
def images():
    """``IMAGES`` real test images of the shipped sample, eval-preprocessed at 32x32."""
    paths = sorted(os.path.join(TEST, c, n) for c in sorted(os.listdir(TEST))[:2]
                   for n in sorted(os.listdir(os.path.join(TEST, c)))[:IMAGES // 2])
    return preprocess_images(paths, EvalPreprocess(image_size=32, resize=32))


@pytest.fixture(scope="module")
def network():
    """A ResNet-18 of 10 classes, seeded random weights, in inference mode."""
    ms.set_seed(3)
    net = create_network("resnet18", class_num=10)
    net.set_train(False)
    return net


@pytest.fixture(scope="module")
def checkpoint(network, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tta") / "r18.ckpt")
    ms.save_checkpoint(network, path)
    return path


def float32_tolerance(logits):
    """Float32 rounding of logits of this size through a ResNet: a few ulps of the largest
    one per layer (a BatchNorm folded or a kernel chosen otherwise rounds otherwise)."""
    return 64 * EPS * float(np.abs(logits).max())


def apart(network, images):
    """The mean of the logits of ``images`` and of their mirror images, each a call of its
    own, the mirror made with numpy."""
    plain = network(ms.Tensor(images)).asnumpy()
    mirrored = network(ms.Tensor(np.ascontiguousarray(images[..., ::-1]))).asnumpy()
    return (plain + mirrored) / 2, plain


# ---- the Cell ----

def test_flip_tta_is_the_mean_of_the_image_and_its_mirror_computed_apart(network, images):
    tta = FlipTTA(network)(ms.Tensor(images)).asnumpy()
    expected, plain = apart(network, images)
    assert tta.shape == (IMAGES, 10) and tta.dtype == np.float32
    np.testing.assert_allclose(tta, expected, rtol=0, atol=float32_tolerance(expected))
    assert np.abs(tta - plain).max() > 100 * float32_tolerance(expected)  # the flip counts
    assert [p.name for p in FlipTTA(network).get_parameters()] == [
        p.name for p in network.get_parameters()]  # checkpoint names unchanged


def test_with_tta_and_the_config_choices():
    assert with_tta("net", "none") == "net"
    _, _, choices = load_schema()
    assert tuple(choices["tta"]) == TTA_MODES
    with pytest.raises(ValueError, match="tta must be one of none, flip"):
        with_tta("net", "flop")


def test_eval_and_predict_load_the_checkpoint_with_tta(checkpoint, network, images):
    expected, _ = apart(network, images)
    predict = formats.load_predictor(checkpoint, "resnet18", 10, IMAGES, tta="flip")
    np.testing.assert_allclose(predict(images), expected, rtol=0,
                               atol=float32_tolerance(expected))


def test_runtime_onnxruntime_exports_the_tta_network(network, images, monkeypatch):
    """The .ckpt in ONNX Runtime: the network it exports is the TTA one (what an ONNX export
    of it gives is checked below, on export.py's files)."""
    exported = []
    monkeypatch.setattr(formats, "load_network", lambda *args, **kwargs: network)
    monkeypatch.setattr(formats, "fold_batchnorm", lambda net: 0)  # the fixture is shared
    monkeypatch.setattr(formats, "onnx_of_network",
                        lambda net, shape: exported.append(net) or (lambda x: x[:, :10, 0, 0]))
    for tta in TTA_MODES:
        formats.load_predictor("r18.ckpt", "resnet18", 10, IMAGES, tta=tta,
                               runtime="onnxruntime")(images)
        net = exported.pop()
        assert (type(net), inner_network(net)) == (
            (FlipTTA, network) if tta == "flip" else (type(network), network)), tta


# ---- the recorded tta of exported graphs ----

def onnx_file(path, metadata):
    """A one-node ONNX file (Identity) with ``metadata`` in its ``metadata_props``."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["image"], ["logits"])], "g",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph)
    helper.set_model_props(model, metadata)
    onnx.save(model, str(path))
    return str(path)


def config_of(*args):
    return parse_config([*COMMON, *[str(a) for a in args]])


def resolve_tta(cfg):
    """The ``tta`` a run of ``cfg`` uses: its resolved model's (``resolve_model``)."""
    return resolve_model(cfg).tta


def recorded_tta(path):
    """The ``tta`` the model file ``path`` records (None: it records none)."""
    return read_model_record(path).tta


def test_an_exported_graph_runs_with_its_recorded_tta(tmp_path):
    flip = onnx_file(tmp_path / "flip.onnx", {"tta": "flip"})
    old = onnx_file(tmp_path / "old.onnx", {})  # exported before tta was recorded
    assert recorded_tta(flip) == "flip" and recorded_tta(old) == "none"
    assert resolve_tta(config_of("--checkpoint_path", flip)) == "flip"
    assert resolve_tta(config_of("--checkpoint_path", flip, "--tta", "flip")) == "flip"
    with pytest.raises(ConfigError, match=f"tta none: {flip} was exported with tta flip"):
        resolve_tta(config_of("--checkpoint_path", flip, "--tta", "none"))
    with pytest.raises(ConfigError, match="export the checkpoint again with --tta flip"):
        resolve_tta(config_of("--checkpoint_path", old, "--tta", "flip"))
    bad = onnx_file(tmp_path / "bad.onnx", {"tta": "rotate"})
    with pytest.raises(RecordError, match="tta 'rotate' is not one of"):
        resolve_tta(config_of("--checkpoint_path", bad))
    assert recorded_tta(str(tmp_path / "r18.ckpt")) is None  # weights: tta applies


def test_eval_refuses_a_tta_the_graph_does_not_hold(tmp_path):
    flip = onnx_file(tmp_path / "flip.onnx", {"tta": "flip"})
    result = run_in_process("eval.py", *COMMON, "--checkpoint_path", flip, "--tta", "none",
                            "--data_path", TEST, "--output_dir", tmp_path / "out")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"error: tta none: {flip} was exported with tta flip" in result.stderr


def test_mindir_user_info_is_written_and_read_back(tmp_path):
    net = ms.nn.Dense(3, 2)
    x = ms.Tensor(np.ones((1, 3), np.float32))
    ms.export(net, x, file_name=str(tmp_path / "dense"), file_format="MINDIR")
    path = str(tmp_path / "dense.mindir")
    assert recorded_tta(path) == "none"
    record_mindir(path, {"tta": "flip"})
    assert mindir_metadata(path) == {"tta": "flip"}
    assert recorded_tta(path) == "flip"
    np.testing.assert_array_equal(load_mindir(path)(x).asnumpy(), net(x).asnumpy())


@pytest.mark.parametrize("args,message", [
    (["--tta", "foo"], "tta"),
    (["--tta", "Flip"], "tta"),
])
def test_bad_tta_values_name_the_key(args, message, tmp_path):
    result = run_in_process("predict.py", *COMMON, "--checkpoint_path", tmp_path / "m.ckpt",
                            "--image_path", TEST, *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "error:" in result.stderr and message in result.stderr and "flip" in result.stderr


# ---- SAFETENSORS: config.json records it ----

def hub_folder(network, folder, tta):
    config = timm_config("resnet18", 10, EvalPreprocess(image_size=32, resize=32), tta=tta)
    save_hub_folder(str(folder), torchvision_state(network), config,
                    model_card("r18", config, "r18.ckpt"))
    return str(folder)


def test_safetensors_folder_records_tta_and_eval_takes_it_unless_set(network, tmp_path):
    flip = hub_folder(network, tmp_path / "flip", "flip")
    with open(os.path.join(flip, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert config["tta"] == "flip" and "tta" not in config["pretrained_cfg"]  # timm ignores it
    with open(os.path.join(flip, "README.md"), encoding="utf-8") as f:
        assert "Test-time augmentation: flip" in f.read()
    assert resolve_tta(config_of("--checkpoint_path", flip)) == "flip"
    assert resolve_tta(config_of("--checkpoint_path", flip, "--tta", "none")) == "none"
    plain = hub_folder(network, tmp_path / "plain", "none")
    with open(os.path.join(plain, "config.json"), encoding="utf-8") as f:
        assert "tta" not in json.load(f)
    assert resolve_tta(config_of("--checkpoint_path", plain)) == "none"
    assert resolve_tta(config_of("--checkpoint_path", plain, "--tta", "flip")) == "flip"
    config["tta"] = "mirror"
    with open(os.path.join(flip, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    with pytest.raises(WeightsConfigError, match="config.json field tta is 'mirror'"):
        resolve_tta(config_of("--checkpoint_path", flip))


# ---- export.py --tta flip: the graph holds it ----

@pytest.fixture(scope="module")
def exported(checkpoint, tmp_path_factory):
    """``checkpoint`` exported with ``--tta flip``: MindIR, ONNX (dynamic batch), int8 ONNX
    (calibrated on 16 shipped training images) and SAFETENSORS."""
    folder = tmp_path_factory.mktemp("exported")
    args = [*COMMON, "--checkpoint_path", checkpoint, "--tta", "flip"]
    files = {}
    for name, extra in {"MINDIR": ["--file_format", "MINDIR"],
                        "ONNX": ["--file_format", "ONNX", "--dynamic_batch", "true"],
                        "INT8": ["--file_format", "ONNX", "--quantize", "int8",
                                 "--calibration_data_path", TRAIN, "--calibration_images", "16"],
                        "SAFETENSORS": ["--file_format", "SAFETENSORS"]}.items():
        result = succeeded(run_in_process("export.py", *args, *extra,
                                          "--file_name", folder / name.lower()))
        files[name] = str(folder / name.lower()) + formats.FORMATS[extra[1]].suffix
        assert "test-time augmentation flip in the graph" in result.stdout or \
            name == "SAFETENSORS"
    return files


@pytest.mark.slow
@pytest.mark.parametrize("name", ["MINDIR", "ONNX"])
def test_the_exported_graph_gives_evals_tta_logits(exported, name, network, images):
    expected, _ = apart(network, images)
    assert recorded_tta(exported[name]) == "flip"
    graph = formats.load_predictor(exported[name], "resnet18", 10, IMAGES)  # as exported
    np.testing.assert_allclose(graph(images), expected, rtol=0,
                               atol=float32_tolerance(expected))


@pytest.mark.slow
def test_the_int8_graph_holds_the_flip_and_follows_the_float_tta(exported, network, images):
    from tests.test_quantize import MIN_MEAN_COSINE

    model = onnx.load(exported["INT8"])
    assert json.loads(onnx_metadata(model)["model_record"])["tta"] == "flip"
    assert sum(node.op_type == "Conv" for node in model.graph.node) == 2 * 20  # both branches
    expected, _ = apart(network, images)
    int8 = formats.load_predictor(exported["INT8"], "resnet18", 10, IMAGES)(images)
    cosine = (int8 * expected).sum(1) / np.linalg.norm(int8, axis=1) / np.linalg.norm(
        expected, axis=1)
    assert cosine.mean() > MIN_MEAN_COSINE, cosine


@pytest.mark.slow
def test_the_published_folder_is_evaluated_with_its_tta(exported, network, images):
    with open(os.path.join(exported["SAFETENSORS"], "config.json"), encoding="utf-8") as f:
        assert json.load(f)["tta"] == "flip"
    cfg = config_of("--checkpoint_path", exported["SAFETENSORS"])
    predict = formats.load_predictor(exported["SAFETENSORS"], "resnet18", 10, IMAGES,
                                     tta=resolve_tta(cfg))
    expected, _ = apart(network, images)
    np.testing.assert_allclose(predict(images), expected, rtol=0,
                               atol=float32_tolerance(expected))
