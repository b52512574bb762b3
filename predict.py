"""Classify images: top-k class names with probabilities, from a checkpoint, MindIR or ONNX file.

    python predict.py --checkpoint_path output/resnet50-90_5004.ckpt --image_path photo.jpg
    python predict.py --checkpoint_path resnet50.mindir --image_path folder/ --batch_size 1
    python predict.py --checkpoint_path resnet50.onnx --image_path folder/ --batch_size 1

Images are preprocessed as in eval (resize eval_resize, center crop image_size, ImageNet
normalization). Class names: --class_names_path, else class_names.txt next to the checkpoint
(written by train.py), else the 1000 ImageNet names shipped in data/ when class_num is 1000.
A MindIR or ONNX file runs at the batch size it was exported with: pass that --batch_size.
ONNX files run in ONNX Runtime (in requirements.txt; the fastest on CPU).
"""
from src.env import set_cpu_fast_path

set_cpu_fast_path()  # before MindSpore loads oneDNN

import json  # noqa: E402

import numpy as np  # noqa: E402

from src.class_names import default_class_names_path, read_class_names  # noqa: E402
from src.cli import run_entry_point  # noqa: E402
from src.config import ConfigError, parse_config  # noqa: E402
from src.device import setup_device  # noqa: E402
from src.inference import (list_images, load_predictor, preprocess_images,  # noqa: E402
                           softmax)


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
    probs = softmax(load_predictor(cfg)(images))
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
