"""Evaluate a ResNet checkpoint or exported model: top-1 and top-5 accuracy over a dataset.

    python eval.py --checkpoint_path output/resnet50-90_5004.ckpt --data_path /data/imagenet/val
    python eval.py --config_path configs/resnet18_cifar10.yaml --checkpoint_path CKPT \
        --data_path ../shared/data/cifar10/test
    python eval.py --checkpoint_path resnet50.onnx --batch_size 32 --data_path /data/imagenet/val
    python eval.py --checkpoint_path CKPT --runtime onnxruntime --data_path /data/imagenet/val
    python eval.py --checkpoint_path OUT/resnet50-best.ckpt --data_path FOLDER \
        --split_file OUT/val_split.txt    # the part train.py --val_split held out

--checkpoint_path takes a .ckpt (MindSpore, graph mode), Hub weights (``hf-hub:ORG/NAME``, a
safetensors folder or file, whose network, class count and eval preprocessing are used for the
keys not set: ``src/utils/hub.py``), a .mindir (nn.GraphCell) or an .onnx file (ONNX Runtime,
the fastest on CPU); an exported model takes the --batch_size it was
exported with, or any with ``export.py --dynamic_batch true``. ``--runtime onnxruntime`` runs a
.ckpt in ONNX Runtime on CPU (exported to a temporary ONNX file with BatchNorms folded, removed
at once; same top-1/top-5); the summary names the runtime (``"runtime"``). Prints the result
and writes it as JSON (``eval_result.json`` in --output_dir). Every image is evaluated once:
no shuffling, the last partial batch is kept; the image count reported is that of the labels
evaluated. The JSON also holds the per-class report: accuracy,
precision, recall and F1 per class, the confusion matrix, and the misclassified images (file
path, or index for the CIFAR-10 binary format; true and predicted class, probability), most
confident mistakes first; ``--plot true`` draws the confusion matrix
(``confusion_matrix.png``). ``report.html`` beside it shows it all on one page
(``src/deploy/report_page.py``). Progress (images done, img/s, ETA) goes to stderr:
a bar on a terminal, otherwise a line every 30 s or 10% of the images (``src/utils/progress.py``).
``--benchmark_steps N`` times N inference steps on synthetic images instead (no dataset).
A multi-label model (``task multilabel``, read from the model or set) is evaluated on the
images of ``--label_file``: mAP, per-class AP / precision / recall / F1 at its thresholds
(``--tune_thresholds true`` tunes them for F1 and writes thresholds.json beside the
checkpoint), ``per_class.csv``/``.md``, ``pr_curves.png`` and the page: docs/multilabel.md.

    python eval.py --config_path configs/multilabel_quick_start.yaml \
        --checkpoint_path output/multilabel_quick_start/resnet18-best.ckpt \
        --label_file data/cifar10_mosaics/val.csv --tune_thresholds true
"""
import src.env  # noqa: F401  first: sets the oneDNN default before MindSpore loads
import src.startup  # noqa: F401  then: a stop signal while MindSpore loads exits with a line

# isort: split

import json
import os
import time

import mindspore as ms
import mindspore.nn as nn
import numpy as np

from src.data import pipeline
from src.data.class_names import CIFAR10_CLASSES
from src.data.image_check import readable_pipeline_errors, set_max_image_pixels
from src.data.pipeline import class_names_of, count_images, image_folder_files
from src.data.settings import Sampling
from src.deploy import formats, gradcam
from src.deploy.inference import load_network
from src.deploy.multilabel_report import MultiLabelReport
from src.deploy.outputs import model_thresholds, probabilities, write_thresholds
from src.deploy.report import ClassReport, plot_confusion
from src.deploy.report_page import build_report_page, run_folder_of
from src.models.bn_fold import fold_batchnorm
from src.models.resnet import create_network
from src.models.tta import with_tta
from src.recipe import (
    eval_label_table,
    network_kwargs,
    resolve_eval_preprocess,
    resolve_task,
    resolve_tta,
    split_indices,
)
from src.training.loss import CrossEntropySmooth, MultiLabelBCE
from src.training.model import classification_metrics
from src.utils import device
from src.utils.cli import run_entry_point
from src.utils.config import ConfigError, parse_config
from src.utils.errors import UserError
from src.utils.files import atomic_write_text, check_output_dir
from src.utils.logger import get_logger
from src.utils.multilabel_metrics import tune_thresholds
from src.utils.progress import Progress
from src.utils.throughput import synthetic_batch, throughput_report, time_calls
from src.utils.tracking import FOLDER as TENSORBOARD_FOLDER
from src.utils.tracking import TensorBoardLog

