"""Loading models for eval.py, export.py and predict.py (a checkpoint into a network; the
predictors of ``src.deploy.formats``), and images read as the eval pipeline reads them."""
import logging
import os
from collections.abc import Callable, Iterable, Iterator

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
from src.data.settings import EvalPreprocess
from src.data.transforms import create_transforms
from src.deploy.outputs import model_probabilities
from src.models.resnet import create_network
from src.models.tta import TTA_MODES, with_tta
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
    """A network with a checkpoint loaded strictly, in inference mode: float32 (N, 3, H, W)
    -> logits (N, class_num); a log line says whether its EMA or live weights were loaded.

    ``checkpoint_path``: a ``.ckpt`` or Hub weights (``src.utils.hub``); ``device_target``
    picks the stem max-pool form (None: as built); ``stem_pool_pad_mode`` ``same`` for
    MindCV's checkpoints.

    Raises:
        ConfigError, MissingFileError, CheckpointMismatchError: If ``checkpoint_path`` is
            empty, missing, or of another network.
    """
    if not checkpoint_path:
        raise ConfigError("checkpoint_path is empty: give --checkpoint_path FILE.ckpt")
    net = create_network(net_name, class_num=class_num, device_target=device_target,
                         stem_pool_pad_mode=stem_pool_pad_mode)
    _, ema = load_into_network(net, checkpoint_path, use_ema=use_ema)
    LOGGER.info("%s: %s", checkpoint_path, "its EMA weights (use_ema true)" if ema else
                "its network weights" + (" (it holds no EMA)" if use_ema else
                                         " (use_ema false)"))
    net.set_train(False)
    return net


def list_images(image_path: str) -> list[str]:
    """An image file, or the images of a folder (sorted), as a list of paths: those directly
    in it and in its sub-folders, as eval reads a data folder (docs/deployment.md#prediction);
    deeper folders and other files are skipped with a warning counting them.

    Raises:
        MissingFileError, ImageFolderError: If there are no images, or unreadable entries.
    """
    if os.path.isfile(image_path):
        return [image_path]
    if not os.path.isdir(image_path):
        raise MissingFileError(f"image_path {image_path!r} is neither a file nor a folder")
    extensions = {e.lower() for e in IMAGE_EXTENSIONS}

    def is_image(name: str) -> bool:
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


def preprocess_images(paths: list[str], preprocess: EvalPreprocess | None = None) -> np.ndarray:
    """Read and preprocess images exactly as the eval pipeline does.

    Args:
        paths (list[str]): Image files (JPEG, PNG, BMP).
        preprocess (EvalPreprocess, optional): Resize, crop, filter, EXIF, normalization;
            default ``EvalPreprocess()``.

    Returns:
        numpy.ndarray: float32 (len(paths), 3, image_size, image_size), normalized.

    Raises:
        ImageFolderError: If a file cannot be read (permission) or decoded as an image (names
            the file).
    """
    ops = create_transforms(preprocess or EvalPreprocess())
    batch = []
    for path in paths:
        try:
            data = np.fromfile(path, dtype=np.uint8)
        except OSError as err:  # permission, a folder, a link to a missing file
            raise ImageFolderError(f"cannot read image {path}: {err.strerror or err}") from err
        batch.append(preprocess_encoded(data, ops, path))
    return np.stack(batch).astype(np.float32)


def preprocess_encoded(data: np.ndarray | bytes, ops: list, name: str) -> np.ndarray:
    """One encoded image (a file's bytes, as uint8 (n,) or ``bytes``) through the eval ops
    (``create_transforms`` of an ``EvalPreprocess``): what ``preprocess_images`` does with
    each file's contents, for images that come as bytes (serve.py).

    Returns:
        numpy.ndarray: float32 (3, image_size, image_size), normalized.

    Raises:
        ImageFolderError: If it cannot be decoded as an image, or has more pixels than the
            limit (``set_max_image_pixels``; names ``name``).
    """
    image = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
    try:
        for op in ops:  # one by one: eager Compose wraps PIL-path results in a tuple
            image = op(image)
    except (RuntimeError, ValueError, OSError) as err:
        raise ImageFolderError(f"cannot decode image {name}: "
                               f"{str(err).splitlines()[0]}") from err
    return image


def _require_file(path: str, kind: str) -> None:
    if not os.path.isfile(path):
        raise MissingFileError(f"{kind} file not found: {path}")


def load_mindir(path: str) -> nn.GraphCell:
    """A MindIR file as a callable ``nn.GraphCell``.

    Raises:
        MissingFileError, ModelFileError: If it is missing, or MindSpore cannot load it.
    """
    _require_file(path, "MindIR")
    try:
        graph = ms.load(path)
    except (RuntimeError, ValueError) as err:
        raise ModelFileError(f"cannot load MindIR file {path}: {str(err).splitlines()[0]} "
                             f"(cut short, or not a .mindir written by export.py?)") from err
    return ms.nn.GraphCell(graph)


