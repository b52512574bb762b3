"""MindCV's ResNet checkpoints as a starting point, checked against MindCV itself (mindcv 0.3.0,
a dev dependency as torch): its names are renamed on loading (``SOURCE_LAYOUTS`` in
``src/utils/checkpoint.py``) and ``stem_pool_pad_mode same`` gives the logits of MindCV's own
network, in MindSpore, in eval.py and in an ONNX export; its training state is dropped."""
import importlib
import json
import logging
import os

import mindspore as ms
import mindspore.nn as nn
import numpy as np
import pytest
from mindspore.nn.utils import no_init_parameters

try:
    from mindcv.models import create_model
    from mindcv.optim import create_optimizer
    from mindcv.utils.train_step import TrainStep
except ImportError as err:  # a dev dependency like torch: a missing one fails, never skips
    raise ImportError("tests/test_mindcv.py checks against MindCV itself: install the dev "
                      "requirements (pip install -r requirements-dev.txt, mindcv==0.3.0)"
                      ) from err

from src.data.pipeline import image_folder_files
from src.data.settings import EvalPreprocess
from src.deploy.inference import load_onnx, preprocess_images
from src.deploy.outputs import softmax
from src.models.resnet import create_network
from src.utils import device
from src.utils.checkpoint import (
    CONFIG_KEY,
    CheckpointMismatchError,
    load_into_network,
    source_layout,
)
from tests.helpers import CIFAR_SAMPLE, slow_beyond

SIZE = 32  # the CIFAR-10 sample's size: the stem's output (16) is even, where the pools differ
QUICK = ["--config_path", "configs/quick_start.yaml", "--stem_pool_pad_mode", "same"]


def sample_images(count=16):
    """Real CIFAR-10 test images of the shipped sample, taken over the classes."""
    root = os.path.join(CIFAR_SAMPLE, "test")
    paths = [os.path.join(root, c, f) for c in sorted(os.listdir(root))
             for f in sorted(os.listdir(os.path.join(root, c)))[:2]]
    return paths[:count]


def mindcv_network(name, class_num=10, seed=0):
    """MindCV's own ResNet in eval mode. ``pretrained=False``: nothing is downloaded; its
    BatchNorm statistics and affine parameters and its classifier bias are randomized (at
    init they are 0 and 1, which would hide a mix-up of the four BatchNorm tensors)."""
    net = create_model(name, num_classes=class_num, pretrained=False)
    rng = np.random.default_rng(seed)
    draws = {"moving_variance": lambda n: rng.uniform(0.5, 2.0, n),
             "gamma": lambda n: rng.uniform(0.5, 1.5, n),
             "moving_mean": lambda n: rng.normal(0.0, 0.1, n),
             "beta": lambda n: rng.normal(0.0, 0.1, n), "bias": lambda n: rng.normal(0.0, 0.1, n)}
    for param in net.get_parameters():
        kind = param.name.rsplit(".", 1)[-1]
        if kind in draws:
            param.set_data(ms.Tensor(draws[kind](param.shape).astype(np.float32)))
    net.set_train(False)
    return net


@pytest.fixture
def checkpoint_log(caplog, monkeypatch):
    """The log lines of ``src.utils.checkpoint`` (an entry point run in-process earlier stops
    the ``src`` loggers' propagation to pytest's handler: restored for the test)."""
    monkeypatch.setattr(logging.getLogger("src"), "propagate", True)
    caplog.set_level(logging.INFO, logger="src.utils.checkpoint")
    return caplog


@pytest.fixture(scope="module")
def images():
    return preprocess_images(sample_images(), EvalPreprocess(image_size=SIZE, resize=SIZE))


@pytest.fixture(scope="module")
def mindcv_r18(tmp_path_factory, images):
    """A MindCV ResNet-18 (10 classes) saved with ``mindspore.save_checkpoint``, and its own
    logits on the sample images."""
    net = mindcv_network("resnet18")
    path = str(tmp_path_factory.mktemp("mindcv") / "mindcv_resnet18.ckpt")
    ms.save_checkpoint(net, path)
    return {"net": net, "path": path, "logits": net(ms.Tensor(images)).asnumpy()}


def our_logits(name, path, images, pad_mode, **kwargs):
    """Our network's logits with the checkpoint ``path`` loaded (its weights are not drawn at
    build time: the strict load replaces every one, or raises)."""
    with no_init_parameters():
        net = create_network(name, class_num=10, stem_pool_pad_mode=pad_mode)
    load_into_network(net, path, **kwargs)
    net.set_train(False)
    return net(ms.Tensor(images)).asnumpy()


