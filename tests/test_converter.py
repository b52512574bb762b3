"""tools/convert_torch_checkpoint.py: torchvision .pth <-> MindSpore .ckpt, by name, bit-exact."""
import contextlib
import io
import json
import os
import subprocess
import sys
import types

import mindspore as ms
import numpy as np
import pytest
import torch

from src.models.resnet import NETWORK_REGISTRY, create_network
from src.utils.checkpoint import load_into_network
from tests.helpers import CIFAR_SAMPLE, ROOT, run_in_process, slow_beyond, succeeded
from tests.torch_resnet import torch_resnet
from tools import convert_torch_checkpoint
from tools.convert_torch_checkpoint import (
    ConversionError,
    ms_to_torch_names,
    torch_state_to_ms_arrays,
    torch_to_ms_names,
)

TOOL = os.path.join(ROOT, "tools", "convert_torch_checkpoint.py")


def run_tool(*args):
    """The converter's ``main`` on ``args`` in this process: ``returncode`` (what the command
    line exits with: ``sys.exit(main())``), ``stdout`` and ``stderr``. The command line itself
    (a fresh interpreter) is run by ``test_bad_suffix_and_missing_input``."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = convert_torch_checkpoint.main([str(a) for a in args])
    return types.SimpleNamespace(returncode=status, stdout=out.getvalue(), stderr=err.getvalue())


def run_tool_command(*args):
    """``python tools/convert_torch_checkpoint.py args`` in a fresh interpreter."""
    return subprocess.run([sys.executable, TOOL, *map(str, args)], capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.mark.parametrize("name", slow_beyond(NETWORK_REGISTRY, ("resnet18", "resnet34")))
def test_every_depth_maps_onto_our_network(name):
    """Names and shapes only: neither network's weights are initialized (torch's allocated
    uninitialized from the meta device, ours under ``no_init_parameters``)."""
    from mindspore.nn.utils import no_init_parameters

    with torch.device("meta"):
        tnet = torch_resnet(name, 7)
    state = tnet.to_empty(device="cpu").state_dict()
    arrays = torch_state_to_ms_arrays(state)
    with no_init_parameters():
        ours = {p.name: tuple(p.shape) for p in create_network(name, class_num=7).get_parameters()}
    assert {n: a.shape for n, a in arrays.items()} == ours
    bn_count = sum(k.endswith("num_batches_tracked") for k in state)
    assert len(arrays) == len(state) - bn_count


def test_batchnorm_names_map_by_name_not_position():
    names = torch_to_ms_names(["layer1.0.bn1.weight", "layer1.0.bn1.bias",
                               "layer1.0.bn1.running_mean", "layer1.0.bn1.running_var",
                               "layer1.0.bn1.num_batches_tracked", "layer1.0.conv1.weight",
                               "fc.weight", "fc.bias"])
    assert names == {"layer1.0.bn1.weight": "layer1.0.bn1.gamma",
                     "layer1.0.bn1.bias": "layer1.0.bn1.beta",
                     "layer1.0.bn1.running_mean": "layer1.0.bn1.moving_mean",
                     "layer1.0.bn1.running_var": "layer1.0.bn1.moving_variance",
                     "layer1.0.conv1.weight": "layer1.0.conv1.weight",
                     "fc.weight": "fc.weight", "fc.bias": "fc.bias"}
    assert ms_to_torch_names(["layer1.0.downsample.1.moving_variance", "fc.bias"]) == {
        "layer1.0.downsample.1.moving_variance": "layer1.0.downsample.1.running_var",
        "fc.bias": "fc.bias"}


@pytest.fixture(scope="module")
def r18_pth(tmp_path_factory):
    torch.manual_seed(0)
    net = torch_resnet("resnet18", 10)
    with torch.no_grad():  # non-trivial BN statistics and counters
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
                m.num_batches_tracked.fill_(1234)
    path = tmp_path_factory.mktemp("pth") / "r18.pth"
    torch.save(net.state_dict(), path)
    return path, net.state_dict()


@pytest.mark.slow
def test_round_trip_is_bit_exact(r18_pth, tmp_path):
    pth, state = r18_pth
    ckpt, back = tmp_path / "r18.ckpt", tmp_path / "back.pth"
    first = run_tool(pth, ckpt)
    assert first.returncode == 0, first.stderr
    assert "resnet18, 10 classes, 102 tensors" in first.stdout
    second = run_tool(ckpt, back)
    assert second.returncode == 0, second.stderr
    restored = torch.load(back, weights_only=True)
    assert set(restored) == set(state)
    for key, value in state.items():
        if key.endswith("num_batches_tracked"):
            assert int(restored[key]) == 0  # no MindSpore counterpart: written back as 0
            continue
        assert restored[key].dtype == value.dtype
        assert torch.equal(restored[key], value), key
    # and the .pth loads strictly into the torch network
    torch_resnet("resnet18", 10).load_state_dict(restored, strict=True)


def test_converted_checkpoint_loads_into_our_network(r18_pth, tmp_path):
    pth, state = r18_pth
    ckpt = tmp_path / "r18.ckpt"
    assert run_tool(pth, ckpt).returncode == 0
    net = create_network("resnet18", class_num=10)
    assert load_into_network(net, str(ckpt)) == ([], False)
    np.testing.assert_array_equal(net.layer2[0].bn1.moving_variance.asnumpy(),
                                  state["layer2.0.bn1.running_var"].numpy())


@pytest.mark.slow
def test_wrapped_and_dataparallel_files(r18_pth, tmp_path):
    _, state = r18_pth
    wrapped = tmp_path / "wrapped.pth"
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in state.items()}}, wrapped)
    result = run_tool(wrapped, tmp_path / "w.ckpt")
    assert result.returncode == 0, result.stderr
    params = ms.load_checkpoint(str(tmp_path / "w.ckpt"))
    np.testing.assert_array_equal(params["conv1.weight"].asnumpy(),
                                  state["conv1.weight"].numpy())


@pytest.mark.slow
def test_training_checkpoint_with_optimizer_state_converts_back(tmp_path):
    net = create_network("resnet18", class_num=10)
    path = str(tmp_path / "train.ckpt")
    extra = [{"name": "moments.fc.weight", "data": ms.Tensor(np.ones((10, 512), np.float32))},
             {"name": "learning_rate", "data": ms.Tensor(np.float32(0.1))}]
    ms.save_checkpoint([{"name": p.name, "data": p} for p in net.get_parameters()] + extra, path)
    result = run_tool(path, tmp_path / "out.pth")
    assert result.returncode == 0, result.stderr
    assert "moments.fc.weight" not in torch.load(tmp_path / "out.pth", weights_only=True)


@pytest.mark.slow
def test_unmatched_and_misshaped_names_are_listed(r18_pth, tmp_path):
    _, state = r18_pth
    bad = dict(state)
    bad["layer1.0.extra.weight"] = torch.zeros(3)
    bad["layer1.0.conv1.weight"] = torch.zeros(64, 64, 1, 1)
    del bad["layer4.1.bn2.running_var"]
    path = tmp_path / "bad.pth"
    torch.save(bad, path)
    result = run_tool(path, tmp_path / "bad.ckpt")
    assert result.returncode == 2
    for name in ("layer1.0.extra.weight", "layer1.0.conv1.weight", "layer4.1.bn2.moving_variance"):
        assert name in result.stderr
    assert not (tmp_path / "bad.ckpt").exists()


@pytest.mark.slow
def test_bad_suffix_and_missing_input(tmp_path):
    """Exit status 2 and a one-line error; the first case through the command line (a fresh
    interpreter: ``sys.exit(main())``)."""
    result = run_tool_command(tmp_path / "a.pth", tmp_path / "b.onnx")
    assert result.returncode == 2 and "got" in result.stderr and "b.onnx" in result.stderr
    with pytest.raises(ConversionError, match="not a ResNet"):
        torch_state_to_ms_arrays({"conv.weight": torch.zeros(1)})
    result = run_tool(tmp_path / "missing.pth", tmp_path / "x.ckpt")
    assert result.returncode == 2 and "input not found" in result.stderr


TORCH_BN_NAMES = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean",
                  "moving_variance": "running_var"}


def trained_torch_net(ckpt):
    """A torch ResNet-18 holding the network weights of our training checkpoint ``ckpt``,
    renamed here by torchvision's rules (not by the converter under test).

    Returns:
        torch.nn.Module: The network, in eval mode.
    """
    params = ms.load_checkpoint(str(ckpt))
    state = {}
    for param in create_network("resnet18", class_num=10).get_parameters():
        prefix, last = param.name.rsplit(".", 1)
        state[f"{prefix}.{TORCH_BN_NAMES.get(last, last)}"] = torch.from_numpy(
            params[param.name].asnumpy())
    tnet = torch_resnet("resnet18", 10)
    missing, unexpected = tnet.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing)
    return tnet.eval()


@pytest.mark.slow
def test_converted_weights_give_torch_accuracy_in_eval_py(quick_start, tmp_path):
    """Trained weights (the quick start's checkpoint) as a torchvision .pth, converted with the
    tool: eval.py on the converted checkpoint scores torch's top-1 on the .pth (torchvision's
    eval preprocessing, written out in the alignment tests) on the 200 shipped test images, and
    that top-1 is well above chance, so that a wrong mapping (e.g. BatchNorm statistics
    swapped) shows: a random network scores chance in both."""
    from tests.test_alignment import pillow_eval_tensor

    tnet = trained_torch_net(quick_start["ckpt"])
    pth, ckpt = tmp_path / "r18.pth", tmp_path / "r18.ckpt"
    torch.save(tnet.state_dict(), pth)
    converted = run_tool(pth, ckpt)
    assert converted.returncode == 0, converted.stderr
    test = os.path.join(CIFAR_SAMPLE, "test")
    resize, crop = 36, 32  # the quick start trains at 32 px; the resize is exercised too
    # in this process, from tmp_path (where MindSpore's decoder would write rejected images)
    succeeded(run_in_process("eval.py", *(str(a) for a in (
        "--net_name", "resnet18", "--class_num", "10", "--eval_image_size", crop,
        "--eval_resize", resize, "--batch_size", "8", "--checkpoint_path", ckpt, "--data_path",
        test, "--output_dir", tmp_path)), cwd=tmp_path))
    ours = json.load(open(tmp_path / "eval_result.json"))
    images, labels = [], []
    for label, cls in enumerate(sorted(os.listdir(test))):
        for name in sorted(os.listdir(os.path.join(test, cls))):
            images.append(pillow_eval_tensor(os.path.join(test, cls, name), resize, crop))
            labels.append(label)
    with torch.no_grad():
        logits = tnet(torch.from_numpy(np.stack(images)))
    torch_top1 = float((logits.argmax(1).numpy() == np.array(labels)).mean())
    print(f"\n[converter] trained ResNet-18 on {len(labels)} CIFAR-10 test images: top-1 "
          f"eval.py {ours['top1']:.3f}, torch {torch_top1:.3f}")
    assert ours["images"] == len(labels) == 200
    assert torch_top1 >= 0.2  # twice chance: the weights are trained, not random
    assert ours["top1"] == pytest.approx(torch_top1, abs=1e-9)


@pytest.mark.slow
def test_a_checkpoint_of_train_py_converts_to_pth(quick_start, tmp_path):
    """train.py's checkpoints (network, optimizer state and the entries train.py adds) convert
    to a .pth that holds exactly the network's weights."""
    pth = tmp_path / "trained.pth"
    result = run_tool(quick_start["ckpt"], pth)
    assert result.returncode == 0, result.stderr[-2000:]
    state = torch.load(pth, weights_only=True)
    expected = trained_torch_net(quick_start["ckpt"]).state_dict()
    assert set(state) == set(expected)
    for key, value in expected.items():
        if not key.endswith("num_batches_tracked"):
            assert torch.equal(state[key], value), key