def declared_shape(dims: Iterable[int | str | None] | None) -> tuple[int | None, ...] | None:
    """Declared input dimensions as a tuple (None where not a fixed positive int: any size),
    or None when none are declared."""
    return tuple(d if isinstance(d, int) and d > 0 else None for d in dims or ()) or None


def mindir_input_shape(path: str) -> tuple[int | None, ...] | None:
    """The input shape a MindIR file declares (``declared_shape``), read from the protobuf;
    None if it cannot be read so (another layout, an encrypted file)."""
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
    """An ONNX file in ONNX Runtime (CPU): the model as a ``Forward`` and the input shape it
    declares (``declared_shape``).

    Raises:
        MissingFileError, ModelFileError, ImportError: If it is missing or does not load, or
            onnxruntime is not installed.
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


def chunks(items: np.ndarray | list, batch_size: int) -> Iterator[np.ndarray | list]:
    """Consecutive slices of at most ``batch_size`` items (of an array or a list)."""
    return (items[start:start + batch_size] for start in range(0, len(items), batch_size))


def check_input_shape(shape: tuple[int, ...], declared: tuple[int | None, ...] | None, kind: str,
                      path: str) -> None:
    """Compare an input's shape (N, 3, H, W) with the one a model declares (None: unknown;
    None in a dimension: any size); ``kind`` and ``path`` name the model.

    Raises:
        ModelInputError: If the rank or a fixed dimension differs (names both shapes and
            the options to fix).
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
    """Whether ``err`` is MindSpore's failure to infer a graph's shapes for an input."""
    return isinstance(err, RuntimeError) and "InferPrimitiveShape" in str(err)


def batched(forward: Forward, batch_size: int, kind: str, path: str,
            input_shape: tuple[int | None, ...] | None = None) -> Forward:
    """``forward`` of an exported model for any number N of images, run in chunks of
    ``batch_size``: with a fixed declared batch the last chunk is zero-padded (the padding
    dropped), with a symbolic one it runs as it is.

    ``kind`` and ``path`` name the model in messages; ``input_shape`` is the declared one
    (``check_input_shape``), unknown (None): a MindSpore shape-inference failure is reported
    as a shape mismatch (``ModelInputError``, raised by the returned function).
    """
    fixed_batch = input_shape is None or input_shape[0] is not None

    def run(images: np.ndarray) -> np.ndarray:
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
                         stem_pool_pad_mode: str, tta: str = TTA_MODES[0]) -> Forward:
    """A checkpoint in MindSpore (``load_network``) as ``tta`` evaluates it (``with_tta``),
    ``batch_size`` images at a time."""
    net = with_tta(load_network(net_name, class_num, checkpoint_path, use_ema=use_ema,
                                device_target=device_target,
                                stem_pool_pad_mode=stem_pool_pad_mode), tta)
    return lambda images: np.concatenate([net(ms.Tensor(chunk)).asnumpy()
                                          for chunk in chunks(images, batch_size)])


def mindir_predictor(checkpoint_path: str, *, batch_size: int, **network) -> Forward:
    """A ``.mindir`` in ``nn.GraphCell`` (``batched``)."""
    del network  # the graph holds it
    graph = load_mindir(checkpoint_path)
    return batched(lambda x: graph(ms.Tensor(x)).asnumpy(), batch_size, "MindIR",
                   checkpoint_path, mindir_input_shape(checkpoint_path))


def onnx_predictor(checkpoint_path: str, *, batch_size: int, **network) -> Forward:
    """An ``.onnx`` in ONNX Runtime (``batched``)."""
    del network  # the graph holds it
    forward, shape = load_onnx(checkpoint_path)
    return batched(forward, batch_size, "ONNX", checkpoint_path, shape)


def predict_in_batches(predict, paths, batch_size, preprocess, *, model):
    """Classify images a batch at a time: only ``batch_size`` images are read and held at
    once, whatever the number of paths. Probabilities as the ``model`` record says
    (``model_probabilities``: its task's softmax or sigmoid, its calibration temperature).

    Args:
        predict (callable): float32 (N, 3, image_size, image_size) -> logits (N, K), e.g.
            ``load_predictor``'s.
        paths (list[str]): Image files.
        batch_size (int): Images read, preprocessed and predicted together.
        preprocess (EvalPreprocess): The eval preprocessing (``preprocess_images``).
        model (ModelRecord): The model's record (its task and temperature).

    Yields:
        tuple(list[str], numpy.ndarray, numpy.ndarray): The paths of a batch, their logits and
        their class probabilities, float (len(batch), K).
    """
    for batch in chunks(paths, batch_size):
        logits = predict(preprocess_images(batch, preprocess))
        yield batch, logits, model_probabilities(logits, model)