@pytest.mark.parametrize("name,renamed", slow_beyond([("resnet18", 17), ("resnet50", 22)],
                                                     ("resnet18",)))
def test_mindcv_checkpoint_gives_mindcv_logits_with_pad_mode_same(name, renamed, images,
                                                                  tmp_path, checkpoint_log):
    """Renamed (classifier -> fc, down_sample -> downsample; 2 + 3 or 4 projections of 5
    tensors) and loaded as --pre_trained / --checkpoint_path load it, the weights give
    MindCV's logits with MindCV's stem pool; with torchvision's (``pad``) other ones."""
    net = mindcv_network(name, seed=1)
    path = str(tmp_path / f"{name}.ckpt")
    ms.save_checkpoint(net, path)
    want = net(ms.Tensor(images)).asnumpy()
    same = our_logits(name, path, images, "same")
    np.testing.assert_allclose(same, want, rtol=1e-5, atol=1e-5)
    lines = [r.getMessage() for r in checkpoint_log.records if "MindCV" in r.getMessage()]
    assert lines == [f"MindCV checkpoint {path}: renamed classifier -> fc, down_sample -> "
                     f"downsample ({renamed} tensors)"]
    pad = our_logits(name, path, images, "pad")
    assert np.abs(pad - want).max() > 1e-2 * np.abs(want).max()  # the key matters


def test_pool_warning_names_the_key_to_pass(mindcv_r18, images, tmp_path, checkpoint_log):
    our_logits("resnet18", mindcv_r18["path"], images, "same")
    assert not [r for r in checkpoint_log.records if r.levelno >= logging.WARNING]
    our_logits("resnet18", mindcv_r18["path"], images, "pad")
    [warning] = [r.getMessage() for r in checkpoint_log.records if r.levelno >= logging.WARNING]
    assert "trained with stem_pool_pad_mode same" in warning
    assert "--stem_pool_pad_mode same" in warning
    # our own training checkpoints: the run config stored in them says which pool
    ours = str(tmp_path / "ours.ckpt")
    ms.save_checkpoint(create_network("resnet18", class_num=10, stem_pool_pad_mode="same"), ours,
                       append_dict={CONFIG_KEY: json.dumps({"stem_pool_pad_mode": "same"})})
    checkpoint_log.clear()
    our_logits("resnet18", ours, images, "same")
    assert not [r for r in checkpoint_log.records if r.levelno >= logging.WARNING]
    our_logits("resnet18", ours, images, "pad")
    assert [r for r in checkpoint_log.records if r.levelno >= logging.WARNING]


def test_mindcv_training_checkpoint_drops_its_state_and_keeps_its_ema(tmp_path, images,
                                                                      checkpoint_log):
    """A checkpoint as MindCV's training saves it (the train step cell: Momentum's moments,
    global_step, learning_rate, scale_sense, TrainStep's EMA weights and update count
    ``updates``) loads; ``use_ema`` takes MindCV's ``ema.`` weights."""
    net = mindcv_network("resnet18", seed=2)
    optimizer = create_optimizer(net.trainable_params(), opt="momentum", lr=0.1)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    step = TrainStep(nn.WithLossCell(net, loss), optimizer, scale_sense=ms.Tensor(1.0), ema=True)
    ema = {p.name: p for p in step.get_parameters() if p.name.startswith("ema.")}
    ema["ema.classifier.weight"].set_data(ms.Tensor(np.full((10, 512), 0.01, np.float32)))
    path = str(tmp_path / "mindcv_train.ckpt")
    ms.save_checkpoint(step, path)
    assert {"updates", "global_step", "learning_rate", "moments.classifier.weight",
            "ema.layer2.0.down_sample.0.weight"} <= set(ms.load_checkpoint(path))

    live = create_network("resnet18", class_num=10, stem_pool_pad_mode="same")
    assert load_into_network(live, path) == ([], False)
    live.set_train(False)
    np.testing.assert_allclose(live(ms.Tensor(images)).asnumpy(),
                               net(ms.Tensor(images)).asnumpy(), rtol=1e-5, atol=1e-5)
    [line] = [r.getMessage() for r in checkpoint_log.records if "MindCV" in r.getMessage()][:1]
    assert "dropped" in line and "updates" in line and "moments.*" in line

    averaged = create_network("resnet18", class_num=10, stem_pool_pad_mode="same")
    assert load_into_network(averaged, path, use_ema=True) == ([], True)
    np.testing.assert_array_equal(averaged.fc.weight.asnumpy(), 0.01)


