"""Inference helpers shared by eval.py, export.py and predict.py: loading a .ckpt, .mindir or
.onnx model as a function of numpy images, and reading images as the eval pipeline does.

A ``.ckpt`` runs in MindSpore (``runtime: mindspore``) or, with ``runtime: onnxruntime``, is
exported on first use to a temporary dynamic-batch ONNX file (BatchNorms folded, the
exportable stem max pool: ``src.deploy.exporting``) that ONNX Runtime loads (the folder is
removed at once): the fast path on CPU (``_checkpoint_onnx_predictor``).
"""
import logging
import os
import tempfile

import mindspore as ms
import numpy as np

from src.data.image_check import (
    IMAGE_EXTENSIONS,
    ImageFolderError,
    list_folder,
    listing_text,
    nested_note,
)
from src.data.transforms import create_transforms
from src.deploy.exporting import SUFFIXES, export_model
from src.models.bn_fold import fold_batchnorm
from src.models.resnet import create_network
from src.utils.checkpoint import load_into_network
from src.utils.config import ConfigError
from src.utils.errors import MissingFileError, UserError, WriteError
from src.utils.hub import is_pretrained_source

LOGGER = logging.getLogger(__name__)


class ModelFileError(UserError):
    """A model file (.mindir, .onnx) exists but cannot be loaded."""


class ModelInputError(UserError, ValueError):
    """Images do not have the input shape an exported model was exported with."""


def load_network(net_name, class_num, checkpoint_path, use_ema=True, device_target=None,
                 stem_pool_pad_mode="pad"):
    """Build a network, load a checkpoint into it strictly and switch to inference mode.

    A log line says whether the checkpoint's weight EMA (``ema_decay`` runs) or its live
    weights were loaded.

    Args:
        net_name (str): Architecture (``resnet18`` .. ``resnet152``).
        class_num (int): Classifier outputs.
        checkpoint_path (str): ``.ckpt`` file, or Hub weights (``hf-hub:`` id, safetensors
            folder or file: ``src.utils.hub``).
        use_ema (bool): Load the EMA weights when the checkpoint holds them.
        device_target (str, optional): Picks the stem max-pool form for that device
            (``src.models.stem_pool.STEM_MAX_POOLS``); None: the built form (for ``pad``
            torch's).
        stem_pool_pad_mode (str): ``pad`` or ``same`` (MindCV's stem pool): the one the
            checkpoint was trained with (MindCV's checkpoints: ``same``).

    Returns:
        nn.Cell: The network in inference mode: float32 (N, 3, H, W) -> logits (N, class_num).

    Raises:
        ConfigError: If ``checkpoint_path`` is empty.
        MissingFileError: If the checkpoint does not exist.
        CheckpointMismatchError: If the checkpoint is of another depth or class count.
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


def list_images(image_path):
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
                          f"was exported with (export.py --dynamic_batch true: any batch_size)")


def is_shape_inference_error(err):
    """Whether ``err`` is MindSpore's failure to infer the graph's shapes for an input (the
    error of a MindIR run on images of a size it cannot take)."""
    return isinstance(err, RuntimeError) and "InferPrimitiveShape" in str(err)


def batched(forward, batch_size, kind, path, input_shape=None):
    """``forward`` (numpy -> numpy) of an exported model: any number of images, run in chunks
    of ``batch_size``. A model that declares a fixed batch takes exactly ``batch_size``
    images: the last chunk is zero-padded, the padding dropped from the result. A model that
    declares a symbolic batch (``dynamic_batch`` exports) gets the last chunk as it is.

    Args:
        forward (callable): float32 (batch_size, 3, H, W) -> logits (batch_size, K); with a
            symbolic batch (n, 3, H, W) -> (n, K), any n.
        batch_size (int): The batch size the model was exported with; with a symbolic
            batch, the images per forward pass (at most).
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


def _checkpoint_predictor(checkpoint_path, net_name, class_num, batch_size, use_ema,
                          device_target, stem_pool_pad_mode):
    net = load_network(net_name, class_num, checkpoint_path, use_ema, device_target,
                       stem_pool_pad_mode)
    return lambda images: np.concatenate([net(ms.Tensor(chunk)).asnumpy()
                                          for chunk in chunks(images, batch_size)])


