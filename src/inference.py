"""Inference helpers shared by eval.py, export.py and predict.py."""
import os

import mindspore as ms
import numpy as np

from src.checkpoint import load_into_network
from src.config import ConfigError
from src.dataset import create_transforms
from src.image_check import IMAGE_EXTENSIONS
from src.resnet import create_network


def load_network(cfg):
    """Build ``cfg.net_name`` with ``cfg.class_num`` classes, load ``cfg.checkpoint_path``
    strictly and switch to inference mode.

    Raises:
        FileNotFoundError: If the checkpoint does not exist.
        CheckpointMismatchError: If the checkpoint is of another depth or class count.
    """
    if not cfg.checkpoint_path:
        raise FileNotFoundError("checkpoint_path is empty: give --checkpoint_path FILE.ckpt")
    net = create_network(cfg.net_name, cfg.class_num)
    load_into_network(net, cfg.checkpoint_path)
    net.set_train(False)
    return net


def list_images(image_path):
    """An image file, or the images of a folder (sorted, recursive), as a list of paths.

    Raises:
        FileNotFoundError: If the path does not exist or the folder holds no images.
    """
    if os.path.isfile(image_path):
        return [image_path]
    if not os.path.isdir(image_path):
        raise FileNotFoundError(f"image_path {image_path!r} is neither a file nor a folder")
    found = sorted(os.path.join(root, name) for root, _, names in os.walk(image_path)
                   for name in names
                   if os.path.splitext(name)[1] in IMAGE_EXTENSIONS and not name.startswith("."))
    if not found:
        raise FileNotFoundError(f"no images ({', '.join(IMAGE_EXTENSIONS[:4])}) in {image_path}")
    return found


def preprocess_images(paths, image_size=224, eval_resize=256):
    """Read and preprocess images exactly as the eval pipeline does.

    Returns:
        numpy.ndarray: float32 (len(paths), 3, image_size, image_size), normalized.

    Raises:
        ValueError: If a file cannot be decoded as an image (names the file).
    """
    ops = create_transforms(False, image_size, eval_resize)
    batch = []
    for path in paths:
        image = np.fromfile(path, dtype=np.uint8)
        try:
            for op in ops:  # one by one: eager Compose wraps PIL-path results in a tuple
                image = op(image)
        except (RuntimeError, ValueError, OSError) as err:
            raise ValueError(f"cannot decode image {path}: {str(err).splitlines()[0]}") from err
        batch.append(image)
    return np.stack(batch).astype(np.float32)


def load_mindir(path):
    """A MindIR file as a callable ``nn.GraphCell``.

    Raises:
        FileNotFoundError: If the file does not exist.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"MindIR file not found: {path}")
    return ms.nn.GraphCell(ms.load(path))


def load_onnx(path):
    """An ONNX file as a function float32 (N, 3, H, W) -> logits, run by ONNX Runtime.

    Raises:
        FileNotFoundError: If the file does not exist.
        ValueError: If onnxruntime is not installed.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"ONNX file not found: {path}")
    try:
        import onnxruntime
    except ImportError as err:
        raise ValueError("running an ONNX file needs ONNX Runtime: pip install onnxruntime") from err
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda images: session.run(None, {name: images})[0]


def chunks(images, batch_size):
    """Consecutive slices of at most ``batch_size`` images."""
    return (images[start:start + batch_size] for start in range(0, len(images), batch_size))


def batched(forward, batch_size, kind, path):
    """``forward`` (numpy -> numpy) for an exported model that takes exactly ``batch_size``
    images: any number of images, run in chunks of ``batch_size`` (the last zero-padded, the
    padding dropped from the result).

    Raises:
        ValueError: If the model rejects the input (names the file and the expected shape).
    """
    def run(images):
        outputs = []
        for chunk in chunks(images, batch_size):
            pad = batch_size - len(chunk)
            if pad:
                chunk = np.concatenate([chunk, np.zeros((pad,) + chunk.shape[1:], chunk.dtype)])
            try:
                outputs.append(forward(chunk)[:batch_size - pad])
            except Exception as err:  # noqa: BLE001  (MindSpore, ONNX Runtime: own types)
                raise ValueError(f"{kind} {path} rejected input of shape {chunk.shape}: pass the "
                                 f"--batch_size and --image_size it was exported with "
                                 f"({str(err).splitlines()[0]})") from err
        return np.concatenate(outputs)
    return run


def _checkpoint_predictor(cfg):
    net = load_network(cfg)
    return lambda images: np.concatenate([net(ms.Tensor(chunk)).asnumpy()
                                          for chunk in chunks(images, cfg.batch_size)])


def _mindir_predictor(cfg):
    graph = load_mindir(cfg.checkpoint_path)
    return batched(lambda x: graph(ms.Tensor(x)).asnumpy(), cfg.batch_size, "MindIR",
                   cfg.checkpoint_path)


def _onnx_predictor(cfg):
    return batched(load_onnx(cfg.checkpoint_path), cfg.batch_size, "ONNX model",
                   cfg.checkpoint_path)


PREDICTORS = {".ckpt": _checkpoint_predictor, ".mindir": _mindir_predictor,
              ".onnx": _onnx_predictor}


def load_predictor(cfg):
    """The model in ``cfg.checkpoint_path`` as a function: float32 numpy images (N, 3,
    image_size, image_size), preprocessed as in eval -> float32 numpy logits (N, class_num).

    ``.ckpt``: ``cfg.net_name`` / ``cfg.class_num``, run in batches of at most
    ``cfg.batch_size``. ``.mindir``: ``nn.GraphCell``; ``.onnx``: ONNX Runtime. Exported models
    take exactly the batch size they were exported with: give it as ``cfg.batch_size``; any N
    is run in such chunks.

    Raises:
        ValueError: If the suffix is none of these (a ``ConfigError`` naming the file).
        FileNotFoundError, CheckpointMismatchError: As ``load_network`` / ``load_mindir`` /
            ``load_onnx``.
    """
    suffix = os.path.splitext(cfg.checkpoint_path)[1]
    if suffix not in PREDICTORS:
        raise ConfigError(f"checkpoint_path {cfg.checkpoint_path!r}: expected a "
                          f"{', '.join(PREDICTORS)} file")
    return PREDICTORS[suffix](cfg)


def softmax(logits):
    """Row-wise softmax of a float array (N, K), numerically stable."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)