SECTIONS = ("network", "data", "device", "outputs", "performance", "model file")
"""The config.yaml sections this entry point reads (its --help lists them)."""


def evaluate(predict, dataset, cfg, progress, report=None):
    """Top-1, top-5 and the mean per-batch loss (label-smoothed cross-entropy, as in
    training) of ``predict`` (numpy images -> numpy logits) over every batch of ``dataset``,
    with MindSpore's metric classes (as ``Model.eval`` computes them).

    Args:
        predict (callable): float32 (N, 3, H, W) -> float32 logits (N, class_num).
        dataset (mindspore.dataset.Dataset): Batches of ``image`` and ``label`` columns.
        cfg (Config): ``class_num``, ``label_smoothing`` and ``checkpoint_path`` (messages).
        progress (Progress): Told the number of images of each batch once evaluated.
        report (ClassReport, optional): Also given every batch (the per-class report).

    Returns:
        dict: ``top1``, ``top5``, ``loss`` (floats) and ``images``: the number of labels
        evaluated.

    Raises:
        ConfigError: If the model's class count is not ``cfg.class_num``.
    """
    metrics = {**classification_metrics(cfg.class_num), "loss": nn.Loss()}
    loss_fn = CrossEntropySmooth(cfg.label_smoothing, cfg.class_num)
    evaluated = 0
    for images, labels in dataset.create_tuple_iterator(num_epochs=1, output_numpy=True):
        logits = predict(images)
        if logits.shape[1] != cfg.class_num:
            raise ConfigError(f"{cfg.checkpoint_path} outputs {logits.shape[1]} classes but "
                              f"class_num is {cfg.class_num}")
        metrics["top1"].update(logits, labels)
        metrics["top5"].update(logits, labels)
        metrics["loss"].update(loss_fn(ms.Tensor(logits), ms.Tensor(labels)))
        if report is not None:
            report.update(logits, labels)
        evaluated += len(labels)
        progress.update(len(labels))
    return {**{name: float(metric.eval()) for name, metric in metrics.items()},
            "images": evaluated}


def benchmark_inference(cfg):
    """``--benchmark_steps N``: N forward passes of ``batch_size`` synthetic images at
    ``eval_image_size``, through the model as eval.py runs it (``--checkpoint_path`` .ckpt,
    .mindir or .onnx; without one a randomly initialized network in graph mode); no dataset,
    no files. Returns 0."""
    if cfg.checkpoint_path:
        predict = formats.load_predictor(
            cfg.checkpoint_path, cfg.net_name, cfg.class_num, cfg.batch_size,
            use_ema=cfg.use_ema, device_target=cfg.device_target,
            stem_pool_pad_mode=cfg.stem_pool_pad_mode, runtime=cfg.runtime, tta=cfg.tta)
    else:
        net = with_tta(create_network(**network_kwargs(cfg)), cfg.tta)
        net.set_train(False)
        if cfg.runtime == "onnxruntime":  # as a .ckpt runs there: BatchNorms folded
            fold_batchnorm(net)
            predict = formats.onnx_of_network(net, (3, cfg.eval_image_size, cfg.eval_image_size))
        else:
            predict = lambda x: net(ms.Tensor(x)).asnumpy()  # noqa: E731
    images, _ = synthetic_batch(cfg.batch_size, cfg.eval_image_size, cfg.class_num)
    warmup, timed = time_calls(lambda: predict(images), cfg.benchmark_steps)
    record, line = throughput_report("eval", cfg.batch_size, 1, warmup, timed)
    runtime = formats.model_runtime(cfg.checkpoint_path, cfg.runtime)
    model = (f"{cfg.checkpoint_path} ({runtime})" if cfg.checkpoint_path
             else f"{cfg.net_name} (random weights, {runtime})")
    print(f"{line}; model {model}")
    print(json.dumps(dict(record, checkpoint_path=cfg.checkpoint_path, runtime=runtime)))
    return 0


