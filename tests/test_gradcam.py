"""Grad-CAM (src/deploy/gradcam.py, predict.py --cam_dir, eval.py cam_images): equal to a
PyTorch re-derivation of the same formula on the same weights, in GRAPH and PYNATIVE mode
(bounded by torch's own float32 error against float64); the files predict and eval write;
exported graphs and classes out of range refused by name."""
import copy
import json
import os
import shutil

import mindspore as ms
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from src.data.settings import EvalPreprocess
from src.deploy import formats, gradcam
from src.deploy.gradcam import GradCam, grad_cam, normalize_maps
from src.deploy.inference import load_network, preprocess_images
from src.deploy.publish import save_hub_folder, timm_config, torchvision_state
from src.models.resnet import create_network
from src.utils.config import ConfigError
from tests.alignment_utils import max_rel_diff, reference_pair
from tests.helpers import ROOT, copy_class_folders, imagenet_images, run_in_process, succeeded

SAMPLE = os.path.join(ROOT, "data", "cifar10_sample", "test")
SIZE = 64  # the entry-point tests' image side: layer4 is 2x2, the maps are not constant
TINY = ("--net_name", "resnet18", "--class_num", 10, "--eval_image_size", SIZE, "--eval_resize",
        SIZE, "--mode", "PYNATIVE", "--device_target", "CPU")


def torch_grad_cam(tnet, images, classes):
    """The same formula in PyTorch (as pytorch-grad-cam computes it for a ResNet's layer4):
    autograd of the class logits on layer4's output A, weights = spatial mean, ReLU of the
    weighted sum, ``F.interpolate`` bilinear with align_corners False, divided by the max."""
    t = tnet
    maps = t.layer4(t.layer3(t.layer2(t.layer1(t.maxpool(t.relu(t.bn1(t.conv1(images))))))))
    maps = maps.detach().requires_grad_(True)
    logits = t.fc(maps.mean((2, 3)))
    logits[torch.arange(len(images)), torch.as_tensor(classes)].sum().backward()
    weights = maps.grad.mean((2, 3), keepdim=True)
    cam = F.relu((weights * maps).sum(1, keepdim=True))
    cam = F.interpolate(cam, size=images.shape[2:], mode="bilinear", align_corners=False)
    cam = cam[:, 0].detach().numpy()
    peak = cam.max(axis=(1, 2), keepdims=True)
    return cam / np.where(peak > 0, peak, 1), logits.detach().numpy()


@pytest.fixture(params=["GRAPH", "PYNATIVE"])
def mode(request):
    """Run the test in MindSpore's ``request.param`` mode, the mode put back after."""
    before = ms.get_context("mode")
    ms.set_context(mode=getattr(ms, f"{request.param}_MODE"))
    yield request.param
    ms.set_context(mode=before)


