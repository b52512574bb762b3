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
from tests.helpers import ROOT, run_in_process

# src.data.split imported without its package's __init__ and src.data.pipeline (both load
# MindSpore, 1.5 s of each interpreter): stratified_split takes labels and calls neither; the
# two names split.py imports from the pipeline fail if called.
SPLIT_CODE = """
import os, sys, types
package = types.ModuleType("src.data")
package.__path__ = [os.path.join("src", "data")]
pipeline = types.ModuleType("src.data.pipeline")
def not_for_the_split(*args):
    raise AssertionError("stratified_split reads no folder")
pipeline.class_names_of = pipeline.image_folder_files = not_for_the_split
sys.modules.update({"src.data": package, "src.data.pipeline": pipeline})
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
    net = create_network("resnet18", class_num=10)
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


@pytest.mark.slow
@pytest.mark.parametrize("file_format, suffix", [("ONNX", ".onnx"), ("MINDIR", ".mindir")])
def test_an_unloadable_export_never_replaces_the_earlier_file(tmp_path, monkeypatch,
                                                               file_format, suffix):
    """The exported file is loaded back before it is renamed over the earlier one: an exporter
    that writes a file nothing can load leaves the earlier file as it was (exit 4)."""
    from src.deploy import formats
    from src.deploy.formats import SUFFIXES

    def unloadable(net, dummy, file_name, file_format, dynamic_batch=False):
        del net, dummy, dynamic_batch
        with open(file_name + SUFFIXES[file_format], "wb") as f:
            f.write(b"not a model")

    monkeypatch.setattr(formats, "export_model", unloadable)
    ckpt = str(tmp_path / "r18.ckpt")
    atomic_save_checkpoint(create_network("resnet18", class_num=10), ckpt)
    earlier = tmp_path / f"model{suffix}"
    earlier.write_bytes(b"the earlier export")
    result = run_in_process(
        "export.py", "--checkpoint_path", ckpt, "--net_name", "resnet18", "--class_num", "10",
        "--file_format", file_format, "--file_name", tmp_path / "model", "--eval_image_size",
        "32", "--batch_size", "1")
    assert result.returncode == 4, result.stderr[-2000:]
    assert "does not load back" in result.stderr
    assert earlier.read_bytes() == b"the earlier export"
    assert sorted(os.listdir(tmp_path)) == ["model" + suffix, "r18.ckpt"]


def test_sixteen_bit_pixels_keep_their_high_byte_and_eval_equals_predict_when_resizing(
        tmp_path):
    """A 16-bit greyscale PNG whose low bytes differ from its high bytes decodes to the high
    bytes in training (OpenCV), eval and predict alike (a decoder keeping the low byte gives
    other pixels); predict's preprocessing equals the eval pipeline's with a resize that
    changes the size (and a crop that crops)."""
    import io

    import mindspore.dataset.vision as vision
    from PIL import Image

    from src.data.pipeline import create_dataset
    from src.data.settings import EvalPreprocess
    from src.data.transforms import decode_rgb
    from src.deploy.inference import preprocess_images

    rng = np.random.default_rng(1)
    high = rng.integers(0, 256, (48, 40)).astype(np.uint16)
    low = (255 - high) ^ 0x5A
    buffer = io.BytesIO()
    Image.fromarray(high * 256 + low).save(buffer, format="PNG")
    raw = np.frombuffer(buffer.getvalue(), np.uint8)
    expected = np.repeat(high.astype(np.uint8)[:, :, None], 3, axis=2)
    train = vision.RandomCropDecodeResize((48, 40), scale=(1.0, 1.0), ratio=(40 / 48, 40 / 48))
    np.testing.assert_array_equal(np.asarray(decode_rgb(raw)), expected)
    np.testing.assert_array_equal(train(raw), expected)
    folder = tmp_path / "a"
    folder.mkdir()
    (folder / "image.png").write_bytes(buffer.getvalue())
    data = create_dataset(str(tmp_path), EvalPreprocess(image_size=24, resize=33), batch_size=1,
                          num_parallel_workers=1)
    images = next(data.create_tuple_iterator(num_epochs=1, output_numpy=True))[0]
    np.testing.assert_array_equal(preprocess_images(
        [str(folder / "image.png")], EvalPreprocess(image_size=24, resize=33)),
                                  images)


@pytest.mark.slow
def test_the_output_folder_stays_locked_while_train_py_trains(tmp_path, cifar_small):
    """While train.py trains, another process cannot take its output folder's lock (a run
    that dropped its lock after taking it would let a second run write into the folder)."""
    import time

    from src.training.output_dir import OutputDirLock
    from src.utils.errors import OutputDirError

    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "train.py"), "--config_path",
         "configs/quick_start.yaml", "--data_path", cifar_small["train"], "--eval_data_path",
         cifar_small["test"], "--epoch_size", "40", "--batch_size", "8", "--output_dir",
         str(out), "--num_parallel_workers", "1"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not (out / "metrics.jsonl").exists():  # an epoch done: training, lock taken
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            assert time.time() < deadline, "no epoch finished in 300 s"
            time.sleep(0.5)
        with pytest.raises(OutputDirError, match="in use by another run"):
            OutputDirLock(str(out)).acquire()
        assert proc.poll() is None, "train.py ended before the lock was tried"
    finally:
        proc.kill()
        proc.wait()
