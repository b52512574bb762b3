"""Inference helpers shared by eval.py, export.py and predict.py: loading a .ckpt, .mindir or
.onnx model as a function of numpy images, and reading images as the eval pipeline does."""
import logging
import os

import mindspore as ms
import numpy as np

from src.data.image_check import IMAGE_EXTENSIONS, ImageFolderError, scan_folder
from src.data.transforms import create_transforms
from src.models.resnet import create_network
from src.utils.checkpoint import load_into_network
from src.utils.config import ConfigError
from src.utils.errors import MissingFileError, UserError

LOGGER = logging.getLogger(__name__)


class ModelFileError(UserError):
    """A model file (.mindir, .onnx) exists but cannot be loaded."""


class ModelInputError(UserError, ValueError):
    """Images do not have the input shape an exported model was exported with."""


def load_network(net_name, class_num, checkpoint_path, use_ema=True, device_target=None):
    """Build a network, load a checkpoint into it strictly and switch to inference mode.

    A log line says whether the checkpoint's weight EMA (``ema_decay`` runs) or its live
    weights were loaded.

    Args:
        net_name (str): Architecture (``resnet18`` .. ``resnet152``).
        class_num (int): Classifier outputs.
        checkpoint_path (str): ``.ckpt`` file.
        use_ema (bool): Load the EMA weights when the checkpoint holds them.
        device_target (str, optional): Picks the stem max-pool form for that device
            (``src.models.resnet.STEM_MAX_POOLS``); None: torch's form.

    Returns:
        nn.Cell: The network in inference mode: float32 (N, 3, H, W) -> logits (N, class_num).

    Raises:
        ConfigError: If ``checkpoint_path`` is empty.
        MissingFileError: If the checkpoint does not exist.
        CheckpointMismatchError: If the checkpoint is of another depth or class count.
    """
    if not checkpoint_path:
        raise ConfigError("checkpoint_path is empty: give --checkpoint_path FILE.ckpt")
    net = create_network(net_name, class_num, device_target=device_target)
    _, ema = load_into_network(net, checkpoint_path, use_ema=use_ema)
    LOGGER.info("%s: %s", checkpoint_path, "its EMA weights (use_ema true)" if ema else
                "its network weights" + (" (it holds no EMA)" if use_ema else
                                         " (use_ema false)"))
    net.set_train(False)
    return net


def list_images(image_path):
    """An image file, or the images of a folder (sorted, recursive), as a list of paths.

    In a folder, the image extensions (``IMAGE_EXTENSIONS``) match in any case (``.Jpg``
    too: Pillow reads them); the other files, and hidden ones, are skipped with one warning
    that counts them by extension.

    Raises:
        MissingFileError: If the path does not exist or the folder holds no images.
    """
    if os.path.isfile(image_path):
        return [image_path]
    if not os.path.isdir(image_path):
        raise MissingFileError(f"image_path {image_path!r} is neither a file nor a folder")
    extensions = {e.lower() for e in IMAGE_EXTENSIONS}
    found, skipped = [], {}
    for root, _, names in walk_images(image_path):
        for name in names:
            ext = os.path.splitext(name)[1]
            if ext.lower() in extensions and not name.startswith("."):
                found.append(os.path.join(root, name))
            else:
                key = "hidden" if name.startswith(".") else ext or "no extension"
                skipped[key] = skipped.get(key, 0) + 1
    if skipped:
        LOGGER.warning("image_path %s: skipped %d files that are not images (%s)", image_path,
                       sum(skipped.values()),
                       ", ".join(f"{k}: {n}" for k, n in sorted(skipped.items())))
    if not found:
        raise MissingFileError(f"no images ({', '.join(IMAGE_EXTENSIONS[:4])}) in {image_path}")
    return sorted(found)


