"""Odd weights files are loaded exactly or refused by name (issue 40): bfloat16 / float16
``.safetensors`` widened to float32, integer and non-finite tensors, bad ``config.json`` values
and Hub ids, unreadable files, a config that contradicts the tensors."""
import json
import os
import re

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


IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def weights_with(tmp_path, config):
    """``resolve_weights`` of a folder holding one tensor and ``config`` as its config.json."""
    from src.utils.hub import resolve_weights

    return resolve_weights(write_tensors(str(tmp_path / "w"), {"fc.weight": torch.ones(2, 2)},
                                         config))


@pytest.mark.parametrize("pretrained_cfg, field, expected", [
    ({"input_size": [3, 224, 224], "crop_pct": -1}, "crop_pct", "a number in"),
    ({"input_size": [3, 224, 224], "crop_pct": 1e-7}, "crop_pct",
     "a fraction giving an eval_resize of at most 4096"),
    ({"input_size": [3, 224, 224], "crop_pct": "0.9"}, "crop_pct", "a number in"),
    ({"input_size": [3, 224, 224], "test_crop_pct": 1.5}, "test_crop_pct", "a number in"),
    ({"input_size": [3, 0, 0]}, "input_size", r"\[3, S, S\] with S an integer in 1..4096"),
    ({"input_size": [3, -32, -32]}, "input_size", r"\[3, S, S\]"),
    ({"input_size": [3, 10 ** 9, 10 ** 9]}, "input_size", r"\[3, S, S\]"),
    ({"input_size": ["3", "32", "32"]}, "input_size", r"\[3, S, S\]"),
    ({"input_size": 224}, "input_size", r"\[3, S, S\]"),
    ({"test_input_size": [3, 32.5, 32.5]}, "test_input_size", r"\[3, S, S\]"),
    ({"mean": "imagenet"}, "mean", "a list of 3 numbers"),
    ({"mean": [0.485, 0.456]}, "mean", "a list of 3 numbers"),
    ({"std": [0.229, None, 0.225]}, "std", "a list of 3 numbers"),
])
def test_config_json_values_are_checked_as_the_keys(tmp_path, pretrained_cfg, field, expected):
    """Every eval setting from config.json passes the range the key has on the command line;
    the error names the source, the file and the field."""
    from src.utils.hub import WeightsConfigError, pretrained_eval_settings

    weights = weights_with(tmp_path, {"pretrained_cfg": dict(IMAGENET, **pretrained_cfg)})
    folder = str(tmp_path / "w")
    value = pretrained_cfg[field] if field in pretrained_cfg else None
    with pytest.raises(WeightsConfigError, match=(
            rf"^{folder}: {folder}/config\.json field pretrained_cfg\.{field} is "
            rf"{re.escape(repr(value))}; expected {expected}")):
        pretrained_eval_settings(weights)


def test_pretrained_cfg_not_an_object_is_named(tmp_path):
    from src.utils.hub import WeightsConfigError, pretrained_eval_settings

    weights = weights_with(tmp_path, {"pretrained_cfg": [1, 2]})
    with pytest.raises(WeightsConfigError, match=r"config\.json field pretrained_cfg is \[1, 2\]; "
                                                 r"expected a JSON object"):
        pretrained_eval_settings(weights)


def test_eval_resize_is_floored_as_timm():
    """224 / 0.9 = 248.9: timm's eval transform resizes to floor, 248 (round would give 249)."""
    from src.utils.hub import PretrainedWeights, pretrained_eval_settings

    weights = PretrainedWeights("x", "x", {"pretrained_cfg": dict(
        IMAGENET, input_size=[3, 224, 224], crop_pct=0.9, interpolation="bicubic")})
    assert pretrained_eval_settings(weights) == {
        "eval_image_size": 224, "eval_resize": 248, "eval_interpolation": "bicubic"}


