"""Weights in timm's Hugging Face Hub form (``src/utils/hub.py``, ``src/deploy/publish.py``).

No network here: the Hub cache is built in the tests in ``huggingface_hub``'s own layout
(``models--ORG--NAME/{blobs,snapshots,refs}``) and read with ``HF_HUB_OFFLINE=1``; the Hub's
failures come from a stand-in server on 127.0.0.1 that answers as the Hub does (its
``X-Error-Code`` headers), so that ``huggingface_hub``'s own error classes are what the code
meets. The weights are the tests' torch ResNet (torchvision's structure and names), saved with
``safetensors.torch``; the references are computed in torch on images preprocessed with PIL
as timm's eval transform does (resize the shorter side to floor(size / crop_pct), center crop).
"""
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from src.data.settings import EvalPreprocess
from src.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from src.deploy.publish import crop_pct_for, timm_config
from src.utils.checkpoint import read_checkpoint, to_network_names
from src.utils.config import parse_config
from src.utils.hub import (
    HubError,
    PretrainedMismatchError,
    PretrainedWeights,
    parse_hub_id,
    pretrained_eval_settings,
)
from tests.alignment_utils import reference_pair
from tests.helpers import (
    IMAGENET_SMALL,
    ROOT,
    copy_class_folders,
    imagenet_images,
    run_in_process,
    succeeded,
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"
FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}
# timm's pretrained_cfg of resnet50.tv2_in1k (torchvision's V2 recipe) and resnet50.a1_in1k
# (ResNet strikes back), timm/models/resnet.py: _cfg and _rcfg
TV2_CFG = {"input_size": [3, 176, 176], "test_input_size": [3, 224, 224], "crop_pct": 0.875,
           "test_crop_pct": 0.965, "interpolation": "bilinear",
           "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
A1_CFG = {"input_size": [3, 224, 224], "test_input_size": [3, 288, 288], "crop_pct": 0.95,
          "test_crop_pct": 1.0, "interpolation": "bicubic",
          "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def at_sides(pretrained_cfg, train, test):
    """``pretrained_cfg`` with other image sides (``input_size`` ``train``,
    ``test_input_size`` ``test``), its crop fractions and filter kept: the same rules on
    smaller images, for the runs of the entry points."""
    return dict(pretrained_cfg, input_size=[3, train, train], test_input_size=[3, test, test])


# TV2_CFG on small images: eval at 64 px after a resize to floor(64 / 0.965) = 66 (its train
# settings would give 48 and 54); A1_CFG's: 80 px, no crop (64 and 67)
TV2_SMALL = at_sides(TV2_CFG, 48, 64)
A1_SMALL = at_sides(A1_CFG, 64, 80)
# resnet18.tv_in1k's config on small images: TV2_CFG's filter and crop_pct, input 64, no test
# sizes (timm then evaluates at input_size and crop_pct)
TV_SMALL = dict({k: v for k, v in TV2_CFG.items() if not k.startswith("test_")},
                input_size=[3, 64, 64])


def timm_eval_tensor(path, size, crop_pct, interpolation):
    """timm's eval transform on a PIL image (``transforms_factory.transforms_imagenet_eval``:
    Resize(floor(size / crop_pct)) with the filter, CenterCrop(size), ToTensor, Normalize),
    written with PIL: float32 (3, size, size)."""
    resize = math.floor(size / crop_pct)
    with Image.open(path) as im:
        im = im.convert("RGB")
        w, h = im.size
        short, long = (w, h) if w <= h else (h, w)
        new_long = int(resize * long / short)
        im = im.resize((resize, new_long) if w <= h else (new_long, resize),
                       FILTERS[interpolation])
        w, h = im.size
        top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
        x = np.asarray(im.crop((left, top, left + size, top + size)), np.float32)
    x = (x - np.array(IMAGENET_MEAN, np.float32)) / np.array(IMAGENET_STD, np.float32)
    return x.transpose(2, 0, 1)


def torch_logits(tnet, paths, pretrained_cfg):
    """The torch network's logits on ``paths`` preprocessed by ``timm_eval_tensor``."""
    size = pretrained_cfg["test_input_size"][-1]
    images = np.stack([timm_eval_tensor(p, size, pretrained_cfg["test_crop_pct"],
                                        pretrained_cfg["interpolation"]) for p in paths])
    tnet.eval()
    with torch.no_grad():
        return tnet(torch.from_numpy(images)).numpy()


def write_weights_folder(folder, tnet, architecture, pretrained_cfg, label_names=None):
    """``model.safetensors`` (``safetensors.torch.save_file`` of the state_dict, torchvision's
    names, ``num_batches_tracked`` included as timm saves them) and timm's ``config.json``."""
    os.makedirs(folder, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tnet.state_dict().items()},
              os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    config = {"architecture": architecture, "num_classes": tnet.fc.out_features,
              "num_features": tnet.fc.in_features, "global_pool": "avg",
              "pretrained_cfg": dict(pretrained_cfg, num_classes=tnet.fc.out_features)}
    if label_names:
        config["label_names"] = label_names
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    return folder


def add_to_hub_cache(cache, repo_id, folder, commit=COMMIT, ref="main"):
    """Put a folder's files into a Hugging Face cache as ``huggingface_hub`` lays it out:
    ``blobs/<sha256>``, ``snapshots/<commit>/<file>`` -> the blob (relative symlink),
    ``refs/<ref>`` holding the commit."""
    repo = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    for sub in ("blobs", f"snapshots/{commit}", "refs"):
        os.makedirs(os.path.join(repo, sub), exist_ok=True)
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as f:
            data = f.read()
        blob = hashlib.sha256(data).hexdigest()
        with open(os.path.join(repo, "blobs", blob), "wb") as f:
            f.write(data)
        link = os.path.join(repo, "snapshots", commit, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join("..", "..", "blobs", blob), link)
    with open(os.path.join(repo, "refs", ref), "w", encoding="utf-8") as f:
        f.write(commit)


def hub_env(cache, offline=True, endpoint=None):
    """The environment of an entry point reading the Hub cache ``cache``."""
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_DISABLE_TELEMETRY="1")
    env.pop("HF_HUB_OFFLINE", None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    return env


def run_offline_in_process(cache, script, *args):
    """``run_in_process`` as a fresh interpreter with ``hub_env(cache)`` runs it: huggingface_hub
    reads HF_HUB_CACHE and HF_HUB_OFFLINE into its ``constants`` when imported, so they are
    set there as well as in the environment; the ids ``resolve_weights`` remembers in this
    process are forgotten before and after."""
    from huggingface_hub import constants

    from src.utils import hub

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_CACHE", str(cache))
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(constants, "HF_HUB_CACHE", str(cache))
        patch.setattr(constants, "HF_HUB_OFFLINE", True)
        hub._download.cache_clear()
        try:
            return run_in_process(script, *args)
        finally:
            hub._download.cache_clear()


def one_line_error(result, *words):
    """Assert an entry point failed as a user error: exit 2, no traceback, a last line of
    stderr naming each of ``words``; return that line."""
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    for word in words:
        assert word in line, line
    return line


@pytest.fixture(scope="module")
def r18_pair():
    """A torch ResNet-18 (1000 classes, random weights, non-trivial BatchNorm statistics)."""
    tnet, _ = reference_pair("resnet18", 1000, seed=3)
    return tnet


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, r18_pair):
    """A Hugging Face cache holding ``timm/resnet18.tv_in1k`` (bilinear, 64/0.875, no test
    sizes) and ``timm/resnet18.a1_in1k`` (``A1_SMALL``: bicubic, test 80/1.0, label_names),
    both the torch ResNet-18, and ``timm/resnet50d.a1_in1k`` (a network not built here: its
    config.json names it)."""
    root = tmp_path_factory.mktemp("hub")
    cache = root / "cache"
    folders = {"timm/resnet18.tv_in1k": (TV_SMALL, None),
               "timm/resnet18.a1_in1k": (A1_SMALL, [f"label {i}" for i in range(1000)])}
    for repo_id, (pcfg, labels) in folders.items():
        folder = write_weights_folder(str(root / repo_id.replace("/", "_")), r18_pair,
                                      "resnet18", pcfg, labels)
        add_to_hub_cache(str(cache), repo_id, folder)
    other = write_weights_folder(str(root / "r50d"), r18_pair, "resnet50d", A1_CFG)
    add_to_hub_cache(str(cache), "timm/resnet50d.a1_in1k", other)
    return cache


# ---- unit: ids, eval settings, config keys the user set ----

def test_parse_hub_id():
    assert parse_hub_id("hf-hub:timm/resnet50.tv2_in1k") == ("timm/resnet50.tv2_in1k", None)
    assert parse_hub_id("hf-hub:timm/resnet50.tv2_in1k@v1.0") == ("timm/resnet50.tv2_in1k",
                                                                   "v1.0")
    for bad in ("hf-hub:resnet50", "hf-hub:timm/resnet50@", "hf-hub:/x", "hf-hub:a/b/c"):
        with pytest.raises(HubError, match="not a Hub id"):
            parse_hub_id(bad)


def test_eval_settings_follow_timm():
    """test_input_size / test_crop_pct win over input_size / crop_pct; eval_resize is
    floor(size / crop_pct) as timm's eval transform; other normalizations are refused."""
    tv2 = pretrained_eval_settings(PretrainedWeights("x", "x", {"pretrained_cfg": TV2_CFG}))
    assert tv2 == {"eval_image_size": 224, "eval_resize": 232, "eval_interpolation": "bilinear"}
    a1 = pretrained_eval_settings(PretrainedWeights("x", "x", {"pretrained_cfg": A1_CFG}))
    assert a1 == {"eval_image_size": 288, "eval_resize": 288, "eval_interpolation": "bicubic"}
    plain = dict(TV2_CFG, test_input_size=None, test_crop_pct=None)
    assert pretrained_eval_settings(PretrainedWeights("x", "x", {"pretrained_cfg": plain})) == {
        "eval_image_size": 176, "eval_resize": 201, "eval_interpolation": "bilinear"}
    half = PretrainedWeights("hf-hub:timm/resnet34.ra4_e3600_r224_in1k", "x",
                             {"pretrained_cfg": dict(A1_CFG, mean=[0.5] * 3, std=[0.5] * 3)})
    with pytest.raises(PretrainedMismatchError, match="ra4_e3600_r224_in1k.*mean"):
        pretrained_eval_settings(half)
    lanczos = PretrainedWeights("w", "x", {"pretrained_cfg": dict(A1_CFG,
                                                                  interpolation="lanczos")})
    with pytest.raises(PretrainedMismatchError, match="lanczos"):
        pretrained_eval_settings(lanczos)


@pytest.mark.parametrize("size", [160, 176, 224, 256, 288, 320, 384])
def test_published_crop_pct_gives_back_the_resize(size):
    """Our config.json's crop_pct makes timm's floor(size / crop_pct) the run's eval_resize."""
    for resize in range(size, 2 * size):
        crop_pct = crop_pct_for(size, resize)
        assert math.floor(size / crop_pct) == resize
        settings = pretrained_eval_settings(PretrainedWeights("x", "x", {
            "pretrained_cfg": timm_config("resnet18", 10, EvalPreprocess(
                image_size=size, resize=resize, interpolation="bicubic"))[
                "pretrained_cfg"]}))
        assert settings["eval_resize"] == resize and settings["eval_image_size"] == size


def test_config_records_the_keys_the_user_set(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("eval_resize: 240\n")
    cfg = parse_config(["--config_path", str(recipe), "--net_name", "resnet18"])
    assert cfg.user_keys == {"eval_resize", "net_name"}
    before = dict(cfg)
    filled = cfg.with_unset({"net_name": "resnet18", "eval_resize": 232,
                             "eval_image_size": 200, "class_num": 10})
    assert dict(cfg) == before  # a new config; this one as it was
    assert dict(filled) == dict(before, eval_image_size=200, class_num=10)  # eval_resize kept
    assert filled.user_keys == cfg.user_keys and filled.defaults is cfg.defaults
    assert filled.user_value("net_name") == "resnet18" and filled.user_value("batch_size") is None


def test_bicubic_eval_equals_pil(tmp_path):
    """Every eval path (predict's and int8 calibration's reader, the eval pipeline) resizes
    with PIL's bicubic filter when asked: equal to PIL, and not to the bilinear result."""
    from src.data.pipeline import create_dataset
    from src.deploy.inference import preprocess_images
    from src.deploy.quantize import ImageCalibrationReader

    paths = imagenet_images()
    ref = np.stack([timm_eval_tensor(p, 224, 0.95, "bicubic") for p in paths])
    bicubic = EvalPreprocess(image_size=224, resize=235, interpolation="bicubic")
    ours = preprocess_images(paths, bicubic)
    np.testing.assert_array_equal(ours, ref)
    assert np.abs(preprocess_images(
        paths, replace(bicubic, interpolation="bilinear")) - ref).max() > 0.1
    reader = ImageCalibrationReader(paths, "image", len(paths), bicubic)
    np.testing.assert_array_equal(reader.get_next()["image"], ref)
    data = create_dataset(IMAGENET_SMALL, bicubic, batch_size=len(paths))
    images = next(data.create_tuple_iterator(num_epochs=1, output_numpy=True))[0]
    np.testing.assert_array_equal(images, ref)


# ---- loading: names mapped once, values bit-exact, logits equal to torch ----

def test_safetensors_folder_loads_bit_exact(tmp_path, r18_pair):
    folder = write_weights_folder(str(tmp_path / "w"), r18_pair, "resnet18", TV2_CFG)
    params, layout = to_network_names(read_checkpoint(folder), folder)
    assert layout == "torchvision"
    state = r18_pair.state_dict()
    assert not [n for n in params if "num_batches_tracked" in n]
    assert params["bn1.gamma"].asnumpy().tobytes() == state["bn1.weight"].numpy().tobytes()
    assert (params["layer4.1.bn2.moving_variance"].asnumpy().tobytes()
            == state["layer4.1.bn2.running_var"].numpy().tobytes())
    assert params["fc.weight"].asnumpy().tobytes() == state["fc.weight"].numpy().tobytes()
    # a bare .safetensors file, config.json beside it read too
    bare = read_checkpoint(os.path.join(folder, "model.safetensors"))
    assert bare.keys() == read_checkpoint(folder).keys()


@pytest.mark.parametrize("pretrained_cfg", [TV2_SMALL, A1_SMALL], ids=["bilinear", "bicubic"])
def test_folder_logits_equal_torch(tmp_path, r18_pair, pretrained_cfg):
    """A folder's weights, run with its config.json's eval settings (as eval and predict take
    them), give the torch network's logits on timm's preprocessing."""
    from src.deploy.formats import load_predictor
    from src.deploy.inference import preprocess_images
    from src.utils.checkpoint import pretrained_config

    folder = write_weights_folder(str(tmp_path / "w"), r18_pair, "resnet18", pretrained_cfg)
    values = pretrained_config(folder)
    assert values["net_name"] == "resnet18" and values["class_num"] == 1000
    paths = imagenet_images()[:8]
    images = preprocess_images(paths, EvalPreprocess(
        image_size=values["eval_image_size"], resize=values["eval_resize"],
        interpolation=values["eval_interpolation"]))
    ours = load_predictor(folder, "resnet18", 1000, 8)(images)
    ref = torch_logits(r18_pair, paths, pretrained_cfg)
    scale = float(np.abs(ref).max())
    assert float(np.abs(ours - ref).max()) <= 2e-5 * scale


def test_unbuilt_network_and_wrong_net_name_are_named(tmp_path, r18_pair):
    from src.utils.checkpoint import pretrained_config

    folder = write_weights_folder(str(tmp_path / "d"), r18_pair, "resnext50_32x4d", A1_CFG)
    with pytest.raises(PretrainedMismatchError, match="resnext50_32x4d.*does not build.*"
                                                      "hf-hub:timm/resnet50.tv2_in1k"):
        pretrained_config(folder)
    plain = write_weights_folder(str(tmp_path / "p"), r18_pair, "resnet18", A1_CFG)
    with pytest.raises(PretrainedMismatchError, match="holds a resnet18 but net_name is "
                                                      "resnet50: pass --net_name resnet18"):
        pretrained_config(plain, net_name="resnet50")
    os.remove(os.path.join(plain, "config.json"))  # no config: the tensors decide
    with pytest.raises(PretrainedMismatchError, match="tensors of a resnet18"):
        pretrained_config(plain, net_name="resnet34")
    assert pretrained_config(plain) == {"net_name": "resnet18", "class_num": 1000}


# ---- the entry points on a Hub cache, offline ----
# in-process (run_offline_in_process); predict.py without torch runs in a fresh interpreter with
# HF_HUB_OFFLINE and HF_HUB_CACHE in its environment, as a user runs it

@pytest.mark.slow
@pytest.mark.parametrize("repo", ["timm/resnet18.tv_in1k", "timm/resnet18.a1_in1k"],
                         ids=["bilinear", "bicubic"])
def test_predict_from_hub_cache_offline(tmp_path, hub_cache, r18_pair, repo):
    """predict.py on an hf-hub id with HF_HUB_OFFLINE=1: the weights' eval settings and
    class names, probabilities equal to the torch network's softmax (on a folder of the first
    6 shipped ImageNet classes, one image each)."""
    paths = imagenet_images()[:6]
    six = copy_class_folders(IMAGENET_SMALL, str(tmp_path / "six"), 1,
                             classes=[os.path.basename(os.path.dirname(p)) for p in paths])
    result = succeeded(run_offline_in_process(hub_cache, "predict.py", "--checkpoint_path",
                                              f"hf-hub:{repo}", "--image_path", six,
                                              "--top_k", 3, "--device_target", "CPU"))
    rows = {os.path.relpath(json.loads(line)["image"], six): json.loads(line)["top"]
            for line in result.stdout.splitlines() if line.startswith("{")}
    rows = {os.path.join(IMAGENET_SMALL, image): top for image, top in rows.items()}
    assert sorted(rows) == sorted(paths)
    pcfg = A1_SMALL if "a1" in repo else dict(TV_SMALL, test_input_size=TV_SMALL["input_size"],
                                              test_crop_pct=TV_SMALL["crop_pct"])
    logits = torch_logits(r18_pair, paths, pcfg)
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    for path, p in zip(paths, probs):
        top = rows[path]
        assert [t["class"] for t in top] == list(np.argsort(-p)[:3])
        assert all(abs(t["probability"] - p[t["class"]]) < 2e-6 for t in top)
        expected = f"label {top[0]['class']}" if "a1" in repo else None
        assert expected is None or top[0]["name"] == expected
    if "tv" in repo:  # no label_names: ImageNet's names at 1000 classes
        first = rows[paths[0]][0]
        with open(os.path.join(ROOT, "data", "imagenet_classes.tsv"), encoding="utf-8") as f:
            names = [line.rstrip("\n").split("\t")[-1] for line in f if line[0].isdigit()]
        assert first["name"] == names[first["class"]]
    taken = "eval_image_size 80, eval_resize 80, eval_interpolation bicubic" if "a1" in repo \
        else "eval_image_size 64, eval_resize 73, eval_interpolation bilinear"
    assert f"hf-hub:{repo}: taken from its record: net_name resnet18, class_num 1000, {taken}" \
        in result.stderr


@pytest.mark.slow
def test_eval_from_hub_cache_matches_torch(tmp_path, hub_cache):
    """eval.py --checkpoint_path hf-hub:timm/resnet50.tv2_in1k (a ResNet-50 of 26 classes, one
    per shipped ImageNet folder): top-1, top-5, loss and every image's prediction equal the
    torch network's on timm's preprocessing (``TV2_SMALL``: bilinear, resize 66, crop 64)."""
    tnet, _ = reference_pair("resnet50", 26, seed=5)
    folder = write_weights_folder(str(tmp_path / "r50"), tnet, "resnet50", TV2_SMALL)
    add_to_hub_cache(str(hub_cache), "timm/resnet50.tv2_in1k", folder)
    out = tmp_path / "eval"
    succeeded(run_offline_in_process(hub_cache, "eval.py", "--checkpoint_path",
                                     "hf-hub:timm/resnet50.tv2_in1k", "--data_path",
                                     IMAGENET_SMALL, "--batch_size", 13, "--output_dir", out,
                                     "--device_target", "CPU"))
    result = json.load(open(out / "eval_result.json", encoding="utf-8"))
    paths = imagenet_images()
    logits = torch.from_numpy(torch_logits(tnet, paths, TV2_SMALL))
    labels = torch.arange(26)
    top5 = logits.topk(5, 1).indices
    assert result["images"] == 26
    assert result["top1"] == pytest.approx(float((top5[:, 0] == labels).float().mean()))
    assert result["top5"] == pytest.approx(float((top5 == labels[:, None]).any(1).float()
                                                  .mean()))
    loss = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.1)
    assert result["loss"] == pytest.approx(float(loss), rel=1e-5)
    probs = logits.softmax(1)
    wrong = {m["image"]: m for m in result["misclassified"]}
    for i, path in enumerate(paths):
        pred = int(top5[i, 0])
        if pred != i:
            assert wrong[path]["predicted"] == pred
            assert wrong[path]["probability"] == pytest.approx(float(probs[i, pred]), abs=2e-6)


@pytest.mark.slow
def test_finetune_from_hub_cache(tmp_path, hub_cache, cifar_small, r18_pair):
    """train.py --pre_trained hf-hub:... with 10 classes: net_name follows the weights, the
    1000-class classifier is dropped, everything else starts from the Hub weights."""
    import mindspore as ms

    out = tmp_path / "ft"
    result = succeeded(run_offline_in_process(
        hub_cache, "train.py", "--pre_trained", "hf-hub:timm/resnet18.tv_in1k",
        "--data_path", cifar_small["train"], "--class_num", 10, "--epoch_size", 1,
        "--batch_size", 16, "--train_image_size", 32, "--eval_image_size", 32,
        "--base_lr", 1e-7, "--warmup_epochs", 0, "--output_dir", out, "--device_target",
        "CPU", "--num_parallel_workers", 2))
    log = result.stdout + result.stderr
    assert "taken from it: net_name resnet18" in log
    assert "hf-hub:timm/resnet18.tv_in1k" in log and "fc.weight" in log
    ckpt = sorted(p for p in os.listdir(out) if p.endswith(".ckpt"))[-1]
    params = ms.load_checkpoint(str(out / ckpt))
    assert params["fc.weight"].shape == (10, 512)
    ref = r18_pair.state_dict()["layer3.0.conv1.weight"].numpy()
    moved = np.abs(params["layer3.0.conv1.weight"].asnumpy() - ref).max()
    assert moved < 1e-4 * np.abs(ref).max()


# ---- publishing: ours -> SAFETENSORS folder -> torch, and back ----

@pytest.mark.slow
def test_export_safetensors_round_trip(tmp_path):
    """A checkpoint of ours exported with --file_format SAFETENSORS: torch's network takes the
    file with load_state_dict(strict=True) and gives our logits; config.json is timm's with
    the run's eval settings; loading the folder back gives bit-identical weights."""
    import mindspore as ms

    from src.utils.checkpoint import atomic_save_checkpoint

    tnet, net = reference_pair("resnet18", 26, seed=7)
    ckpt = str(tmp_path / "ours.ckpt")
    atomic_save_checkpoint(net, ckpt)
    folder = tmp_path / "published"
    succeeded(run_in_process("export.py", "--checkpoint_path", ckpt, "--net_name", "resnet18",
                             "--class_num", 26, "--file_format", "SAFETENSORS", "--file_name",
                             folder, "--eval_image_size", 200, "--eval_resize", 230,
                             "--eval_interpolation", "bicubic", "--device_target", "CPU"))
    assert sorted(os.listdir(folder)) == ["README.md", "config.json", "model.safetensors"]
    config = json.load(open(folder / "config.json", encoding="utf-8"))
    assert config["architecture"] == "resnet18" and config["num_classes"] == 26
    pcfg = config["pretrained_cfg"]
    assert pcfg["input_size"] == [3, 200, 200] and pcfg["interpolation"] == "bicubic"
    assert math.floor(200 / pcfg["crop_pct"]) == 230
    from safetensors.torch import load_file

    fresh = type(tnet)(type(tnet.layer1[0]), [2, 2, 2, 2], num_classes=26)
    fresh.load_state_dict(load_file(str(folder / "model.safetensors")), strict=True)
    paths = imagenet_images()[:4]
    images = np.stack([timm_eval_tensor(p, 200, pcfg["crop_pct"], "bicubic") for p in paths])
    fresh.eval()
    with torch.no_grad():
        theirs = fresh(torch.from_numpy(images)).numpy()
    net.set_train(False)
    ours = net(ms.Tensor(images)).asnumpy()
    assert np.abs(ours - theirs).max() <= 2e-5 * np.abs(theirs).max()
    back, layout = to_network_names(read_checkpoint(str(folder)))
    assert layout == "torchvision"
    original = ms.load_checkpoint(ckpt)
    assert set(back) == {p.name for p in net.get_parameters()}
    for name, value in back.items():
        assert value.asnumpy().tobytes() == original[name].asnumpy().tobytes(), name
    card = (folder / "README.md").read_text()
    assert "license:" in card and "timm.create_model" in card and "load_state_dict" in card


# ---- failures: one line naming the id, exit status 2 ----

class FakeHub(BaseHTTPRequestHandler):
    """Answers ``/ORG/NAME/resolve/REVISION/FILE`` as the Hub does: ``X-Repo-Commit`` and the
    size on success, ``X-Error-Code`` RepoNotFound / GatedRepo / RevisionNotFound /
    EntryNotFound otherwise; ``truncated`` repos send half of each file."""

    repos = {}

    def log_message(self, *args):
        del args

    def _answer(self, body):
        parts = self.path.split("/")
        repo_id, rev, name = "/".join(parts[1:3]), parts[4], "/".join(parts[5:])
        repo = self.repos.get(repo_id)
        code = ("RepoNotFound" if repo is None else "GatedRepo" if repo.get("gated")
                 else "RevisionNotFound" if rev not in ("main", COMMIT)
                 else "EntryNotFound" if name not in repo["files"] else None)
        if code:
            self.send_response(403 if code == "GatedRepo" else 404)
            self.send_header("X-Error-Code", code)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = repo["files"][name]
        sent = data[:len(data) // 2] if repo.get("truncated") and body else data
        self.send_response(200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(sent)))
        self.end_headers()
        if body:
            self.wfile.write(sent)

    def do_HEAD(self):  # noqa: N802  (BaseHTTPRequestHandler's names)
        self._answer(False)

    def do_GET(self):  # noqa: N802
        self._answer(True)


@pytest.fixture(scope="module")
def fake_hub():
    files = {"model.safetensors": b"x" * 4096, "config.json": b"{}"}
    FakeHub.repos = {"timm/gated-resnet": {"gated": True, "files": files},
                     "timm/cut-resnet": {"truncated": True, "files": files},
                     "timm/no-weights": {"files": {"config.json": b"{}"}}}
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def resolve_in_subprocess(env, source, no_retry_wait=False):
    """``resolve_weights(source)`` in a fresh interpreter (huggingface_hub reads its
    environment at import), reporting a ``UserError`` as the entry points do. With
    ``no_retry_wait``, ``time.sleep`` returns at once in that interpreter: huggingface_hub
    still makes all its attempts at a connection, without its backoff waits between them
    (1 + 2 + 4 + 8 + 8 s, fixed in ``huggingface_hub.utils._http``, no setting shortens them)."""
    wait = "import time\ntime.sleep = lambda seconds: None\n" if no_retry_wait else ""
    code = (wait + "import sys\nfrom src.utils.hub import resolve_weights\n"
            "from src.utils.errors import UserError\n"
            "try:\n    resolve_weights(sys.argv[1])\n"
            "except UserError as err:\n    print(f'error: {err}', file=sys.stderr)\n"
            "    sys.exit(err.exit_status)\n")
    return subprocess.run([sys.executable, "-c", code, source], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("source, words", [
    ("hf-hub:timm/no-such-resnet", ["hf-hub:timm/no-such-resnet", "no such model repository",
                                    "hf-hub:timm/resnet50.tv2_in1k"]),
    ("hf-hub:timm/gated-resnet", ["hf-hub:timm/gated-resnet", "gated", "HF_TOKEN"]),
    ("hf-hub:timm/cut-resnet@main", ["hf-hub:timm/cut-resnet", "downloading model.safetensors",
                                     "run again"]),
    ("hf-hub:timm/cut-resnet@v9", ["revision 'v9' does not exist in timm/cut-resnet"]),
    ("hf-hub:timm/no-weights", ["hf-hub:timm/no-weights", "no model.safetensors"]),
], ids=["unknown-id", "gated", "truncated", "no-revision", "no-safetensors"])
def test_hub_failures_are_one_line(tmp_path, fake_hub, source, words):
    result = resolve_in_subprocess(hub_env(tmp_path / "cache", False, fake_hub), source)
    one_line_error(result, *words)
    assert not list((tmp_path / "cache").rglob("model.safetensors")), "a partial file is kept"


def test_offline_without_cache(tmp_path):
    result = resolve_in_subprocess(hub_env(tmp_path), "hf-hub:timm/resnet18.tv_in1k")
    one_line_error(result, "hf-hub:timm/resnet18.tv_in1k", "not in the Hugging Face cache",
                   "HF_HUB_OFFLINE is set", "hf download timm/resnet18.tv_in1k")


@pytest.mark.slow
def test_no_network_without_cache(tmp_path):
    closed = "http://127.0.0.1:9"  # discard port: nothing listens
    result = resolve_in_subprocess(hub_env(tmp_path, False, closed),
                                   "hf-hub:timm/resnet18.tv_in1k", no_retry_wait=True)
    one_line_error(result, "hf-hub:timm/resnet18.tv_in1k", "not in the Hugging Face cache",
                   "no connection")


@pytest.mark.slow
def test_entry_points_report_hub_errors_in_one_line(tmp_path, hub_cache):
    """The entry points on bad weights sources: exit 2 and one line, no traceback."""
    one_line_error(run_offline_in_process(hub_cache, "predict.py", "--checkpoint_path",
                                          "hf-hub:timm/resnet50d.a1_in1k", "--image_path",
                                          IMAGENET_SMALL), "resnet50d", "does not build")
    one_line_error(run_offline_in_process(hub_cache, "eval.py", "--checkpoint_path",
                                          "hf-hub:timm/resnet18.tv_in1k", "--net_name",
                                          "resnet34", "--data_path", IMAGENET_SMALL),
                   "pass --net_name resnet18")
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(run_in_process("train.py", "--pre_trained", str(empty), "--data_path",
                                  IMAGENET_SMALL, "--output_dir", tmp_path / "o"),
                   str(empty), "no model.safetensors")
    cut = tmp_path / "cut"
    shutil.copytree(hub_cache / "models--timm--resnet18.tv_in1k" / "snapshots" / COMMIT, cut)
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").unlink()
    (cut / "model.safetensors").write_bytes(data[:len(data) // 3])
    one_line_error(run_in_process("export.py", "--checkpoint_path", cut, "--file_name",
                                  tmp_path / "m"), "cannot read", "safetensors")


@pytest.mark.slow
def test_entry_points_load_safetensors_without_torch(hub_cache):
    """torch is a test dependency only: predict.py runs Hub weights (a safetensors snapshot of
    the offline cache, HF_HUB_OFFLINE and HF_HUB_CACHE read from its environment) with torch
    made unimportable."""
    code = ("import sys, runpy\nsys.modules['torch'] = None\n"
            "sys.argv = ['predict.py'] + sys.argv[1:]\n"
            "runpy.run_path('predict.py', run_name='__main__')\n")
    result = subprocess.run([sys.executable, "-c", code, "--checkpoint_path",
                             "hf-hub:timm/resnet18.tv_in1k", "--image_path",
                             imagenet_images()[0], "--top_k", "1"],
                            cwd=ROOT, env=hub_env(hub_cache), capture_output=True, text=True,
                            timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    top = json.loads(result.stdout.strip().splitlines()[-1])["top"][0]
    with open(os.path.join(ROOT, "data", "imagenet_classes.tsv"), encoding="utf-8") as f:
        names = [line.rstrip("\n").split("\t")[-1] for line in f if line[0].isdigit()]
    assert top["name"] == names[top["class"]]