@pytest.fixture(scope="module")
def aligned(tmp_path_factory):
    """Three shipped ImageNet photos at 64 px (layer4 2x2), a torch ResNet-18 with BatchNorm
    statistics of those images and ours holding its weights, class 0 never predicted (bias
    -100); torch's Grad-CAM in float64 for the predicted classes, for others and for class 0,
    and its float32 error (the worse of its NCHW and channels_last kernels, on one thread as
    in tests/test_alignment.py). Returns (paths, images, net, references, the net's .ckpt)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        paths = imagenet_images()[::6][:3]
        images = preprocess_images(paths, EvalPreprocess(image_size=SIZE, resize=SIZE))
        tnet, net = reference_pair("resnet18", 10, seed=2, calibrate_on=images)
        tnet.eval()
        with torch.no_grad():  # class 0 is never predicted (a bias moves no Grad-CAM map)
            tnet.fc.bias[0] = -100.0
        net.fc.bias.set_data(ms.Tensor(tnet.fc.bias.detach().numpy()))
        ckpt = str(tmp_path_factory.mktemp("aligned") / "r18.ckpt")
        ms.save_checkpoint(net, ckpt)  # before a GradCam prefixes its parameter names
        x = torch.from_numpy(images)
        with torch.no_grad():
            predicted = tnet(x).argmax(1).numpy()
        assert 0 not in predicted
        references = []
        for classes in (predicted, (predicted + 3) % 10, np.zeros_like(predicted)):
            exact, _ = torch_grad_cam(copy.deepcopy(tnet).double(), x.double(), classes)
            ref, _ = torch_grad_cam(tnet, x, classes)
            flipped, _ = torch_grad_cam(copy.deepcopy(tnet).to(memory_format=torch.channels_last),
                                        x.contiguous(memory_format=torch.channels_last), classes)
            floor = max(max_rel_diff(ref, exact), max_rel_diff(flipped, exact))
            references.append((classes, exact, floor))
    finally:
        torch.set_num_threads(threads)
    return paths, images, net, references, ckpt


def test_grad_cam_equals_torch(aligned, mode):
    """Ours against torch in float64 must be as close as torch's own float32 kernels are,
    within 2x, for the predicted classes (-1), for given ones and for class 0 (a class, not
    "predicted"), each map divided by its own maximum (the three images' peaks differ); the
    classes -1 picks are torch's predicted ones, 0 stays 0."""
    _, images, net, references, _ = aligned
    cam = GradCam(net)
    for i, (classes, exact, floor) in enumerate(references):
        ours = grad_cam(cam, images, [-1] * len(images) if i == 0 else classes, batch_size=3)
        diff = max_rel_diff(ours, exact)
        print(f"\n[gradcam {mode}] vs torch float64: ours {diff:.2e}, torch float32 {floor:.2e}")
        assert ours.shape == (3, SIZE, SIZE) and ours.dtype == np.float32
        if i == 0:  # the predicted classes' maps are not flat
            assert ours.reshape(3, -1).std(axis=1).min() > 0.05
        assert diff <= 2 * floor
    _, chosen = cam(ms.Tensor(images), ms.Tensor(np.full(3, -1, np.int32)))
    np.testing.assert_array_equal(chosen.asnumpy(), references[0][0])
    _, chosen = cam(ms.Tensor(images), ms.Tensor(np.zeros(3, np.int32)))
    np.testing.assert_array_equal(chosen.asnumpy(), [0, 0, 0])
    assert max_rel_diff(references[2][1], references[0][1]) > 0.1  # class 0's maps differ


def test_the_three_reference_maps_peak_differently(aligned):
    """The raw (unnormalized) maps of the aligned images have maxima at least 10% apart, so a
    division by the batch's maximum would leave some below 1."""
    _, images, net, references, _ = aligned
    raw = GradCam(net)(ms.Tensor(images), ms.Tensor(np.full(3, -1, np.int32)))[0].asnumpy()
    peaks = np.sort(raw.reshape(3, -1).max(axis=1))
    assert peaks[0] < 0.9 * peaks[-1], peaks


def test_maps_are_divided_by_their_maximum():
    """Each map by its own maximum (peaks 4 and 1 here), an all-zero map left 0."""
    maps = np.array([[[0.0, 2.0], [1.0, 4.0]], [[0.0, 0.0], [0.0, 0.0]],
                     [[0.5, 0.0], [1.0, 0.25]]], np.float32)
    np.testing.assert_array_equal(normalize_maps(maps),
                                  [[[0, 0.5], [0.25, 1]], [[0, 0], [0, 0]],
                                   [[0.5, 0], [1, 0.25]]])


def test_seen_images_undo_the_normalization_to_the_pixels():
    """Pixels chosen by hand, normalized by ImageNet's mean and std as the eval pipeline
    does, come back exactly."""
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    pixels = np.array([[[[0, 128, 255], [12, 200, 37]], [[255, 0, 99], [64, 64, 64]]]],
                      np.uint8)  # (1, 2, 2, 3)
    normalized = ((pixels / 255.0 - mean) / std).transpose(0, 3, 1, 2).astype(np.float32)
    np.testing.assert_array_equal(gradcam.seen_images(normalized, mean, std), pixels)


def test_overlay_pixels_by_hand(tmp_path):
    """An image of one colour (200, 100, 50) under a map of 0, 1 and 0.5 (jet: dark blue
    (0, 0, 127.5), dark red (127.5, 0, 0)), blended half and half: (100, 50, 89) and
    (164, 50, 25); written by ``write_cam`` as that PNG and the map as .npy."""
    image = np.tile(np.array([200, 100, 50], np.uint8), (1, 3, 1))
    cam_map = np.array([[0.0, 1.0, 0.5]], np.float32)
    picture = gradcam.overlay(image, cam_map)
    np.testing.assert_array_equal(picture[0, :2], [[100, 50, 89], [164, 50, 25]])
    path = str(tmp_path / "a_cam.png")
    gradcam.write_cam(path, image, cam_map, raw=True)
    np.testing.assert_array_equal(np.asarray(Image.open(path))[0, :2],
                                  [[100, 50, 89], [164, 50, 25]])
    np.testing.assert_array_equal(np.load(str(tmp_path / "a_cam.npy")), cam_map)


def test_eval_overlays_are_of_each_entrys_predicted_class(aligned, tmp_path, monkeypatch):
    """``write_misclassified`` draws each entry's ``predicted`` class (with TTA not the plain
    network's top class; here class 0, which the network never ranks first), 2 images per
    pass: the maps equal torch's for class 0, the images the pixels of the preprocessed
    images de-normalized here, the files numbered in entry order."""
    paths, images, net, references, _ = aligned
    _, exact, floor = references[2]
    written = []
    monkeypatch.setattr(gradcam, "write_cam", lambda path, image, cam_map: written.append(
        (os.path.relpath(path, tmp_path), image, cam_map)))
    entries = [{"image": path, "predicted": 0} for path in paths]
    preprocess = EvalPreprocess(image_size=SIZE, resize=SIZE)
    gradcam.write_misclassified(GradCam(net), entries, preprocess=preprocess,
                                output_dir=str(tmp_path), batch_size=2)
    stems = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    assert [w[0] for w in written] == [os.path.join("cam", f"{i:03d}_{s}.png")
                                       for i, s in enumerate(stems)]
    assert [e["cam"] for e in entries] == [f"cam/{i:03d}_{s}.png" for i, s in enumerate(stems)]
    assert max_rel_diff(np.stack([w[2] for w in written]), exact) <= 2 * floor
    seen = images.transpose(0, 2, 3, 1) * np.array(preprocess.std) + np.array(preprocess.mean)
    seen = np.clip(np.rint(seen * 255), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(np.stack([w[1] for w in written]), seen)


def test_predict_cam_class_0_draws_class_0(aligned, tmp_path):
    """``--cam_class 0`` is class 0, not "the predicted class": the map predict.py writes
    equals torch's of class 0 (which the network never predicts), not of its top class."""
    paths, _, _, references, ckpt = aligned
    succeeded(run_in_process(
        "predict.py", *TINY, "--checkpoint_path", ckpt, "--image_path", paths[0],
        "--cam_dir", tmp_path / "cams", "--cam_class", 0))
    stem = os.path.splitext(os.path.basename(paths[0]))[0]
    raw = np.load(str(tmp_path / "cams" / f"{stem}_cam.npy"))
    _, exact, floor = references[2]
    assert max_rel_diff(raw, exact[0]) <= 2 * floor
    assert max_rel_diff(references[0][1][0], exact[0]) > 0.1  # the top class's map differs


def test_cam_file_names_follow_the_sub_folders(tmp_path):
    root = str(tmp_path)
    paths = [os.path.join(root, "a.jpg"), os.path.join(root, "cat", "a.jpg")]
    assert gradcam.cam_names(paths, root) == ["a_cam", os.path.join("cat", "a_cam")]
    assert gradcam.cam_names(paths[:1], paths[0]) == ["a_cam"]
    assert gradcam.cam_names(["a.jpg"], "a.jpg") == ["a_cam"]  # a file in the working folder
    with pytest.raises(ConfigError, match="a.jpg and .*a.png would both write a_cam.png"):
        gradcam.cam_names(paths[:1] + [os.path.join(root, "a.png")], root)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A ResNet-18 checkpoint of 10 classes (random weights) and 20 sample images in their 10
    class folders."""
    folder = tmp_path_factory.mktemp("gradcam")
    ckpt = str(folder / "r18.ckpt")
    ms.save_checkpoint(create_network("resnet18", class_num=10), ckpt)
    data = copy_class_folders(SAMPLE, str(folder / "data"), 2)
    return ckpt, data


def direct_maps(ckpt, paths, classes):
    """The maps of ``paths`` for ``classes`` computed here, and the images as seen."""
    preprocess = EvalPreprocess(image_size=SIZE, resize=SIZE)
    images = preprocess_images(paths, preprocess)
    cam = GradCam(load_network("resnet18", 10, ckpt))
    return (grad_cam(cam, images, classes, batch_size=len(paths)),
            gradcam.seen_images(images, preprocess.mean, preprocess.std))


@pytest.mark.slow  # whole predict / eval runs (and an ONNX export)
def test_predict_writes_an_overlay_and_the_map_per_image(tiny, tmp_path):
    """For the top-1 class printed (cam_class -1), then for a given class from the weights
    as a SAFETENSORS folder: each image's .npy
    equals the map computed here, its PNG the overlay of it on the image as the network saw
    it; a sub-folder's images under cam_dir/<sub-folder>/."""
    ckpt, data = tiny
    images = tmp_path / "images"
    for sub, name in (("", "airplane/0000.jpg"), ("cat", "cat/0000.jpg"), ("cat", "cat/0001.jpg")):
        os.makedirs(images / sub, exist_ok=True)
        shutil.copy(os.path.join(data, name), images / sub / os.path.basename(name))
    result = succeeded(run_in_process(
        "predict.py", *TINY, "--checkpoint_path", ckpt, "--image_path", images, "--batch_size", 2,
        "--cam_dir", tmp_path / "cams", "--top_k", 1))
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    paths, top = [line["image"] for line in lines], [line["top"][0]["class"] for line in lines]
    other = [(c + 5) % 10 for c in top]
    maps, seen = direct_maps(ckpt, paths + paths[:1], top + other[:1])
    assert np.abs(maps[3] - maps[0]).max() > 0.1  # another class, another map
    names = ["0000_cam", "cat/0000_cam", "cat/0001_cam"]
    assert sorted(str(p.relative_to(tmp_path / "cams")) for p in (tmp_path / "cams").rglob("*")
                  ) == sorted(["cat"] + [n + e for n in names for e in (".npy", ".png")])
    weights = str(tmp_path / "weights")  # the same network as a SAFETENSORS folder
    save_hub_folder(weights, torchvision_state(load_network("resnet18", 10, ckpt)),
                    timm_config("resnet18", 10, EvalPreprocess(image_size=SIZE, resize=SIZE)),
                    "a test folder")
    succeeded(run_in_process(
        "predict.py", *TINY, "--checkpoint_path", weights, "--image_path", paths[0],
        "--cam_dir", tmp_path / "given", "--cam_class", other[0]))
    for name, cam_map, image in [(tmp_path / "cams" / n, maps[i], seen[i])
                                 for i, n in enumerate(names)] + [
            (tmp_path / "given" / "0000_cam", maps[3], seen[0])]:
        raw = np.load(f"{name}.npy")
        assert raw.dtype == np.float32 and raw.shape == (SIZE, SIZE)
        np.testing.assert_allclose(raw, cam_map, rtol=0, atol=1e-5)
        picture = np.asarray(Image.open(f"{name}.png")).astype(int)
        assert np.abs(picture - gradcam.overlay(image, raw)).max() == 0


@pytest.mark.slow  # whole predict / eval runs (and an ONNX export)
def test_eval_writes_overlays_of_the_first_misclassified_images(tiny, tmp_path):
    ckpt, data = tiny
    succeeded(run_in_process("eval.py", *TINY, "--checkpoint_path", ckpt, "--data_path", data,
                             "--batch_size", 8, "--output_dir", tmp_path, "--cam_images", 3))
    wrong = json.load(open(tmp_path / "eval_result.json"))["misclassified"]
    assert len(wrong) > 3
    stems = [os.path.splitext(os.path.basename(e["image"]))[0] for e in wrong[:3]]
    assert [e.get("cam") for e in wrong] == [f"cam/{i:03d}_{s}.png" for i, s in
                                             enumerate(stems)] + [None] * (len(wrong) - 3)
    assert sorted(os.listdir(tmp_path / "cam")) == sorted(os.path.basename(e["cam"])
                                                          for e in wrong[:3])
    maps, seen = direct_maps(ckpt, [e["image"] for e in wrong[:3]],
                             [e["predicted"] for e in wrong[:3]])
    for entry, cam_map, image in zip(wrong, maps, seen):
        picture = np.asarray(Image.open(tmp_path / entry["cam"])).astype(int)
        assert np.abs(picture - gradcam.overlay(image, cam_map)).max() <= 1


@pytest.mark.parametrize("suffix", [".onnx", ".mindir"])
def test_predict_refuses_an_exported_graph_by_name(tiny, tmp_path, suffix):
    model = tmp_path / f"model{suffix}"
    model.write_bytes(b"\0")  # refused by its name, before it is read
    result = run_in_process("predict.py", *TINY, "--checkpoint_path", model, "--image_path",
                            SAMPLE + "/cat/0000.jpg", "--cam_dir", tmp_path / "cams")
    assert result.returncode == 2
    assert (f"cam_dir needs the network's weights (.ckpt, a Hub id or a weights folder); "
            f"{model} is an exported graph") in result.stderr
    assert not (tmp_path / "cams").exists()


def test_predict_names_a_class_out_of_range(tiny, tmp_path):
    result = run_in_process("predict.py", *TINY, "--checkpoint_path", tiny[0], "--image_path",
                            SAMPLE + "/cat/0000.jpg", "--cam_dir", tmp_path, "--cam_class", 10)
    assert result.returncode == 2
    assert "cam_class 10 is not a class of the model: expected -1 (the predicted class) or " \
           "0..9" in result.stderr


@pytest.mark.slow  # whole predict / eval runs (and an ONNX export)
def test_eval_of_an_exported_graph_skips_the_overlays_in_one_line(tiny, tmp_path):
    ckpt, data = tiny
    net = load_network("resnet18", 10, ckpt)
    formats.export_model(net, ms.Tensor(np.zeros((2, 3, SIZE, SIZE), np.float32)),
                         str(tmp_path / "model"), "ONNX", dynamic_batch=True)
    result = succeeded(run_in_process("eval.py", *TINY, "--checkpoint_path",
                                      tmp_path / "model.onnx", "--data_path", data,
                                      "--output_dir", tmp_path / "out", "--cam_images", 3))
    skipped = [line for line in result.stdout.splitlines() if "Grad-CAM" in line]
    assert skipped == [f"cam_images: no Grad-CAM overlays: {tmp_path / 'model.onnx'} is an "
                       f"exported graph (they need the network's weights)"]
    wrong = json.load(open(tmp_path / "out" / "eval_result.json"))["misclassified"]
    assert wrong and not any("cam" in e for e in wrong)
    assert not (tmp_path / "out" / "cam").exists()


def test_predict_refuses_images_whose_layer4_map_is_one_value(tiny, tmp_path):
    result = run_in_process("predict.py", *TINY, "--eval_image_size", 32, "--checkpoint_path",
                            tiny[0], "--image_path", SAMPLE + "/cat/0000.jpg", "--cam_dir",
                            tmp_path / "cams")
    assert result.returncode == 2
    assert "cam_dir: at eval_image_size 32 layer4's map is 1x1" in result.stderr
    assert not (tmp_path / "cams").exists()


def test_eval_says_why_it_draws_no_overlays():
    reason = gradcam.overlay_skip_reason
    assert reason("m.ckpt", "imagefolder", 33) is None
    assert reason("hf-hub:org/name", "imagefolder", 224) is None
    assert "m.mindir is an exported graph" in reason("m.mindir", "imagefolder", 224)
    assert "dataset cifar10 has no image files" in reason("m.ckpt", "cifar10", 224)
    assert "eval_image_size 32 layer4's map is 1x1" in reason("m.ckpt", "imagefolder", 32)
