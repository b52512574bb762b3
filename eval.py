"""Evaluate a ResNet checkpoint or exported model: top-1 and top-5 accuracy over a dataset.

    python eval.py --checkpoint_path output/resnet50-90_5004.ckpt --data_path /data/imagenet/val
    python eval.py --config_path configs/resnet18_cifar10.yaml --checkpoint_path CKPT \
        --data_path ../shared/data/cifar10/test
    python eval.py --checkpoint_path resnet50.onnx --batch_size 32 --data_path /data/imagenet/val

--checkpoint_path takes a .ckpt (MindSpore, graph mode), a .mindir (nn.GraphCell) or an .onnx
file (ONNX Runtime, the fastest on CPU); an exported model takes the --batch_size it was
exported with. Prints the result and writes it as JSON (``eval_result.json`` in --output_dir).
Every image is evaluated once: no shuffling, the last partial batch is kept.
"""
from src.env import set_cpu_fast_path

set_cpu_fast_path()  # before MindSpore loads oneDNN

import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import mindspore as ms  # noqa: E402
import mindspore.nn as nn  # noqa: E402

from src.cli import run_entry_point  # noqa: E402
from src.config import ConfigError, parse_config  # noqa: E402
from src.dataset import class_names_of, count_images, create_dataset  # noqa: E402
from src.device import setup_device  # noqa: E402
from src.image_check import readable_pipeline_errors  # noqa: E402
from src.inference import load_predictor  # noqa: E402
from src.loss import CrossEntropySmooth  # noqa: E402


def evaluate(predict, dataset, cfg):
    """Top-1, top-5 and the mean per-batch loss (label-smoothed cross-entropy, as in
    training) of ``predict`` (numpy images -> numpy logits) over every batch of ``dataset``,
    with MindSpore's metric classes (as ``Model.eval`` computes them).

    Raises:
        ConfigError: If the model's class count is not ``cfg.class_num``.
    """
    metrics = {"top1": nn.Top1CategoricalAccuracy(),
               "top5": nn.TopKCategoricalAccuracy(min(5, cfg.class_num)), "loss": nn.Loss()}
    loss_fn = CrossEntropySmooth(cfg.label_smoothing, cfg.class_num)
    for images, labels in dataset.create_tuple_iterator(num_epochs=1, output_numpy=True):
        logits = predict(images)
        if logits.shape[1] != cfg.class_num:
            raise ConfigError(f"{cfg.checkpoint_path} outputs {logits.shape[1]} classes but "
                              f"class_num is {cfg.class_num}")
        metrics["top1"].update(logits, labels)
        metrics["top5"].update(logits, labels)
        metrics["loss"].update(loss_fn(ms.Tensor(logits), ms.Tensor(labels)))
    return {name: metric.eval() for name, metric in metrics.items()}


def main(argv=None):
    """Evaluate as configured by ``argv``; print and write the result; return 0."""
    cfg = parse_config(argv, description=__doc__.split("\n")[0])
    if not cfg.data_path:
        raise ConfigError("data_path is empty: give --data_path, the evaluation data folder")
    folders = len(class_names_of(cfg.data_path)) if cfg.dataset == "imagefolder" else cfg.class_num
    if folders != cfg.class_num:
        raise ConfigError(f"data_path {cfg.data_path} has {folders} class folders but class_num "
                          f"is {cfg.class_num}")
    setup_device(cfg)

    dataset = create_dataset(cfg.data_path, is_training=False, dataset=cfg.dataset,
                             batch_size=cfg.batch_size, image_size=cfg.image_size,
                             eval_resize=cfg.eval_resize,
                             num_parallel_workers=cfg.num_parallel_workers,
                             check_images=cfg.check_images)
    predict = load_predictor(cfg)

    start = time.time()
    with readable_pipeline_errors():
        result = evaluate(predict, dataset, cfg)
    seconds = time.time() - start
    images = count_images(cfg.data_path, is_training=False, dataset=cfg.dataset)
    report = {"checkpoint_path": cfg.checkpoint_path, "data_path": cfg.data_path,
              "net_name": cfg.net_name, "images": images,
              "top1": float(result["top1"]), "top5": float(result["top5"]),
              "loss": float(result["loss"]), "time_s": round(seconds, 2)}
    print(json.dumps(report, indent=1))
    os.makedirs(cfg.output_dir, exist_ok=True)
    out = os.path.join(cfg.output_dir, "eval_result.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(f"top-1 {report['top1']:.4f}  top-5 {report['top5']:.4f} over {images} images; "
          f"written to {out}")
    return 0


if __name__ == "__main__":
    run_entry_point(main)
