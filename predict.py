"""Classify images: top-k class names with probabilities, from a checkpoint, MindIR or ONNX file.

    python predict.py --checkpoint_path output/resnet50-90_5004.ckpt --image_path photo.jpg
    python predict.py --checkpoint_path resnet50.mindir --image_path folder/ --batch_size 1
    python predict.py --checkpoint_path resnet50.onnx --image_path folder/ --batch_size 1

Images are preprocessed as in eval (resize eval_resize, center crop image_size, ImageNet
normalization). Class names: --class_names_path, else class_names.txt next to the checkpoint
(written by train.py), else the 1000 ImageNet names shipped in data/ when class_num is 1000.
A MindIR or ONNX file runs at the batch size it was exported with: pass that --batch_size.
ONNX files run in ONNX Runtime (``pip install onnxruntime``, an optional dependency).
"""
from src.env import set_cpu_fast_path

set_cpu_fast_path()  # before MindSpore loads oneDNN

import json  # noqa: E402
import os  # noqa: E402

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402

from src.class_names import default_class_names_path, read_class_names  # noqa: E402
from src.cli import run_entry_point  # noqa: E402
from src.config import ConfigError, parse_config  # noqa: E402
from src.device import setup_device  # noqa: E402
from src.inference import (list_images, load_mindir, load_network, load_onnx,  # noqa: E402
                           preprocess_images, softmax)


def class_names_for(cfg, class_num):
    """Names in label order; ``class_<i>`` when no names file is known."""
    path = cfg.class_names_path or default_class_names_path(cfg.checkpoint_path, class_num)
    if path is None:
        return [f"class_{i}" for i in range(class_num)]
    names = read_class_names(path)
    if len(names) != class_num:
        raise ConfigError(f"class names file {path} lists {len(names)} names but the model has "
                          f"{class_num} classes")
    return names


def run_checkpoint(cfg, images):
    """Logits from a .ckpt: batches of at most ``batch_size`` (no padding needed)."""
    net = load_network(cfg)
    return run_in_batches(lambda x: net(ms.Tensor(x)).asnumpy(), images,
                          min(cfg.batch_size, len(images)))


def run_exported(cfg, images, forward, kind):
    """Logits from an exported model, which takes exactly its export batch size."""
    try:
        return run_in_batches(forward, images, cfg.batch_size)
    except Exception as err:  # noqa: BLE001  (MindSpore and ONNX Runtime raise their own types)
        raise ValueError(f"{kind} {cfg.checkpoint_path} rejected input of shape "
                         f"({cfg.batch_size}, 3, {cfg.image_size}, {cfg.image_size}): pass the "
                         f"--batch_size and --image_size it was exported with "
                         f"({str(err).splitlines()[0]})") from err


def run_mindir(cfg, images):
    """Logits from a .mindir (MindSpore GraphCell)."""
    graph = load_mindir(cfg.checkpoint_path)
    return run_exported(cfg, images, lambda x: graph(ms.Tensor(x)).asnumpy(), "MindIR")


def run_onnx(cfg, images):
    """Logits from an .onnx (ONNX Runtime)."""
    return run_exported(cfg, images, load_onnx(cfg.checkpoint_path), "ONNX model")


RUNNERS = {".ckpt": run_checkpoint, ".mindir": run_mindir, ".onnx": run_onnx}


def predict_logits(cfg, images):
    """Logits (N, class_num) of preprocessed images, from a .ckpt, .mindir or .onnx file."""
    suffix = os.path.splitext(cfg.checkpoint_path)[1]
    if suffix not in RUNNERS:
        raise ConfigError(f"checkpoint_path {cfg.checkpoint_path}: expected a "
                          f"{', '.join(RUNNERS)} file")
    return RUNNERS[suffix](cfg, images)


def run_in_batches(forward, images, batch_size):
    """Apply ``forward`` (numpy -> numpy) over ``images`` in batches of exactly
    ``batch_size`` (the last one zero-padded, the padding dropped from the result)."""
    outputs = []
    for start in range(0, len(images), batch_size):
        chunk = images[start:start + batch_size]
        pad = batch_size - len(chunk)
        if pad:
            chunk = np.concatenate([chunk, np.zeros((pad,) + chunk.shape[1:], chunk.dtype)])
        outputs.append(forward(chunk)[:batch_size - pad])
    return np.concatenate(outputs)


def main(argv=None):
    """Predict as configured by ``argv``; print one JSON line per image; return 0."""
    cfg = parse_config(argv, description=__doc__.split("\n")[0])
    if not cfg.image_path:
        raise ConfigError("image_path is empty: give --image_path, an image or a folder")
    if not cfg.checkpoint_path:
        raise ConfigError("checkpoint_path is empty: give a .ckpt, .mindir or .onnx file")
    for key in ("batch_size", "top_k"):
        if cfg[key] < 1:
            raise ConfigError(f"{key} must be a positive integer, got {cfg[key]}")
    setup_device(cfg)

    paths = list_images(cfg.image_path)
    images = preprocess_images(paths, cfg.image_size, cfg.eval_resize)
    probs = softmax(predict_logits(cfg, images))
    names = class_names_for(cfg, probs.shape[1])

    k = min(cfg.top_k, probs.shape[1])
    for path, row in zip(paths, probs):
        top = np.argsort(-row)[:k]
        result = [{"class": int(i), "name": names[i], "probability": round(float(row[i]), 6)}
                  for i in top]
        print(json.dumps({"image": path, "top": result}))
    return 0


if __name__ == "__main__":
    run_entry_point(main)
