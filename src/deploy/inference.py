"""Loading models for eval.py, export.py and predict.py: a checkpoint into a network, a
.mindir or .onnx file as a function of numpy images (the predictors of
``src.deploy.formats``), and images read as the eval pipeline reads them.
"""
import logging
import os
from collections.abc import Callable

import mindspore as ms
import numpy as np
from mindspore import nn

from src.data.image_check import (
    IMAGE_EXTENSIONS,
    ImageFolderError,
    list_folder,
    listing_text,
    nested_note,
)
from src.data.transforms import create_transforms
from src.models.resnet import create_network
from src.utils.checkpoint import load_into_network
from src.utils.config import ConfigError
from src.utils.errors import MissingFileError, UserError

LOGGER = logging.getLogger(__name__)

Forward = Callable[[np.ndarray], np.ndarray]
"""A model as a function: float32 images (N, 3, H, W) -> float32 logits (N, class_num)."""


class ModelFileError(UserError):
    """A model file (.mindir, .onnx) exists but cannot be loaded."""


class ModelInputError(UserError, ValueError):
    """Images do not have the input shape an exported model was exported with."""


def load_network(net_name: str, class_num: int, checkpoint_path: str, *, use_ema: bool = True,
                 device_target: str | None = None, stem_pool_pad_mode: str = "pad") -> nn.Cell:
    """Build a network, load a checkpoint into it strictly and switch to inference mode.

    A log line says whether the checkpoint's weight EMA (``ema_decay`` runs) or its live
    weights were loaded.

    Args:
        net_name: Architecture (``resnet18`` .. ``resnet152``).
        class_num: Classifier outputs.
        checkpoint_path: ``.ckpt`` file, or Hub weights (``hf-hub:`` id, safetensors folder
            or file: ``src.utils.hub``).
        use_ema: Load the EMA weights when the checkpoint holds them.
        device_target: Picks the stem max-pool form for that device
            (``src.models.resnet.STEM_MAX_POOLS``); None: the built form (for ``pad``
            torch's).
        stem_pool_pad_mode: ``pad`` or ``same`` (MindCV's stem pool): the one the checkpoint
            was trained with (MindCV's checkpoints: ``same``).

    Returns:
        The network in inference mode: float32 (N, 3, H, W) -> logits (N, class_num).

    Raises:
        ConfigError: If ``checkpoint_path`` is empty.
        MissingFileError: If the checkpoint does not exist.
        CheckpointMismatchError: If the checkpoint is of another depth or class count.
    """
    if not checkpoint_path:
        raise ConfigError("checkpoint_path is empty: give --checkpoint_path FILE.ckpt")
    net = create_network(net_name, class_num, device_target=device_target,
                         stem_pool_pad_mode=stem_pool_pad_mode)
    _, ema = load_into_network(net, checkpoint_path, use_ema=use_ema)
    LOGGER.info("%s: %s", checkpoint_path, "its EMA weights (use_ema true)" if ema else
                "its network weights" + (" (it holds no EMA)" if use_ema else
                                         " (use_ema false)"))
    net.set_train(False)
    return net


