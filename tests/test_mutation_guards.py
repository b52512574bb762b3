"""Tests written for bugs that the rest of the suite let through (each was put into the code on
purpose and survived): the split's seed, frozen stages' BatchNorm statistics, the export's
load-back check before the rename."""
import os
import subprocess
import sys

import mindspore as ms
import mindspore.nn as nn
import numpy as np
import pytest

from src.models.freeze import set_trainable_layers
from src.models.resnet import create_network
from src.utils.checkpoint import atomic_save_checkpoint
from tests.helpers import ROOT

SPLIT_CODE = """
from src.data.split import stratified_split
labels = [i % 3 for i in range(30)]
train, val = stratified_split(labels, 0.3, 7, ["cat", "dog", "bird"])
print(list(map(int, val)))
"""


def test_split_is_the_same_under_any_python_hash_seed():
    """The split is a function of (seed, class names) alone: Python's ``hash`` of a string is
    salted per process (PYTHONHASHSEED), so a split seeded with it changes between runs."""
    outputs = set()
    for hash_seed in ("1", "2", "3"):
        result = subprocess.run([sys.executable, "-c", SPLIT_CODE], cwd=ROOT, check=True,
                                capture_output=True, text=True,
                                env=dict(os.environ, PYTHONHASHSEED=hash_seed))
        outputs.add(result.stdout.strip())
    assert len(outputs) == 1, outputs


def test_frozen_stages_keep_their_batchnorm_statistics_without_freeze_bn():
    """trainable_layers 2, freeze_bn false: the frozen stages (conv1, layer1, layer2) use and
    keep their running statistics through training steps, bit for bit; the stages that train
    update theirs."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = create_network("resnet18", 10)
    set_trainable_layers(net, 2, freeze_bn=False)
    stats = {p.name: p.asnumpy().copy() for p in net.get_parameters()
             if p.name.endswith((".moving_mean", ".moving_variance"))}
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(
        sparse=True, reduction="mean")), nn.Momentum(net.trainable_params(), 0.01, 0.9))
    step.set_train()
    rng = np.random.default_rng(0)
    for _ in range(2):
        step(ms.Tensor(rng.standard_normal((4, 3, 32, 32)).astype(np.float32) * 2 + 1),
             ms.Tensor(rng.integers(0, 10, 4).astype(np.int32)))
    after = {p.name: p.asnumpy() for p in net.get_parameters() if p.name in stats}
    frozen = [n for n in stats if n.startswith(("bn1.", "layer1.", "layer2."))]
    trained = [n for n in stats if n.startswith(("layer3.", "layer4."))]
    assert frozen and trained
    for name in frozen:
        assert after[name].tobytes() == stats[name].tobytes(), name
    assert all(not np.array_equal(after[n], stats[n]) for n in trained)


EXPORT_WRITING_GARBAGE = """
import runpy, sys
import src.env
import src.deploy.exporting as exporting

def unloadable(net, dummy, file_name, file_format, dynamic_batch=False):
    with open(file_name + exporting.SUFFIXES[file_format], "wb") as f:
        f.write(b"not a model")

exporting.export_model = unloadable
sys.argv = ["export.py"] + sys.argv[1:]
runpy.run_path("export.py", run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.parametrize("file_format, suffix", [("ONNX", ".onnx"), ("MINDIR", ".mindir")])
def test_an_unloadable_export_never_replaces_the_earlier_file(tmp_path, file_format, suffix):
    """The exported file is loaded back before it is renamed over the earlier one: an exporter
    that writes a file nothing can load leaves the earlier file as it was (exit 4)."""
    ckpt = str(tmp_path / "r18.ckpt")
    atomic_save_checkpoint(create_network("resnet18", 10), ckpt)
    earlier = tmp_path / f"model{suffix}"
    earlier.write_bytes(b"the earlier export")
    result = subprocess.run(
        [sys.executable, "-c", EXPORT_WRITING_GARBAGE, "--checkpoint_path", ckpt, "--net_name",
         "resnet18", "--class_num", "10", "--file_format", file_format, "--file_name",
         str(tmp_path / "model"), "--eval_image_size", "32", "--batch_size", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 4, result.stderr[-2000:]
    assert "does not load back" in result.stderr
    assert earlier.read_bytes() == b"the earlier export"
    assert sorted(os.listdir(tmp_path)) == ["model" + suffix, "r18.ckpt"]
