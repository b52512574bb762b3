"""Grad-CAM of a ResNet's ``layer4`` (Selvaraju et al. 2017, arXiv:1610.02391) and its
pictures: the heat map blended over the image the network saw (predict.py ``cam_dir``, eval.py
``cam_images``). Conventions (bilinear upsampling, division by the maximum):
docs/deployment.md#grad-cam.
"""
import io
import os
from collections.abc import Callable, Sequence

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from src.data.settings import EvalPreprocess
from src.deploy.formats import SUFFIXES, model_suffix
from src.deploy.inference import chunks, preprocess_images
from src.models.resnet import ResNet, last_feature_map_side
from src.utils.config import ConfigError
from src.utils.errors import UserError
from src.utils.files import atomic_write_bytes

COLORMAP = "jet"  # matplotlib's name of the heat map's colours
ALPHA = 0.5  # weight of the heat map in the blend, that of the image 1 - ALPHA
CAM_FOLDER = "cam"  # eval.py's overlays, in its output_dir


class Layer4Maps(nn.Cell):
    """The network up to ``layer4`` (inference mode): float32 (N, 3, H, W) -> activations A
    (N, C, h, w), C 512 (ResNet-18/34) or 2048, h = ceil(H / 32)."""

    def __init__(self, net: ResNet) -> None:
        super().__init__()
        self.net = net

    def construct(self, x: Tensor) -> Tensor:
        net = self.net
        x = net.maxpool(net.relu(net.bn1(net.conv1(x))))
        return net.layer4(net.layer3(net.layer2(net.layer1(x))))


class ClassScore(nn.Cell):
    """The classifier on ``layer4``'s activations: sum over the batch of the logit of each
    image's class; inputs A (N, C, h, w) and its one-hot classes (N, K)."""

    def __init__(self, net: ResNet) -> None:
        super().__init__()
        self.fc = net.fc

    def logits(self, maps: Tensor) -> Tensor:
        """(N, C, h, w) -> (N, K), as ``ResNet.construct``."""
        return self.fc(ops.mean(maps, (2, 3)))

    def construct(self, maps: Tensor, onehot: Tensor) -> Tensor:
        return (self.logits(maps) * onehot).sum()


class GradCam(nn.Cell):
    """Grad-CAM of ``layer4``, any mode: weights w = spatial mean of d logit_c / d A, map
    ReLU(sum_k w_k A_k), upsampled bilinearly (``align_corners`` false, torch's default) to H x W.

    Inputs: float32 images (N, 3, H, W); int32 classes (N,), -1: the predicted one.
    Outputs: float32 maps (N, H, W), not normalized; int32 classes used (N,).
    """

    def __init__(self, net: ResNet) -> None:
        super().__init__()
        if net.features_only:
            raise ValueError("Grad-CAM needs a classifier network, not features_only")
        self.maps = Layer4Maps(net)
        self.score = ClassScore(net)
        self.class_num = net.fc.out_channels
        self.grad = ops.GradOperation()  # with respect to the first input, A

    def construct(self, images: Tensor, classes: Tensor) -> tuple[Tensor, Tensor]:
        maps = self.maps(images)
        predicted = ops.argmax(self.score.logits(maps), dim=1).astype(ms.int32)
        classes = ops.where(classes < 0, predicted, classes)
        onehot = ops.one_hot(classes, self.class_num, Tensor(1.0, ms.float32),
                             Tensor(0.0, ms.float32))
        grads = self.grad(self.score)(maps, onehot)
        weights = ops.mean(grads, (2, 3), keep_dims=True)
        cam = ops.relu((weights * maps).sum(1, keepdims=True))
        cam = ops.interpolate(cam, size=images.shape[2:], mode="bilinear", align_corners=False)
        return cam[:, 0], classes


def normalize_maps(maps: np.ndarray) -> np.ndarray:
    """Each map (N, H, W) divided by its maximum, into [0, 1] (an all-zero map stays 0)."""
    peak = maps.reshape(len(maps), -1).max(axis=1)
    scale = np.where(peak > 0, peak, 1.0).astype(maps.dtype)
    return maps / scale[:, None, None]


def grad_cam(cam: GradCam, images: np.ndarray, classes: Sequence[int] | np.ndarray,
             batch_size: int) -> np.ndarray:
    """Grad-CAM maps of ``images``, ``batch_size`` at a time.

    Args:
        cam: The network's ``GradCam``.
        images: float32 (N, 3, H, W), preprocessed as in eval.
        classes: The class of each image (N,), -1: its predicted class.
        batch_size: Images per pass.

    Returns:
        numpy.ndarray: float32 (N, H, W) in [0, 1] (``normalize_maps``).
    """
    classes = np.asarray(classes, np.int32)
    maps = [cam(Tensor(part), Tensor(chosen))[0].asnumpy()
            for part, chosen in zip(chunks(images, batch_size), chunks(classes, batch_size))]
    return normalize_maps(np.concatenate(maps).astype(np.float32))