def list_images(image_path: str) -> list[str]:
    """An image file, or the images of a folder (sorted), as a list of paths.

    A folder is read as eval reads a data folder (one rule with train and eval: MindSpore's
    ImageFolderDataset reads only the files directly in a class folder): the images directly
    in it and, when it holds sub-folders (a class-folder root), those directly in each of
    them. Folders below that are skipped with one warning counting them and their images.
    The image extensions (``IMAGE_EXTENSIONS``) match in any case (``.Jpg`` too: Pillow reads
    them); the other files, and hidden ones, are skipped with one warning that counts them by
    extension.

    Raises:
        MissingFileError: If the path does not exist or the folder holds no images.
        ImageFolderError: Naming the entries with an image name that are no image file (a
            folder ``photos.jpg``, a link to a missing file), a folder that cannot be read,
            or links that cannot be followed.
    """
    if os.path.isfile(image_path):
        return [image_path]
    if not os.path.isdir(image_path):
        raise MissingFileError(f"image_path {image_path!r} is neither a file nor a folder")
    extensions = {e.lower() for e in IMAGE_EXTENSIONS}

    def is_image(name):
        return os.path.splitext(name)[1].lower() in extensions and not name.startswith(".")

    top = list_folder(image_path, is_image)
    inner = [os.path.join(image_path, n) for n in top.folders if not n.startswith(".")]
    nested = [os.path.join(image_path, n) for n in top.folders if n.startswith(".")]
    found, not_files, skipped = [], [], {}
    for folder, listing in [(image_path, top)] + [(f, list_folder(f, is_image)) for f in inner]:
        found += [os.path.join(folder, n) for n in listing.images]
        not_files += listing.not_files
        nested += [os.path.join(folder, n) for n in listing.folders if folder != image_path]
        for name in listing.skipped:
            key = "hidden" if name.startswith(".") else os.path.splitext(name)[1] or \
                "no extension"
            skipped[key] = skipped.get(key, 0) + 1
    if not_files:
        raise ImageFolderError(listing_text("entries with an image name that are not image files: "
                                        "remove or rename them", not_files))
    if skipped:
        LOGGER.warning("image_path %s: skipped %d files that are not images (%s)", image_path,
                       sum(skipped.values()),
                       ", ".join(f"{k}: {n}" for k, n in sorted(skipped.items())))
    if nested:
        LOGGER.warning(listing_text(
            f"image_path {image_path}: skipping {nested_note(nested, is_image)} (the images in "
            f"image_path and directly in its sub-folders are read, as eval reads class folders, "
            f"not deeper ones)", sorted(nested)))
    if not found:
        raise MissingFileError(f"no images ({', '.join(IMAGE_EXTENSIONS[:4])}) in {image_path}")
    return sorted(found)


def preprocess_images(paths, image_size=224, eval_resize=256, interpolation="bilinear",
                      exif_transpose=False):
    """Read and preprocess images exactly as the eval pipeline does.

    Args:
        paths (list[str]): Image files (JPEG, PNG, BMP).
        image_size (int): Center crop, pixels.
        eval_resize (int): Shorter side before the crop, pixels.
        interpolation (str): The resize filter, ``bilinear`` or ``bicubic`` (PIL's).
        exif_transpose (bool): Turn each image upright by its EXIF Orientation tag first
            (``src.data.transforms.decode_rgb``), as the pipelines with ``exif_transpose``.

    Returns:
        numpy.ndarray: float32 (len(paths), 3, image_size, image_size), normalized.

    Raises:
        ImageFolderError: If a file cannot be read (permission) or decoded as an image (names
            the file).
    """
    ops = create_transforms(False, image_size, eval_resize, interpolation=interpolation,
                            exif_transpose=exif_transpose)
    batch = []
    for path in paths:
        try:
            image = np.fromfile(path, dtype=np.uint8)
        except OSError as err:  # permission, a folder, a link to a missing file
            raise ImageFolderError(f"cannot read image {path}: {err.strerror or err}") from err
        try:
            for op in ops:  # one by one: eager Compose wraps PIL-path results in a tuple
                image = op(image)
        except (RuntimeError, ValueError, OSError) as err:
            raise ImageFolderError(f"cannot decode image {path}: "
                                   f"{str(err).splitlines()[0]}") from err
        batch.append(image)
    return np.stack(batch).astype(np.float32)


def _require_file(path: str, kind: str) -> None:
    if not os.path.isfile(path):
        raise MissingFileError(f"{kind} file not found: {path}")