def check_data_classes(cfg):
    """Raise ``ConfigError`` unless ``cfg.data_path`` is given and, for class folders, holds
    ``cfg.class_num`` of them."""
    if not cfg.data_path:
        raise ConfigError("data_path is empty: give --data_path, the evaluation data folder")
    folders = len(class_names_of(cfg.data_path)) if cfg.dataset == "imagefolder" else cfg.class_num
    if folders != cfg.class_num:
        raise ConfigError(f"data_path {cfg.data_path} has {folders} class folders but class_num "
                          f"is {cfg.class_num}")


def main(argv=None):
    """Evaluate as configured by ``argv``; print and write the result; return 0."""
    cfg = parse_config(argv, description=__doc__.split("\n")[0], sections=SECTIONS)
    set_max_image_pixels(cfg.max_image_pixels)
    get_logger("eval")  # also shows the src modules' lines (which weights were loaded)
    preprocess = resolve_eval_preprocess(cfg, cfg.checkpoint_path)  # Hub weights' unless set
    resolve_tta(cfg)  # the model's recorded test-time augmentation unless set
    resolve_task(cfg)  # the model's recorded task (multiclass or multilabel) unless set
    formats.check_runtime(cfg.checkpoint_path, cfg.runtime, cfg.device_target)  # before slow work
    if cfg.benchmark_steps:
        device.setup_device(cfg.mode, cfg.device_target, device_id=cfg.device_id, seed=cfg.seed)
        return benchmark_inference(cfg)
    if cfg.task == "multilabel":
        return evaluate_multilabel(cfg, preprocess)
    check_data_classes(cfg)
    indices = split_indices(cfg)  # None: every image of data_path
    # before the evaluation, not after it; created when the result is written (a run
    # refused by a later check, e.g. of the checkpoint, leaves no empty folder)
    check_output_dir(cfg.output_dir, create=False)
    device.setup_device(cfg.mode, cfg.device_target, device_id=cfg.device_id, seed=cfg.seed)

    dataset = pipeline.create_dataset(cfg.data_path, preprocess, dataset=cfg.dataset,
                                      batch_size=cfg.batch_size,
                                      sampling=Sampling(indices=indices),
                                      num_parallel_workers=cfg.num_parallel_workers,
                                      check_images=cfg.check_images)
    total = count_images(cfg.data_path, is_training=False, dataset=cfg.dataset, indices=indices)
    predict = formats.load_predictor(cfg.checkpoint_path, cfg.net_name, cfg.class_num,
                                     cfg.batch_size, use_ema=cfg.use_ema,
                                     device_target=cfg.device_target,
                                     stem_pool_pad_mode=cfg.stem_pool_pad_mode,
                                     runtime=cfg.runtime, tta=cfg.tta)

    report = class_report(cfg, indices)
    start = time.time()
    with readable_pipeline_errors(), Progress(total, "eval") as progress:
        result = evaluate(predict, dataset, cfg, progress, report)
    seconds = time.time() - start
    summary = {"checkpoint_path": cfg.checkpoint_path,
               "runtime": formats.model_runtime(cfg.checkpoint_path, cfg.runtime),
               "tta": cfg.tta,
               "data_path": cfg.data_path,
              "net_name": cfg.net_name, "images": result["images"],
              "top1": result["top1"], "top5": result["top5"],
              "loss": result["loss"], "time_s": round(seconds, 2)}
    if cfg.split_file:
        summary["split_file"] = cfg.split_file  # the images evaluated: those it lists
    print(json.dumps(summary, indent=1))
    details = report.summary()
    worst = ", ".join("{name} {accuracy:.3f}".format(**c) for c in sorted(
        details["per_class"], key=lambda c: c["accuracy"])[:3])
    check_output_dir(cfg.output_dir)
    add_cam_overlays(cfg, details["misclassified"], preprocess)
    out = os.path.join(cfg.output_dir, "eval_result.json")
    atomic_write_text(out, json.dumps(dict(summary, **details), indent=1))
    print(f"top-1 {summary['top1']:.4f}  top-5 {summary['top5']:.4f} over {summary['images']} "
          f"images; lowest per-class accuracy: {worst}; "
          f"{len(details['misclassified'])} misclassified images listed in {out}")
    page = os.path.join(cfg.output_dir, "report.html")
    atomic_write_text(page, build_report_page(
        dict(summary, **details), output_dir=cfg.output_dir, eval_config=cfg.to_yaml(),
        run_folder=run_folder_of(cfg.checkpoint_path), exif_transpose=cfg.exif_transpose))
    print(f"report page: {page}")
    if cfg.plot:
        picture = os.path.join(cfg.output_dir, "confusion_matrix.png")
        plot_confusion(details["confusion_matrix"], report.names, picture)
        print(f"confusion matrix: {picture}")
        if cfg.tensorboard:  # the picture and the numbers, in output_dir/tensorboard/
            tracker = TensorBoardLog(os.path.join(cfg.output_dir, TENSORBOARD_FOLDER))
            tracker.image("eval/confusion_matrix", 0, picture)
            tracker.scalars(0, {"eval/top1": summary["top1"], "eval/top5": summary["top5"],
                                "eval/loss": summary["loss"]})
            tracker.close()
    return 0