def test_pre_trained_mindcv_checkpoint_into_another_class_count(mindcv_r18):
    """train.py --pre_trained: the classifier of another class count is dropped (names in our
    terms), everything else loads; strict loading names the mismatch."""
    from src import recipe
    from src.utils.config import parse_config

    cfg = parse_config([*QUICK, "--class_num", "7", "--pre_trained", mindcv_r18["path"]],
                       description="test", sections=recipe.TRAIN_SECTIONS)
    net = recipe.build_network(cfg, 1, logging.getLogger("test"))
    assert net.stem_pool_pad_mode == "same"
    np.testing.assert_array_equal(net.layer4[1].bn2.moving_mean.asnumpy(),
                                  mindcv_r18["net"].layer4[1].bn2.moving_mean.asnumpy())
    np.testing.assert_array_equal(net.layer2[0].downsample[0].weight.asnumpy(),
                                  mindcv_r18["net"].layer2[0].down_sample[0].weight.asnumpy())
    assert net.fc.weight.shape == (7, 512)
    with pytest.raises(CheckpointMismatchError, match=r"shape mismatch: fc\.weight"):
        load_into_network(create_network("resnet18", class_num=7), mindcv_r18["path"])


def test_mismatch_after_renaming_is_the_clear_error(mindcv_r18):
    with pytest.raises(CheckpointMismatchError, match=r"missing in checkpoint: layer1\.2\."):
        load_into_network(create_network("resnet34", class_num=10), mindcv_r18["path"])


def test_layout_is_recognised_by_names_only_mindcv_uses(mindcv_r18):
    ours = {p.name: p for p in create_network("resnet18", class_num=10).get_parameters()}
    assert source_layout(ours) is None
    assert source_layout(ms.load_checkpoint(mindcv_r18["path"])) == "MindCV"
    mixed = dict(ours, **{"classifier.weight": ours["fc.weight"]})  # neither: left as is
    assert source_layout(mixed) is None


def test_eval_on_a_mindcv_checkpoint(mindcv_r18, cifar_small, tmp_path, capsys, monkeypatch):
    """eval.py --checkpoint_path MINDCV.ckpt --stem_pool_pad_mode same (in-process): the
    probabilities it reports are MindCV's own network's."""
    evaluation = importlib.import_module("eval")
    monkeypatch.setattr(device, "setup_device", lambda *args, **kwargs: None)  # set once
    assert evaluation.main([*QUICK, "--checkpoint_path", mindcv_r18["path"], "--data_path",
                            cifar_small["test"], "--output_dir", str(tmp_path)]) == 0
    assert "MindCV checkpoint" in capsys.readouterr().out
    result = json.load(open(tmp_path / "eval_result.json"))
    files = image_folder_files(cifar_small["test"])
    assert result["images"] == len(files) == 30
    probs = softmax(mindcv_r18["net"](ms.Tensor(preprocess_images(
        [path for path, _ in files], EvalPreprocess(image_size=SIZE, resize=SIZE)))).asnumpy())
    labels = np.array([label for _, label in files])
    assert result["top1"] == pytest.approx(float((probs.argmax(1) == labels).mean()))
    index = {path: i for i, (path, _) in enumerate(files)}
    wrong = result["misclassified"]
    assert wrong
    for item in wrong:
        row = probs[index[item["image"]]]
        assert item["predicted"] == row.argmax()
        assert item["probability"] == pytest.approx(row.max(), abs=2e-5)


@pytest.mark.slow
def test_onnx_export_of_a_mindcv_checkpoint_gives_mindspore_logits(mindcv_r18, images,
                                                                   tmp_path, monkeypatch):
    """export.py --stem_pool_pad_mode same --file_format ONNX (in-process): ONNX Runtime gives
    the logits of MindCV's network in MindSpore (the 'same' pool is exported as such)."""
    export = importlib.import_module("export")
    monkeypatch.setattr(device, "setup_device", lambda *args, **kwargs: None)  # set once
    name = str(tmp_path / "mindcv_r18")
    assert export.main([*QUICK, "--checkpoint_path", mindcv_r18["path"], "--file_format",
                        "ONNX", "--file_name", name, "--batch_size", str(len(images)),
                        "--eval_image_size", str(SIZE), "--fold_bn", "false"]) == 0
    forward, _ = load_onnx(name + ".onnx")
    np.testing.assert_allclose(forward(images), mindcv_r18["logits"], rtol=1e-4, atol=1e-4)