def load_mindir(path: str) -> nn.GraphCell:
    """A MindIR file as a callable ``nn.GraphCell``.

    Raises:
        MissingFileError: If the file does not exist.
        ModelFileError: If MindSpore cannot load it (cut short, not a MindIR file).
    """
    _require_file(path, "MindIR")
    try:
        graph = ms.load(path)
    except (RuntimeError, ValueError) as err:
        raise ModelFileError(f"cannot load MindIR file {path}: {str(err).splitlines()[0]} "
                             f"(cut short, or not a .mindir written by export.py?)") from err
    return ms.nn.GraphCell(graph)


def declared_shape(dims) -> tuple[int | None, ...] | None:
    """A model's declared input dimensions as a tuple, or None when it declares none; a
    dimension that is not a fixed positive int (symbolic, -1 or 0: dynamic) becomes None
    ("any size")."""
    return tuple(d if isinstance(d, int) and d > 0 else None for d in dims or ()) or None


def mindir_input_shape(path: str) -> tuple[int | None, ...] | None:
    """The input shape a MindIR file declares (its graph's first input), read from the
    protobuf; None if it cannot be read so (another MindIR layout, an encrypted file).

    Returns:
        e.g. (batch_size, 3, image_size, image_size); None in a dynamic dimension.
    """
    try:
        from google.protobuf.message import DecodeError
        from mindspore.train.mind_ir_pb2 import ModelProto
    except ImportError:
        return None
    model = ModelProto()
    try:
        with open(path, "rb") as f:
            model.ParseFromString(f.read())
        return declared_shape(model.graph.input[0].tensor[0].dims)
    except (DecodeError, IndexError):
        return None


def load_onnx(path: str) -> tuple[Forward, tuple[int | None, ...] | None]:
    """An ONNX file in ONNX Runtime (CPU).

    Returns:
        The model as a function (``Forward``), and the input shape it declares
        (``declared_shape``: a symbolic batch is None).

    Raises:
        MissingFileError: If the file does not exist.
        ImportError: If onnxruntime is not installed (it is in requirements.txt).
        ModelFileError: If ONNX Runtime cannot load it (cut short, not an ONNX model).
    """
    _require_file(path, "ONNX")
    try:
        import onnxruntime
    except ImportError as err:
        raise ImportError("running an ONNX file needs ONNX Runtime: pip install onnxruntime "
                          "(in requirements.txt)") from err
    try:
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's own types (InvalidProtobuf, Fail, ...)
        raise ModelFileError(f"cannot load ONNX file {path}: {str(err).splitlines()[0]} "
                             f"(cut short, or not an .onnx written by export.py?)") from err
    declared = session.get_inputs()[0]
    return ((lambda images: session.run(None, {declared.name: images})[0]),
            declared_shape(declared.shape))


def chunks(items, batch_size: int):
    """Consecutive slices of at most ``batch_size`` items (of an array or a list)."""
    return (items[start:start + batch_size] for start in range(0, len(items), batch_size))


def check_input_shape(shape: tuple[int, ...], declared: tuple[int | None, ...] | None, kind: str,
                      path: str) -> None:
    """Compare an input's shape with the one a model declares (None: any size there).

    Args:
        shape: The input's shape, (N, 3, H, W).
        declared: The model's input shape; None when unknown (no check).
        kind: ``MindIR`` or ``ONNX``, for the message.
        path: The model file, for the message.

    Raises:
        ModelInputError: If the rank or a fixed dimension differs; names the file, both
            shapes and the options to fix.
    """
    if declared is None:
        return
    if len(shape) == len(declared) and all(d is None or d == s for s, d in zip(shape, declared)):
        return
    expected = tuple("any" if d is None else d for d in declared)
    raise ModelInputError(f"{kind} file {path} was exported for input shape {expected} but "
                          f"gets {tuple(shape)}: pass the --batch_size and --eval_image_size it "
                          f"was exported with (export.py --dynamic_batch true: any batch_size)")