def evaluate_multilabel(cfg, preprocess):
    """eval.py for ``task multilabel`` (docs/multilabel.md): sigmoid scores of every image of
    ``label_file`` (or ``split_file``'s), mAP and the per-class report at the model's
    thresholds (``tune_thresholds``: tuned for F1 here and written beside the checkpoint);
    ``eval_result.json``, ``per_class.csv`` / ``.md`` and ``pr_curves.png`` in output_dir.
    Returns 0.

    Raises:
        ConfigError: ``tune_thresholds`` without a .ckpt; as ``eval_label_table``.
    """
    if cfg.tune_thresholds and formats.model_suffix(cfg.checkpoint_path) != ".ckpt":
        raise ConfigError(f"tune_thresholds writes thresholds.json beside a .ckpt checkpoint; "
                          f"{cfg.checkpoint_path} is not one (tune on the checkpoint, then "
                          f"export it: the file records the thresholds)")
    labels = eval_label_table(cfg)
    indices = split_indices(cfg)  # None: every row of label_file
    check_output_dir(cfg.output_dir, create=False)
    device.setup_device(cfg.mode, cfg.device_target, device_id=cfg.device_id, seed=cfg.seed)
    dataset = pipeline.create_dataset(cfg.data_path, preprocess, batch_size=cfg.batch_size,
                                      sampling=Sampling(indices=indices), labels=labels,
                                      num_parallel_workers=cfg.num_parallel_workers,
                                      check_images=cfg.check_images)
    total = count_images(cfg.data_path, is_training=False, indices=indices, labels=labels)
    predict = formats.load_predictor(cfg.checkpoint_path, cfg.net_name, cfg.class_num,
                                     cfg.batch_size, use_ema=cfg.use_ema,
                                     device_target=cfg.device_target,
                                     stem_pool_pad_mode=cfg.stem_pool_pad_mode,
                                     runtime=cfg.runtime, tta=cfg.tta)
    files = labels.files if indices is None else [labels.files[i] for i in indices]
    thresholds = model_thresholds(formats.recorded_outputs(cfg.checkpoint_path, cfg.class_num),
                                  cfg.class_num)
    report = MultiLabelReport(labels.class_names, files, thresholds=thresholds)
    start = time.time()
    with readable_pipeline_errors(), Progress(total, "eval") as progress:
        result = evaluate_scores(predict, dataset, cfg, progress, report)
    seconds = time.time() - start
    check_output_dir(cfg.output_dir)
    if cfg.tune_thresholds:
        tuned = tune_thresholds(report.scores, report.targets)
        written = write_thresholds(os.path.dirname(cfg.checkpoint_path) or ".",
                                   labels.class_names, tuned)
        report.thresholds = tuned
        print(f"thresholds tuned for F1 on these {result['images']} images: {written}")
    details = report.summary()
    summary = {"checkpoint_path": cfg.checkpoint_path,
               "runtime": formats.model_runtime(cfg.checkpoint_path, cfg.runtime),
               "tta": cfg.tta, "task": cfg.task, "data_path": cfg.data_path,
               "label_file": cfg.label_file, "net_name": cfg.net_name,
               "images": result["images"], "mAP": details["mAP"], "loss": result["loss"],
               "time_s": round(seconds, 2)}
    if cfg.split_file:
        summary["split_file"] = cfg.split_file
    print(json.dumps(summary, indent=1))
    out = os.path.join(cfg.output_dir, "eval_result.json")
    atomic_write_text(out, json.dumps(dict(summary, **details), indent=1))
    tables = report.write_tables(cfg.output_dir)
    print(f"mAP {details['mAP']:.4f}, exact match {details['exact_match']:.4f}, macro F1 "
          f"{details['macro_f1']:.4f} over {summary['images']} images; {out}; per-class "
          f"tables: {', '.join(tables)}")
    picture = os.path.join(cfg.output_dir, "pr_curves.png")
    try:
        report.plot_pr_curves(picture)
        print(f"precision-recall curves: {picture}")
    except UserError as err:  # no matplotlib: the numbers are written, the picture is not
        print(f"no pr_curves.png: {err}")
        picture = None
    page = os.path.join(cfg.output_dir, "report.html")
    atomic_write_text(page, build_report_page(
        dict(summary, **details), output_dir=cfg.output_dir, eval_config=cfg.to_yaml(),
        run_folder=run_folder_of(cfg.checkpoint_path), exif_transpose=cfg.exif_transpose,
        pr_curves=picture))
    print(f"report page: {page}")
    return 0