def walk_images(top):
    """``os.walk`` of ``top`` (links to folders not followed, as ``os.walk``), its files
    listed by ``scan_folder``: a link that cannot be followed is an ``ImageFolderError``
    naming it."""
    folders, files = scan_folder(top)
    yield top, folders, files
    for name in folders:
        path = os.path.join(top, name)
        if not os.path.islink(path):
            yield from walk_images(path)


def preprocess_images(paths, image_size=224, eval_resize=256):
    """Read and preprocess images exactly as the eval pipeline does.

    Args:
        paths (list[str]): Image files (JPEG, PNG, BMP).
        image_size (int): Center crop, pixels.
        eval_resize (int): Shorter side before the crop, pixels.

    Returns:
        numpy.ndarray: float32 (len(paths), 3, image_size, image_size), normalized.

    Raises:
        ImageFolderError: If a file cannot be decoded as an image (names the file).
    """
    ops = create_transforms(False, image_size, eval_resize)
    batch = []
    for path in paths:
        image = np.fromfile(path, dtype=np.uint8)
        try:
            for op in ops:  # one by one: eager Compose wraps PIL-path results in a tuple
                image = op(image)
        except (RuntimeError, ValueError, OSError) as err:
            raise ImageFolderError(f"cannot decode image {path}: "
                                   f"{str(err).splitlines()[0]}") from err
        batch.append(image)
    return np.stack(batch).astype(np.float32)


def _require_file(path, kind):
    if not os.path.isfile(path):
        raise MissingFileError(f"{kind} file not found: {path}")


def load_mindir(path):
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


def declared_shape(dims):
    """A model's declared input dimensions as a tuple, or None when it declares none; a
    dimension that is not a fixed positive int (symbolic, -1 or 0: dynamic) becomes None
    ("any size")."""
    return tuple(d if isinstance(d, int) and d > 0 else None for d in dims or ()) or None


def mindir_input_shape(path):
    """The input shape a MindIR file declares (its graph's first input), read from the
    protobuf; None if it cannot be read so (another MindIR layout, an encrypted file).

    Returns:
        tuple or None: e.g. (batch_size, 3, image_size, image_size); None in a dynamic
        dimension.
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


def load_onnx(path):
    """An ONNX file in ONNX Runtime (CPU).

    Returns:
        tuple(callable, tuple or None): the model as a function float32 (N, 3, H, W) ->
        logits, and the input shape it declares (``declared_shape``: a symbolic batch is
        None).

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


def chunks(items, batch_size):
    """Consecutive slices of at most ``batch_size`` items (of an array or a list)."""
    return (items[start:start + batch_size] for start in range(0, len(items), batch_size))