def is_shape_inference_error(err: BaseException) -> bool:
    """Whether ``err`` is MindSpore's failure to infer the graph's shapes for an input (the
    error of a MindIR run on images of a size it cannot take)."""
    return isinstance(err, RuntimeError) and "InferPrimitiveShape" in str(err)


def batched(forward: Forward, batch_size: int, kind: str, path: str,
            input_shape: tuple[int | None, ...] | None = None) -> Forward:
    """``forward`` (numpy -> numpy) of an exported model: any number of images, run in chunks
    of ``batch_size``. A model that declares a fixed batch takes exactly ``batch_size``
    images: the last chunk is zero-padded, the padding dropped from the result. A model that
    declares a symbolic batch (``dynamic_batch`` exports) gets the last chunk as it is.

    Args:
        forward: float32 (batch_size, 3, H, W) -> logits (batch_size, K); with a symbolic
            batch (n, 3, H, W) -> (n, K), any n.
        batch_size: The batch size the model was exported with; with a symbolic batch, the
            images per forward pass (at most).
        kind: ``MindIR`` or ``ONNX``, for messages.
        path: The model file, for messages.
        input_shape: The input shape the model declares (None in a dimension: any size).
            Unknown (None): a MindSpore shape-inference failure of ``forward`` is reported
            as a shape mismatch.

    Returns:
        float32 (N, 3, H, W) -> logits (N, K), any N.

    Raises:
        ModelInputError: (from the returned function) If the images do not have the model's
            input shape. Any other failure of ``forward`` propagates unchanged.
    """
    fixed_batch = input_shape is None or input_shape[0] is not None

    def run(images):
        outputs = []
        for chunk in chunks(images, batch_size):
            count = len(chunk)
            pad = batch_size - count if fixed_batch else 0
            if pad:
                chunk = np.concatenate([chunk, np.zeros((pad,) + chunk.shape[1:], chunk.dtype)])
            check_input_shape(chunk.shape, input_shape, kind, path)
            try:
                outputs.append(forward(chunk)[:count])
            except RuntimeError as err:
                if input_shape is not None or not is_shape_inference_error(err):
                    raise
                raise ModelInputError(f"{kind} file {path} cannot take input of shape "
                                      f"{chunk.shape}: pass the --batch_size and --eval_image_size "
                                      f"it was exported with ({str(err).splitlines()[0]})"
                                      ) from err
        return np.concatenate(outputs)
    return run


def checkpoint_predictor(checkpoint_path: str, *, net_name: str, class_num: int,
                         batch_size: int, use_ema: bool, device_target: str | None,
                         stem_pool_pad_mode: str) -> Forward:
    """A checkpoint (or Hub weights) in MindSpore (``load_network``'s arguments), run
    ``batch_size`` images at a time."""
    net = load_network(net_name, class_num, checkpoint_path, use_ema=use_ema,
                       device_target=device_target, stem_pool_pad_mode=stem_pool_pad_mode)
    return lambda images: np.concatenate([net(ms.Tensor(chunk)).asnumpy()
                                          for chunk in chunks(images, batch_size)])


def mindir_predictor(checkpoint_path: str, *, batch_size: int, **network) -> Forward:
    """A ``.mindir`` in ``nn.GraphCell``, run in chunks of ``batch_size`` (``batched``); the
    ``network`` arguments are unused (the graph holds them)."""
    del network
    graph = load_mindir(checkpoint_path)
    return batched(lambda x: graph(ms.Tensor(x)).asnumpy(), batch_size, "MindIR",
                   checkpoint_path, mindir_input_shape(checkpoint_path))


def onnx_predictor(checkpoint_path: str, *, batch_size: int, **network) -> Forward:
    """An ``.onnx`` in ONNX Runtime, run in chunks of ``batch_size`` (``batched``); the
    ``network`` arguments are unused (the graph holds them)."""
    del network
    forward, shape = load_onnx(checkpoint_path)
    return batched(forward, batch_size, "ONNX", checkpoint_path, shape)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of a float array (N, K), numerically stable."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)
