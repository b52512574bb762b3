"""Checkpoint loading: a checkpoint of another depth or class count is named, fine-tuning drops
fc."""
import mindspore as ms
import numpy as np
import pytest

from src.models.resnet import create_network
from src.utils.checkpoint import CheckpointMismatchError, load_into_network


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