def check_input_shape(shape, declared, kind, path):
    """Compare an input's shape with the one a model declares (None: any size there).

    Args:
        shape (tuple(int)): The input's shape, (N, 3, H, W).
        declared (tuple or None): The model's input shape; None when unknown (no check).
        kind (str): ``MindIR`` or ``ONNX``, for the message.
        path (str): The model file, for the message.

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
                          f"was exported with")


def is_shape_inference_error(err):
    """Whether ``err`` is MindSpore's failure to infer the graph's shapes for an input (the
    error of a MindIR run on images of a size it cannot take)."""
    return isinstance(err, RuntimeError) and "InferPrimitiveShape" in str(err)


def batched(forward, batch_size, kind, path, input_shape=None):
    """``forward`` (numpy -> numpy) of an exported model that takes exactly ``batch_size``
    images: any number of images, run in chunks of ``batch_size`` (the last zero-padded, the
    padding dropped from the result).

    Args:
        forward (callable): float32 (batch_size, 3, H, W) -> logits (batch_size, K).
        batch_size (int): The batch size the model was exported with.
        kind (str): ``MindIR`` or ``ONNX``, for messages.
        path (str): The model file, for messages.
        input_shape (tuple, optional): The input shape the model declares (None in a
            dimension: any size). Unknown (None): a MindSpore shape-inference failure of
            ``forward`` is reported as a shape mismatch.

    Returns:
        callable: float32 (N, 3, H, W) -> logits (N, K), any N.

    Raises:
        ModelInputError: (from the returned function) If the images do not have the model's
            input shape. Any other failure of ``forward`` propagates unchanged.
    """
    def run(images):
        outputs = []
        for chunk in chunks(images, batch_size):
            pad = batch_size - len(chunk)
            if pad:
                chunk = np.concatenate([chunk, np.zeros((pad,) + chunk.shape[1:], chunk.dtype)])
            check_input_shape(chunk.shape, input_shape, kind, path)
            try:
                outputs.append(forward(chunk)[:batch_size - pad])
            except RuntimeError as err:
                if input_shape is not None or not is_shape_inference_error(err):
                    raise
                raise ModelInputError(f"{kind} file {path} cannot take input of shape "
                                      f"{chunk.shape}: pass the --batch_size and --eval_image_size "
                                      f"it was exported with ({str(err).splitlines()[0]})"
                                      ) from err
        return np.concatenate(outputs)
    return run


def _checkpoint_predictor(checkpoint_path, net_name, class_num, batch_size, use_ema,
                          device_target):
    net = load_network(net_name, class_num, checkpoint_path, use_ema, device_target)
    return lambda images: np.concatenate([net(ms.Tensor(chunk)).asnumpy()
                                          for chunk in chunks(images, batch_size)])


def _mindir_predictor(checkpoint_path, net_name, class_num, batch_size, use_ema,
                      device_target):
    del net_name, class_num, use_ema, device_target  # the graph holds them
    graph = load_mindir(checkpoint_path)
    return batched(lambda x: graph(ms.Tensor(x)).asnumpy(), batch_size, "MindIR",
                   checkpoint_path, mindir_input_shape(checkpoint_path))


def _onnx_predictor(checkpoint_path, net_name, class_num, batch_size, use_ema,
                    device_target):
    del net_name, class_num, use_ema, device_target  # the graph holds them
    forward, shape = load_onnx(checkpoint_path)
    return batched(forward, batch_size, "ONNX", checkpoint_path, shape)


PREDICTORS = {".ckpt": _checkpoint_predictor, ".mindir": _mindir_predictor,
              ".onnx": _onnx_predictor}


def load_predictor(checkpoint_path, net_name, class_num, batch_size, use_ema=True,
                   device_target=None):
    """A model file as a function: float32 numpy images (N, 3, image_size, image_size),
    preprocessed as in eval -> float32 numpy logits (N, class_num), any N.

    Args:
        checkpoint_path (str): ``.ckpt`` (MindSpore), ``.mindir`` (``nn.GraphCell``) or
            ``.onnx`` (ONNX Runtime).
        net_name (str): ``.ckpt`` only: the architecture.
        class_num (int): ``.ckpt`` only: the classifier outputs.
        batch_size (int): ``.ckpt``: images per forward pass, at most. Exported models take
            exactly the batch size they were exported with: give that one; any N is run in
            such chunks.
        use_ema (bool): ``.ckpt`` only: its EMA weights when it holds them.
        device_target (str, optional): ``.ckpt`` only: the stem max-pool form
            (``load_network``).

    Raises:
        ConfigError: If the suffix is none of these (names the file).
        MissingFileError, CheckpointMismatchError: As ``load_network`` / ``load_mindir`` /
            ``load_onnx``.
    """
    suffix = os.path.splitext(checkpoint_path)[1]
    if suffix not in PREDICTORS:
        raise ConfigError(f"checkpoint_path {checkpoint_path!r}: expected a "
                          f"{', '.join(PREDICTORS)} file")
    return PREDICTORS[suffix](checkpoint_path, net_name, class_num, batch_size, use_ema,
                              device_target)


def softmax(logits):
    """Row-wise softmax of a float array (N, K), numerically stable."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)
