"""Checkpoint loading: a checkpoint of another depth or class count is named, fine-tuning drops
fc."""
import os

import mindspore as ms
import numpy as np
import pytest

from src.models.resnet import create_network
from src.utils.checkpoint import CheckpointMismatchError, load_into_network, remove_stale_partials

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def r18_ckpt(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ckpt") / "r18.ckpt")
    ms.save_checkpoint(create_network("resnet18", class_num=10), path)
    return path


def test_round_trip_loads_every_parameter(r18_ckpt):
    net = create_network("resnet18", class_num=10)
    assert load_into_network(net, r18_ckpt) == ([], False)
    saved = ms.load_checkpoint(r18_ckpt)
    np.testing.assert_array_equal(net.fc.weight.asnumpy(), saved["fc.weight"].asnumpy())


def test_other_class_count_names_fc(r18_ckpt):
    with pytest.raises(CheckpointMismatchError, match=r"fc.weight: checkpoint \(10, 512\) vs "
                                                     r"network \(5, 512\)"):
        load_into_network(create_network("resnet18", class_num=5), r18_ckpt)


def test_other_depth_names_missing_parameters(r18_ckpt):
    with pytest.raises(CheckpointMismatchError, match="missing in checkpoint: .*layer1.2"):
        load_into_network(create_network("resnet34", class_num=10), r18_ckpt)


def test_fine_tuning_drops_only_the_classifier(r18_ckpt):
    net = create_network("resnet18", class_num=3)
    fresh_fc = net.fc.weight.asnumpy().copy()
    dropped, _ = load_into_network(net, r18_ckpt, drop_mismatched_classifier=True)
    assert sorted(dropped) == ["fc.bias", "fc.weight"]
    np.testing.assert_array_equal(net.fc.weight.asnumpy(), fresh_fc)
    saved = ms.load_checkpoint(r18_ckpt)
    np.testing.assert_array_equal(net.layer2[0].conv1.weight.asnumpy(),
                                  saved["layer2.0.conv1.weight"].asnumpy())


def test_missing_and_corrupt_files_are_named(tmp_path):
    net = create_network("resnet18", class_num=10)
    with pytest.raises(FileNotFoundError, match="nope.ckpt"):
        load_into_network(net, str(tmp_path / "nope.ckpt"))
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="bad.ckpt"):
        load_into_network(net, str(bad))


FULL_DISK_SAVE = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))  # a disk that fills up
from src.models.resnet import create_network
from src.utils.checkpoint import atomic_save_checkpoint
try:
    atomic_save_checkpoint(create_network("resnet18", class_num=10), sys.argv[1])
except (OSError, RuntimeError) as err:
    print("failed:", type(err).__name__)
"""


def test_a_failed_save_leaves_no_temporary_file(tmp_path):
    # mindspore.save_checkpoint writes NAME.partial.tmp, renamed to our NAME.partial.ckpt
    import subprocess
    import sys
    target = tmp_path / "resnet18-1_10.ckpt"
    result = subprocess.run([sys.executable, "-c", FULL_DISK_SAVE, str(target)], text=True,
                            capture_output=True, cwd=ROOT, timeout=300)
    assert "failed:" in result.stdout, result.stderr[-2000:]
    assert os.listdir(tmp_path) == []


def test_stale_temporary_files_of_this_run_are_removed_and_others_kept(tmp_path):
    names = ["resnet18-2_5.partial.ckpt", "resnet18-2_5.partial.tmp",
             "resnet18-best.partial.tmp", "resnet50-1_1.partial.tmp", "notes.partial.tmp",
             "resnet18-1_5.ckpt"]
    for name in names:
        (tmp_path / name).write_text("x")
    removed = remove_stale_partials(str(tmp_path), "resnet18")
    assert sorted(os.path.basename(p) for p in removed) == names[:3]
    assert sorted(os.listdir(tmp_path)) == sorted(names[3:])