def _mindir_predictor(checkpoint_path, net_name, class_num, batch_size, use_ema,
                      device_target, stem_pool_pad_mode):
    del net_name, class_num, use_ema, device_target, stem_pool_pad_mode  # the graph holds them
    graph = load_mindir(checkpoint_path)
    return batched(lambda x: graph(ms.Tensor(x)).asnumpy(), batch_size, "MindIR",
                   checkpoint_path, mindir_input_shape(checkpoint_path))


def _onnx_predictor(checkpoint_path, net_name, class_num, batch_size, use_ema,
                    device_target, stem_pool_pad_mode):
    del net_name, class_num, use_ema, device_target, stem_pool_pad_mode  # the graph holds them
    forward, shape = load_onnx(checkpoint_path)
    return batched(forward, batch_size, "ONNX", checkpoint_path, shape)


def onnx_of_network(net, image_shape):
    """``net`` in ONNX Runtime: exported with a symbolic batch (``export_model``, which also
    gives it the exportable stem max pool) to a temporary folder that is removed once ONNX
    Runtime has loaded the file, whatever happens.

    Args:
        net (nn.Cell): The network in inference mode (BatchNorms folded or not).
        image_shape (tuple(int)): (3, H, W) of the images it will get.

    Returns:
        callable: float32 (n, 3, H, W) -> float32 logits (n, K), any n (``load_onnx``).

    Raises:
        WriteError: If no ONNX file could be written (a full disk: MindSpore's exporter only
            logs the failure); names the temporary folder's parent.
    """
    with tempfile.TemporaryDirectory(prefix="resnet-onnx-") as folder:
        path = os.path.join(folder, "model")
        export_model(net, ms.Tensor(np.zeros((2, *image_shape), np.float32)), path, "ONNX",
                     dynamic_batch=True)
        path += SUFFIXES["ONNX"]
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            raise WriteError(f"runtime onnxruntime: could not write the temporary ONNX file in "
                             f"{tempfile.gettempdir()} (disk full? MindSpore's log above may "
                             f"say more)")
        forward, _ = load_onnx(path)
    return forward


def _checkpoint_onnx_predictor(checkpoint_path, net_name, class_num, batch_size, use_ema,
                               device_target, stem_pool_pad_mode):
    """``runtime: onnxruntime``: the checkpoint's network with every BatchNorm folded
    (``fold_batchnorm``), exported to ONNX at the first call for the images' (3, H, W)
    (``onnx_of_network``) and run in ONNX Runtime, ``batch_size`` images per run, the last
    run as short as it is (symbolic batch)."""
    del device_target  # CPU (check_runtime); the graph gets the exportable stem pool
    net = load_network(net_name, class_num, checkpoint_path, use_ema, None, stem_pool_pad_mode)
    folded = fold_batchnorm(net)
    sessions = {}

    def run(images):
        shape = tuple(images.shape[1:])
        if shape not in sessions:
            sessions[shape] = onnx_of_network(net, shape)
            LOGGER.info("%s: runtime onnxruntime: exported to ONNX for input (batch, %s) with "
                        "%d BatchNorms folded, running in ONNX Runtime", checkpoint_path,
                        ", ".join(map(str, shape)), folded)
        return np.concatenate([sessions[shape](chunk) for chunk in chunks(images, batch_size)])
    return run


PREDICTORS = {".ckpt": _checkpoint_predictor, ".mindir": _mindir_predictor,
              ".onnx": _onnx_predictor}
"""The function that loads each kind of model file (``runtime: mindspore``; ONNX Runtime for
an ``.onnx``)."""

RUNTIMES = ("mindspore", "onnxruntime")
"""Values of ``runtime``: what runs a ``.ckpt``."""


def model_suffix(checkpoint_path):
    """The kind of model file by suffix: ``.ckpt`` for weights in any form (a ``.ckpt``, an
    ``hf-hub:`` id, a safetensors folder or file: ``src.utils.hub``), else the suffix."""
    if is_pretrained_source(checkpoint_path):
        return ".ckpt"
    return os.path.splitext(checkpoint_path)[1]


def model_runtime(checkpoint_path, runtime="mindspore"):
    """The runtime that runs a model file: ``onnxruntime`` for an ``.onnx``, ``mindspore``
    for a ``.mindir``, ``runtime`` for a ``.ckpt`` (for the output of eval and predict).

    Returns:
        str: ``mindspore`` or ``onnxruntime``.
    """
    return {".onnx": "onnxruntime", ".mindir": "mindspore"}.get(model_suffix(checkpoint_path),
                                                                  runtime)


