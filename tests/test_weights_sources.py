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
