"""Odd weights files are loaded exactly or refused by name (issue 40): bfloat16 / float16
``.safetensors`` widened to float32, integer and non-finite tensors, bad ``config.json`` values
and Hub ids, unreadable files, a config that contradicts the tensors."""
import json
import os

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from src.utils.checkpoint import read_checkpoint
from src.utils.hub import HubError


def write_tensors(folder, tensors, config=None):
    """``model.safetensors`` of ``tensors`` (name -> torch tensor) and ``config.json``."""
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    if config is not None:
        with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)
    return folder


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_safetensors_widen_exactly(tmp_path, dtype):
    """bf16 and fp16 weights load as float32 holding exactly the stored values."""
    torch.manual_seed(0)
    weight = (torch.randn(4, 3, 3, 3) * 3).to(dtype)
    folder = write_tensors(str(tmp_path / "w"), {
        "conv1.weight": weight, "bn1.num_batches_tracked": torch.tensor(7)})
    params = read_checkpoint(folder)
    loaded = params["conv1.weight"].asnumpy()
    assert loaded.dtype == np.float32
    assert loaded.tobytes() == weight.float().numpy().tobytes()
    assert int(params["bn1.num_batches_tracked"].asnumpy()) == 7


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_integer_weights_are_refused_by_name(tmp_path, dtype):
    folder = write_tensors(str(tmp_path / "w"), {
        "conv1.weight": torch.ones(4, 3, 3, 3, dtype=dtype)})
    with pytest.raises(HubError, match=r"tensor conv1\.weight of .*model\.safetensors is [IU]"
                                       r"\d+; expected float weights"):
        read_checkpoint(folder)


def _nan_weights():
    return {"conv1.weight": torch.ones(4, 3, 3, 3), "bn1.weight": torch.ones(4),
            "fc.weight": torch.tensor([[0.0, float("nan")], [float("inf"), 1.0]])}


@pytest.mark.parametrize("form", ["folder", "file", "hub"])
def test_non_finite_safetensors_are_named(tmp_path, monkeypatch, form):
    """NaN or inf in Hub weights (a folder, a bare file, an hf-hub: id) is refused, naming the
    tensor: the CPU ReLU turns NaN into 0, so predict would print plausible classes."""
    from src.utils import hub
    from src.utils.checkpoint import CheckpointError

    folder = write_tensors(str(tmp_path / "w"), _nan_weights())
    source = {"folder": folder, "file": os.path.join(folder, "model.safetensors"),
              "hub": "hf-hub:timm/resnet18.nan"}[form]
    monkeypatch.setattr(hub, "_download", lambda s: (os.path.join(folder, "model.safetensors"),
                                                     None))
    with pytest.raises(CheckpointError, match=rf"^{source}: tensor fc\.weight holds 2 NaN or "
                                              rf"inf values \(of 4\); expected finite weights"):
        read_checkpoint(source)


def test_non_finite_ckpt_is_named(tmp_path):
    import mindspore as ms

    from src.utils.checkpoint import CheckpointError

    path = str(tmp_path / "nan.ckpt")
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(t.numpy())}
                        for n, t in _nan_weights().items()], path)
    with pytest.raises(CheckpointError, match=r"nan\.ckpt: tensor fc\.weight holds 2 NaN"):
        read_checkpoint(path)


def test_non_finite_pth_is_named_by_the_converter(tmp_path):
    from tests.torch_resnet import torch_resnet
    from tools.convert_torch_checkpoint import ConversionError, convert

    state = torch_resnet("resnet18", 10).state_dict()
    state["layer2.0.conv1.weight"][0, 0, 0, 0] = float("inf")
    path = str(tmp_path / "inf.pth")
    torch.save(state, path)
    with pytest.raises(ConversionError, match=r"inf\.pth: tensor layer2\.0\.conv1\.weight "
                                              r"holds 1 NaN or inf values"):
        convert(path, str(tmp_path / "out.ckpt"))
    assert not os.path.exists(tmp_path / "out.ckpt")