def check_runtime(checkpoint_path, runtime, device_target=None):
    """Check ``runtime`` against the model file and the device before any slow work.

    Args:
        checkpoint_path (str): The model file (``.ckpt``, ``.mindir``, ``.onnx``).
        runtime (str): ``mindspore`` or ``onnxruntime`` (``RUNTIMES``).
        device_target (str, optional): ``CPU``, ``GPU`` or ``Ascend``; None: not checked.

    Raises:
        ConfigError: If ``runtime`` is not in ``RUNTIMES``; if it is ``onnxruntime`` with a
            ``device_target`` other than CPU (the onnxruntime package of requirements.txt is
            ONNX Runtime's CPU build) or with a ``.mindir`` (MindSpore's own format). Names
            the keys, their values and what to pass instead.
    """
    if runtime not in RUNTIMES:
        raise ConfigError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    if runtime != "onnxruntime":
        return
    if device_target not in (None, "CPU"):
        raise ConfigError(f"runtime onnxruntime runs on the CPU (the onnxruntime package of "
                          f"requirements.txt is ONNX Runtime's CPU build) but device_target is "
                          f"{device_target}: pass --device_target CPU, or --runtime mindspore")
    if os.path.splitext(checkpoint_path)[1] == SUFFIXES["MINDIR"]:
        raise ConfigError(f"runtime onnxruntime cannot run checkpoint_path {checkpoint_path!r}: "
                          f"a .mindir runs in MindSpore only; pass --runtime mindspore, or the "
                          f".ckpt (exported to ONNX on the fly) or an .onnx export")


def load_predictor(checkpoint_path, net_name, class_num, batch_size, use_ema=True,
                   device_target=None, stem_pool_pad_mode="pad", runtime="mindspore"):
    """A model file as a function: float32 numpy images (N, 3, image_size, image_size),
    preprocessed as in eval -> float32 numpy logits (N, class_num), any N.

    Args:
        checkpoint_path (str): ``.ckpt`` or Hub weights (``hf-hub:`` id, safetensors folder
            or file), run in MindSpore, or ONNX Runtime with ``runtime``; ``.mindir``
            (``nn.GraphCell``) or ``.onnx`` (ONNX Runtime).
        net_name (str): ``.ckpt`` only: the architecture.
        class_num (int): ``.ckpt`` only: the classifier outputs.
        batch_size (int): Images per forward pass, at most. An exported model with a fixed
            batch takes exactly the batch size it was exported with: give that one; any N
            is run in such chunks. One exported with ``dynamic_batch`` takes any.
        use_ema (bool): ``.ckpt`` only: its EMA weights when it holds them.
        device_target (str, optional): ``.ckpt`` only: the stem max-pool form
            (``load_network``); with ``runtime`` onnxruntime it must be CPU or None.
        stem_pool_pad_mode (str): ``.ckpt`` only: ``pad`` or ``same`` (``load_network``).
        runtime (str): ``.ckpt`` only: ``mindspore``, or ``onnxruntime``: exported to a
            temporary ONNX file at the first call (``_checkpoint_onnx_predictor``). An
            ``.onnx`` runs in ONNX Runtime with either value; a ``.mindir`` needs
            ``mindspore``.

    Raises:
        ConfigError: If the suffix is none of these (names the file), or ``runtime`` does
            not fit the file or ``device_target`` (``check_runtime``).
        MissingFileError, CheckpointMismatchError: As ``load_network`` / ``load_mindir`` /
            ``load_onnx``.
    """
    suffix = model_suffix(checkpoint_path)
    if suffix not in PREDICTORS:
        raise ConfigError(f"checkpoint_path {checkpoint_path!r}: expected a "
                          f"{', '.join(PREDICTORS)} file")
    check_runtime(checkpoint_path, runtime, device_target)
    load = (_checkpoint_onnx_predictor if suffix == ".ckpt" and runtime == "onnxruntime"
            else PREDICTORS[suffix])
    return load(checkpoint_path, net_name, class_num, batch_size, use_ema, device_target,
                stem_pool_pad_mode)


def softmax(logits):
    """Row-wise softmax of a float array (N, K), numerically stable."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)