def test_non_square_size_and_other_std_are_refused():
    """A non-square input and a std other than ImageNet's under ImageNet's mean are refused
    (each on its own: the mean matching does not let the std through)."""
    from src.utils.hub import PretrainedMismatchError, PretrainedWeights, pretrained_eval_settings

    wide = PretrainedWeights("w", "x", {"pretrained_cfg": dict(IMAGENET, input_size=[3, 224, 200])})
    with pytest.raises(PretrainedMismatchError, match=r"input size \[3, 224, 200\] is not square"):
        pretrained_eval_settings(wide)
    std = PretrainedWeights("s", "x", {"pretrained_cfg": dict(IMAGENET, std=[0.5, 0.5, 0.5])})
    with pytest.raises(PretrainedMismatchError, match=r"^s expects images normalized with std "
                                                      r"\[0\.5, 0\.5, 0\.5\]"):
        pretrained_eval_settings(std)


def test_label_names_dict_keys_are_the_indices():
    """timm writes label_names as a dict of string indices: "10" is class 10, after "9" (not
    after "1" as the strings sort)."""
    from src.utils.hub import PretrainedWeights

    names = {str(i): f"class {i}" for i in reversed(range(12))}
    weights = PretrainedWeights("x", "x", {"num_classes": 12, "label_names": names})
    assert weights.label_names == [f"class {i}" for i in range(12)]
    listed = PretrainedWeights("x", "x", {"num_classes": 2, "label_names": ["cat", "dog"]})
    assert listed.label_names == ["cat", "dog"]


@pytest.mark.parametrize("label_names, field, expected", [
    ({str(i): f"n{i}" for i in range(1, 11)}, "label_names",
     r"a dict with keys 1..10 \(10 names\); expected the class indices 0..9 \(num_classes 10\) "
     r"as keys; missing \[0\], extra \[10\]"),
    ({str(i): f"n{i}" for i in (0, 1, 2, 3, 5, 6, 7, 8, 9, 10)}, "label_names",
     r"a dict with keys 0..10 \(10 names\); expected .*; missing \[4\], extra \[10\]"),
    ({f"n{i}": i for i in range(10)}, "label_names",
     r"a dict with key 'n0'; expected class indices \"0\"..\"N-1\" as keys"),
    ([f"n{i}" for i in range(9)], "label_names", r"9 names; expected num_classes 10"),
    ([None] * 10, r"label_names\[0\]", r"None; expected a class name \(a string\)"),
    (["a"] * 9 + [7], r"label_names\[9\]", r"7; expected a class name"),
    ("cats", "label_names", r"'cats'; expected a list of class names"),
])
def test_bad_label_names_are_named(tmp_path, label_names, field, expected):
    from src.utils.hub import WeightsConfigError

    weights = weights_with(tmp_path, {"num_classes": 10, "label_names": label_names})
    folder = str(tmp_path / "w")
    with pytest.raises(WeightsConfigError, match=rf"^{folder}: {folder}/config\.json field "
                                                 rf"{field} is {expected}"):
        weights.label_names  # noqa: B018


@pytest.mark.parametrize("source", ["hf-hub:timm/..", "hf-hub:timm/résnet18", "hf-hub:timm/a--b",
                                    "hf-hub:timm/resnet18.", "hf-hub:timm/-x@main"])
def test_hub_ids_the_hub_refuses_are_named(source):
    """Ids the Hub's own validation refuses are named before any download (not an
    HFValidationError traceback)."""
    from src.utils.hub import parse_hub_id, resolve_weights

    with pytest.raises(HubError, match=rf"^{re.escape(repr(source))} is not a Hub id: .* not a "
                                       rf"repository name the Hub allows"):
        parse_hub_id(source)
    with pytest.raises(HubError, match="is not a Hub id"):
        resolve_weights(source)