def seen_images(images: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """Preprocessed images (N, 3, H, W) back to the pixels the network saw: uint8 (N, H, W, 3)
    RGB (normalization by ``mean``/``std`` of [0, 1] pixels undone)."""
    pixels = images.transpose(0, 2, 3, 1) * np.asarray(std) + np.asarray(mean)
    return np.clip(np.rint(pixels * 255), 0, 255).astype(np.uint8)


def colormap() -> Callable[[np.ndarray], np.ndarray]:
    """matplotlib's ``COLORMAP``: float array -> RGBA in [0, 1].

    Raises:
        UserError: If matplotlib is not installed (requirements-dev.txt).
    """
    try:
        from matplotlib import colormaps
    except ImportError as err:
        raise UserError("Grad-CAM pictures need matplotlib: pip install matplotlib (in "
                        "requirements-dev.txt)") from err
    return colormaps[COLORMAP]


def overlay(image: np.ndarray, cam_map: np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """The map (H, W) in [0, 1] in ``colormap``'s colours blended over ``image`` uint8
    (H, W, 3) with weight ``alpha``: uint8 (H, W, 3). UserError without matplotlib."""
    heat = colormap()(cam_map)[..., :3] * 255
    return np.clip(np.rint((1 - alpha) * image + alpha * heat), 0, 255).astype(np.uint8)


def png_bytes(rgb: np.ndarray) -> bytes:
    """uint8 (H, W, 3) as PNG file content (Pillow)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(rgb, "RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def write_cam(path: str, image: np.ndarray, cam_map: np.ndarray, *, raw: bool = False) -> None:
    """Write ``path`` (a PNG: ``overlay`` of ``image`` and ``cam_map``) atomically; with
    ``raw``, also the map as float32 ``.npy`` beside it (``path`` with ``.npy`` for ``.png``).

    Raises:
        WriteError: If a file cannot be written.
    """
    atomic_write_bytes(path, png_bytes(overlay(image, cam_map)))
    if raw:
        buffer = io.BytesIO()
        np.save(buffer, cam_map.astype(np.float32))
        atomic_write_bytes(os.path.splitext(path)[0] + ".npy", buffer.getvalue())


def is_exported_graph(checkpoint_path: str) -> bool:
    """Whether a model file is an exported graph (no weights to differentiate): a file of an
    export format (``SUFFIXES``: .mindir, .onnx, .air)."""
    return model_suffix(checkpoint_path) in SUFFIXES.values()


def check_cam_source(checkpoint_path: str, key: str) -> None:
    """Raise ``ConfigError`` naming ``key`` if ``checkpoint_path`` is an exported graph."""
    if is_exported_graph(checkpoint_path):
        raise ConfigError(f"{key} needs the network's weights (.ckpt, a Hub id or a weights "
                          f"folder); {checkpoint_path} is an exported graph")


def check_cam_class(cam_class: int, class_num: int) -> None:
    """Raise ``ConfigError`` unless ``cam_class`` is -1 or a class of ``class_num``."""
    if not -1 <= cam_class < class_num:
        raise ConfigError(f"cam_class {cam_class} is not a class of the model: expected -1 (the "
                          f"predicted class) or 0..{class_num - 1}")


def cam_names(paths: Sequence[str], image_path: str) -> list[str]:
    """The file name stem of each image's Grad-CAM files: ``<stem>_cam``, under the sub-folder
    of ``image_path`` the image is in (``SUB/<stem>_cam``).

    Raises:
        ConfigError: If two images would share a name (same stem, other extension).
    """
    root = image_path if os.path.isdir(image_path) else os.path.dirname(image_path) or "."
    names, seen = [], {}
    for path in paths:
        name = os.path.splitext(os.path.relpath(path, root))[0] + "_cam"
        if name in seen:
            raise ConfigError(f"cam_dir: images {seen[name]} and {path} would both write "
                              f"{name}.png: rename one")
        seen[name] = path
        names.append(name)
    return names


def flat_map_note(image_size: int) -> str | None:
    """Why maps of ``image_size`` px images show nothing (None: they can): layer4's map of 1x1,
    whose Grad-CAM is one value (images of up to 32 px: CIFAR-10's)."""
    if last_feature_map_side(image_size) > 1:
        return None
    return (f"at eval_image_size {image_size} layer4's map is 1x1: its Grad-CAM is one value "
            f"over the whole image (33 px or more give a 2x2 map)")


def overlay_skip_reason(checkpoint_path: str, dataset: str, image_size: int) -> str | None:
    """Why eval.py writes no overlays of its misclassified images (None: it does): an exported
    graph, images without files (the CIFAR-10 binary format), ``flat_map_note``, no
    matplotlib."""
    if is_exported_graph(checkpoint_path):
        return f"{checkpoint_path} is an exported graph (they need the network's weights)"
    if flat_map_note(image_size):
        return flat_map_note(image_size)
    if dataset != "imagefolder":
        return f"dataset {dataset} has no image files to draw on"
    try:
        colormap()
    except UserError as err:
        return str(err)
    return None


def write_misclassified(cam: GradCam, entries: list[dict], *, preprocess: EvalPreprocess,
                        output_dir: str, batch_size: int) -> None:
    """Overlays of eval.py's misclassified images for their predicted class, written as
    ``output_dir/cam/<NNN>_<stem>.png`` (NNN: the position in ``entries``), each entry given
    ``cam``: that path relative to ``output_dir``.

    Args:
        entries: ``ClassReport.summary()``'s ``misclassified`` (``image`` a file path,
            ``predicted``), in its order; changed in place.
        preprocess: The eval preprocessing the images were evaluated with.

    Raises:
        ImageFolderError, WriteError: If an image cannot be read or a file written.
    """
    os.makedirs(os.path.join(output_dir, CAM_FOLDER), exist_ok=True)
    width = max(3, len(str(len(entries) - 1)))
    for start, part in zip(range(0, len(entries), batch_size), chunks(entries, batch_size)):
        images = preprocess_images([e["image"] for e in part], preprocess)
        maps = grad_cam(cam, images, [e["predicted"] for e in part], batch_size)
        seen = seen_images(images, preprocess.mean, preprocess.std)
        for i, (entry, image, cam_map) in enumerate(zip(part, seen, maps), start):
            stem = os.path.splitext(os.path.basename(entry["image"]))[0]
            entry["cam"] = f"{CAM_FOLDER}/{i:0{width}d}_{stem}.png"
            write_cam(os.path.join(output_dir, entry["cam"]), image, cam_map)