def evaluate_scores(predict, dataset, cfg, progress, report):
    """The sigmoid scores of ``predict`` over every batch of ``dataset`` (multi-hot targets)
    given to ``report``, and the mean per-image loss (binary cross-entropy, the mean over the
    classes).

    Returns:
        dict: ``loss``, ``images``, ``scores`` and ``targets`` (float32 (N, K)).

    Raises:
        ConfigError: If the model's class count is not ``cfg.class_num``.
    """
    loss_fn = MultiLabelBCE(cfg.class_num, reduction="none")
    loss_sum, scores, targets = 0.0, [], []
    for images, labels in dataset.create_tuple_iterator(num_epochs=1, output_numpy=True):
        logits = predict(images)
        if logits.shape[1] != cfg.class_num:
            raise ConfigError(f"{cfg.checkpoint_path} outputs {logits.shape[1]} classes but "
                              f"class_num is {cfg.class_num}")
        losses = loss_fn(ms.Tensor(logits), ms.Tensor(labels)).asnumpy()
        loss_sum += float(losses.astype(np.float64).sum())
        scores.append(probabilities(logits, "multilabel"))
        targets.append(labels)
        report.update(scores[-1], labels)
        progress.update(len(labels))
    scores, targets = np.concatenate(scores), np.concatenate(targets)
    return {"loss": loss_sum / len(scores), "images": len(scores), "scores": scores,
            "targets": targets}


def add_cam_overlays(cfg, misclassified, preprocess):
    """``cam_images``: the Grad-CAM overlays of the first misclassified images in
    output_dir/cam/, their entries given ``cam`` (``src.deploy.gradcam.write_misclassified``);
    one line says why none are written (``src.deploy.gradcam.overlay_skip_reason``)."""
    entries = misclassified[:cfg.cam_images]
    if not entries:
        return
    reason = gradcam.overlay_skip_reason(cfg.checkpoint_path, cfg.dataset,
                                         cfg.eval_image_size)
    if reason:
        print(f"cam_images: no Grad-CAM overlays: {reason}")
        return
    net = load_network(cfg.net_name, cfg.class_num, cfg.checkpoint_path, use_ema=cfg.use_ema,
                       device_target=cfg.device_target, stem_pool_pad_mode=cfg.stem_pool_pad_mode)
    gradcam.write_misclassified(gradcam.GradCam(net), entries, preprocess=preprocess,
                                output_dir=cfg.output_dir, batch_size=cfg.batch_size)
    print(f"Grad-CAM overlays of {len(entries)} misclassified images: "
          f"{os.path.join(cfg.output_dir, gradcam.CAM_FOLDER)}")


def class_report(cfg, indices=None):
    """An empty ``ClassReport`` of the eval data: class names from the class folders (the
    CIFAR-10 names for the binary format), images named by path (by index for CIFAR-10);
    with ``indices`` (``src.recipe.split_indices``) those images only."""
    if cfg.dataset == "imagefolder":
        files = image_folder_files(cfg.data_path)
        return ClassReport(cfg.class_num, class_names_of(cfg.data_path),
                           files if indices is None else [files[i] for i in indices])
    return ClassReport(cfg.class_num, CIFAR10_CLASSES)


if __name__ == "__main__":
    run_entry_point(main)