@pytest.mark.parametrize("read", ["tensors", "shapes"])
def test_unreadable_weights_file_says_what_failed(tmp_path, monkeypatch, read):
    """A weights file that cannot be opened (permission denied) is named with the OS reason,
    without the advice to delete it that a cut-short file gets (tests run as root, so the
    denial is simulated)."""
    from src.utils import hub
    from src.utils.checkpoint import pretrained_config

    folder = write_tensors(str(tmp_path / "w"), {"fc.weight": torch.ones(2, 2)})
    path = os.path.join(folder, "model.safetensors")

    def denied(file, *args, **kwargs):
        if file == path:
            raise PermissionError(13, "Permission denied", file)
        return open(file, *args, **kwargs)

    monkeypatch.setattr(hub, "open", denied, raising=False)
    with pytest.raises(HubError) as err:
        (read_checkpoint if read == "tensors" else pretrained_config)(folder)
    assert str(err.value) == f"{folder}: cannot read {path}: Permission denied"


@pytest.mark.parametrize("net_name", [None, "resnet34", "resnet18"])
def test_config_naming_another_network_than_the_tensors_is_named(tmp_path, net_name):
    """A config.json saying resnet34 over ResNet-18 tensors: the error says they disagree and
    what the tensors are, instead of advising --net_name resnet34 (which then fails)."""
    from src.utils.checkpoint import pretrained_config
    from src.utils.hub import PretrainedMismatchError
    from tests.torch_resnet import torch_resnet

    folder = write_tensors(str(tmp_path / "w"), torch_resnet("resnet18", 10).state_dict(),
                           {"architecture": "resnet34", "num_classes": 10})
    with pytest.raises(PretrainedMismatchError) as err:
        pretrained_config(folder, net_name=net_name)
    assert str(err.value) == (
        f"{folder}: {folder}/config.json says architecture resnet34 but its tensors are a "
        f"resnet18 (BasicBlock blocks [2, 2, 2, 2], 10 classes): the config and the weights "
        f"disagree; correct the architecture in {folder}/config.json or use other weights")


def test_offline_cache_without_config_resolves_to_an_empty_config(tmp_path, monkeypatch):
    """A Hub cache holding model.safetensors but no config.json (offline, so config.json cannot
    be asked for): the weights resolve, with no eval settings, not an error."""
    from huggingface_hub import constants

    from src.utils import hub
    from src.utils.hub import resolve_weights
    from tests.test_hub import add_to_hub_cache

    folder = write_tensors(str(tmp_path / "w"), {"fc.weight": torch.ones(2, 2)})
    cache = str(tmp_path / "cache")
    add_to_hub_cache(cache, "timm/noconfig", folder)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", cache)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub._download.cache_clear()
    try:
        weights = resolve_weights("hf-hub:timm/noconfig")
    finally:
        hub._download.cache_clear()
    assert weights.config == {} and weights.weights_file.endswith("model.safetensors")
    assert hub.pretrained_eval_settings(weights) == {} and weights.label_names is None


def test_finetuning_from_hub_weights_takes_only_the_network(tmp_path, caplog):
    """train.py --pre_trained hf-hub:/folder: the run takes net_name from the weights and keeps
    its own class_num and eval settings (the whole log line, not a substring of it)."""
    import logging

    from src.recipe import weights_config
    from src.utils.checkpoint import pretrained_config
    from src.utils.config import parse_config
    from tests.torch_resnet import torch_resnet

    folder = write_tensors(str(tmp_path / "w"), torch_resnet("resnet18", 1000).state_dict(), {
        "architecture": "resnet18", "num_classes": 1000, "pretrained_cfg": dict(
            IMAGENET, input_size=[3, 176, 176], crop_pct=0.5, interpolation="bicubic")})
    assert pretrained_config(folder, eval_settings=False) == {"net_name": "resnet18"}
    cfg = parse_config(["--class_num", "10", "--pre_trained", folder])
    before = dict(cfg)
    with caplog.at_level(logging.INFO):
        resolved = weights_config(cfg, folder, eval_settings=False)
    assert dict(cfg) == before  # a new config; the given one as it was
    assert dict(resolved) == dict(before, net_name="resnet18")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(folder)]
    assert lines == [f"{folder}: taken from it: net_name resnet18"]
