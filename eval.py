"""Evaluate a ResNet checkpoint or exported model: top-1 and top-5 accuracy over a dataset.

    python eval.py --checkpoint_path output/resnet50-90_5004.ckpt --data_path /data/imagenet/val
    python eval.py --config_path configs/resnet18_cifar10.yaml --checkpoint_path CKPT \
        --data_path ../shared/data/cifar10/test
    python eval.py --checkpoint_path resnet50.onnx --batch_size 32 --data_path /data/imagenet/val
    python eval.py --checkpoint_path CKPT --runtime onnxruntime --data_path /data/imagenet/val
    python eval.py --checkpoint_path OUT/resnet50-best.ckpt --data_path FOLDER \
        --split_file OUT/val_split.txt    # the part train.py --val_split held out
    python eval.py --checkpoint_path OUT/resnet50-best.ckpt --data_path FOLDER \
        --split_file OUT/val_split.txt --calibrate temperature    # fit T there, record it

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
(``--tune_thresholds true`` tunes them for F1 and records them in thresholds.json beside the
checkpoint, for its weights), ``per_class.csv``/``.md``, ``pr_curves.png`` and the page:
docs/multilabel.md. The model file's record (docs/deployment.md#the-model-record) gives its
network, classes, task and eval preprocessing: no --config_path is needed, and data of other
class names than the model's is refused naming both. ``--calibrate temperature`` fits a
single-label model's softmax temperature on the images evaluated and records it in
thresholds.json beside the checkpoint, for its weights; a run with it, or of a model that
records a temperature, reports ECE, adaptive ECE, NLL, Brier and top-1 before and after it and
draws ``reliability_diagram.png`` (docs/calibration.md).

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

from src.data import (
    CIFAR10_CLASSES,
    Sampling,
    class_names_of,
    count_images,
    image_folder_files,
    pipeline,
    readable_pipeline_errors,
    set_max_image_pixels,
)
from src.deploy import (
    DIAGRAM_FILE,
    HISTOGRAM_FILE,
    ClassReport,
    MultiLabelReport,
    build_report_page,
    calibration_line,
    calibration_result,
    chunks,
    formats,
    gradcam,
    list_images,
    load_network,
    model_probabilities,
    model_thresholds,
    ood_summary,
    plot_confusion,
    plot_histograms,
    plot_reliability,
    preprocess_images,
    run_folder_of,
    summary_line,
    write_tuned_thresholds,
    write_tuned_values,
)
from src.models import create_network, fold_batchnorm, with_tta
from src.recipe import (
    check_positive_labels,
    check_unused_keys,
    checkpoint_digest,
    eval_label_table,
    model_config,
    model_preprocess,
    network_kwargs,
    resolve_model,
    split_indices,
)
from src.training import CrossEntropySmooth, classification_metrics, create_loss
from src.utils import (
    MULTICLASS,
    MULTILABEL,
    OOD_SCORES,
    TENSORBOARD_FOLDER,
    ConfigError,
    MissingFileError,
    Progress,
    TensorBoardLog,
    UserError,
    all_scores,
    atomic_write_text,
    check_fit_images,
    check_output_dir,
    device,
    fit_temperature,
    get_logger,
    parse_config,
    run_entry_point,
    synthetic_batch,
    threshold_for_tpr,
    throughput_report,
    time_calls,
    tune_thresholds,
)

SECTIONS = ("network", "data", "device", "outputs", "performance", "model file",
            "calibration", "out-of-distribution")
"""The config.yaml sections this entry point reads (its --help lists them)."""


def evaluate(predict, dataset, scoring, progress, *, class_num, source):
    """Run ``predict`` (numpy images -> numpy logits) over every batch of ``dataset`` once and
    give each batch's logits and labels to ``scoring`` (the task's ``Scoring``).

    Args:
        predict (callable): float32 (N, 3, H, W) -> float32 logits (N, class_num).
        dataset (mindspore.dataset.Dataset): Batches of ``image`` and ``label`` columns
            (class indices (N,), or multi-hot float32 (N, K)).
        scoring: ``update(logits, labels)``.
        progress (Progress): Told the number of images of each batch once evaluated.
        class_num (int): The model's classes; source (str): the model file, for messages.

    Returns:
        int: The number of images evaluated.

    Raises:
        ConfigError: If the model's class count is not ``class_num``.
    """
    evaluated = 0
    for images, labels in dataset.create_tuple_iterator(num_epochs=1, output_numpy=True):
        logits = predict(images)
        if logits.shape[1] != class_num:
            raise ConfigError(f"{source} outputs {logits.shape[1]} classes but class_num is "
                              f"{class_num}")
        scoring.update(logits, labels)
        evaluated += len(labels)
        progress.update(len(labels))
    return evaluated


def loss_description(loss: dict) -> str:
    """``asl (asl_gamma_neg 4, ...)``: a loss record (``ModelRecord.loss``) as words."""
    settings = ", ".join(f"{k} {v}" for k, v in loss.items()
                         if k not in ("loss", "pos_weight", "class_weights"))
    weights = " with pos_weight" if "pos_weight" in loss else ""
    return f"{loss['loss']}{weights}" + (f" ({settings})" if settings else "")


class FolderScoring:
    """``task multiclass``: top-1, top-5 and the mean per-batch loss (the label-smoothed
    cross-entropy of training, MindSpore's metric classes as ``Model.eval``) and the per-class
    report (``ClassReport``) of class folders or the CIFAR-10 binaries."""

    def __init__(self, cfg, model, indices):
        self.cfg, self.model = cfg, model
        self.labels = None  # class folders: no label table
        smoothing = (model.loss or {}).get("label_smoothing", cfg.label_smoothing)
        self.loss_name = f"cross-entropy (label_smoothing {smoothing})"
        self.loss_fn = CrossEntropySmooth(smoothing, model.class_num)
        self.metrics = {**classification_metrics(model.class_num), "loss": nn.Loss()}
        if cfg.dataset == "imagefolder":
            files = image_folder_files(cfg.data_path)
            self.report = ClassReport(model.class_num, class_names_of(cfg.data_path),
                                      files if indices is None else [files[i] for i in indices])
        else:
            self.report = ClassReport(model.class_num, CIFAR10_CLASSES)

    def update(self, logits, labels):
        self.metrics["top1"].update(logits, labels)
        self.metrics["top5"].update(logits, labels)
        self.metrics["loss"].update(self.loss_fn(ms.Tensor(logits), ms.Tensor(labels)))
        self.report.update(logits / np.float32(self.model.temperature or 1.0), labels)  # its T

    def result(self):
        """(the summary's scores, the per-class details)."""
        scores = {name: float(metric.eval()) for name, metric in self.metrics.items()}
        return scores, self.report.summary()

    def annotate(self, details, preprocess):
        """The Grad-CAM overlays of the first misclassified images, named in their entries."""
        add_cam_overlays(self.cfg, self.model, details["misclassified"], preprocess)

    def write(self, summary, details, out):
        """The result line and the confusion picture; returns the page's extra keywords."""
        cfg = self.cfg
        worst = ", ".join("{name} {accuracy:.3f}".format(**c) for c in sorted(
            details["per_class"], key=lambda c: c["accuracy"])[:3])
        print(f"top-1 {summary['top1']:.4f}  top-5 {summary['top5']:.4f} over "
              f"{summary['images']} images; lowest per-class accuracy: {worst}; "
              f"{len(details['misclassified'])} misclassified images listed in {out}")
        if cfg.plot:
            picture = os.path.join(cfg.output_dir, "confusion_matrix.png")
            plot_confusion(details["confusion_matrix"], self.report.names, picture)
            print(f"confusion matrix: {picture}")
            if cfg.tensorboard:  # the picture and the numbers, in output_dir/tensorboard/
                tracker = TensorBoardLog(os.path.join(cfg.output_dir, TENSORBOARD_FOLDER))
                tracker.image("eval/confusion_matrix", 0, picture)
                tracker.scalars(0, {"eval/top1": summary["top1"], "eval/top5": summary["top5"],
                                    "eval/loss": summary["loss"]})
                tracker.close()
        return {}


class LabelFileScoring:
    """``task multilabel`` (docs/multilabel.md): the sigmoid scores of every image of
    ``label_file`` (or ``split_file``'s), mAP and the per-class report at the model's
    thresholds (``MultiLabelReport``; ``tune_thresholds``: tuned for F1 here and recorded
    against the checkpoint's weights), and the mean per-image loss the model was trained with
    (its record's ``loss``; binary cross-entropy when it records none)."""

    def __init__(self, cfg, model, indices):
        if cfg.tune_thresholds and formats.model_suffix(cfg.checkpoint_path) != ".ckpt":
            raise ConfigError(f"tune_thresholds writes thresholds.json beside a .ckpt "
                              f"checkpoint; {cfg.checkpoint_path} is not one (tune on the "
                              f"checkpoint, then export it: the file records the thresholds)")
        self.cfg, self.model = cfg, model
        self.labels = eval_label_table(cfg, model.class_names)
        loss = dict(model.loss or {"loss": "bce"})
        self.loss_name = loss_description(loss)
        self.loss_fn = create_loss(
            loss["loss"], 0.0, model.class_num, task=model.task, reduction="none",
            class_weights=loss.get("pos_weight"),
            **{k: loss[k] for k in ("asl_gamma_neg", "asl_gamma_pos", "asl_clip") if k in loss})
        self.loss_sum = 0.0
        files = self.labels.files if indices is None else [self.labels.files[i] for i in indices]
        check_positive_labels(self.labels.targets if indices is None
                              else self.labels.targets[indices],
                              f"label_file {cfg.label_file}" + (
                                  f" (the rows of split_file {cfg.split_file})"
                                  if indices is not None else ""))
        self.report = MultiLabelReport(self.labels.class_names, files,
                                       thresholds=model_thresholds(model, model.class_num))

    def update(self, logits, labels):
        losses = self.loss_fn(ms.Tensor(logits), ms.Tensor(labels)).asnumpy()
        self.loss_sum += float(losses.astype(np.float64).sum())
        self.report.update(model_probabilities(logits, self.model), labels)

    def result(self):
        """(the summary's scores, the per-class details), thresholds tuned first if asked."""
        if self.cfg.tune_thresholds:
            tuned = tune_thresholds(self.report.scores, self.report.targets)
            written = write_tuned_thresholds(self.cfg.checkpoint_path,
                                             self.labels.class_names, tuned,
                                             checkpoint_digest(self.cfg)(self.model))
            self.report.thresholds = tuned
            print(f"thresholds tuned for F1 on these {len(self.report.scores)} images, "
                  f"recorded for the weights of {self.cfg.checkpoint_path}: {written}")
        details = self.report.summary()
        images = max(len(self.report.scores), 1)
        return {"mAP": details["mAP"], "loss": self.loss_sum / images}, details

    def annotate(self, details, preprocess):
        """Nothing: multi-label evaluations draw no Grad-CAM overlays."""

    def write(self, summary, details, out):
        """The per-class tables and the precision-recall picture; returns the page's extra
        keywords."""
        tables = self.report.write_tables(self.cfg.output_dir)
        print(f"mAP {details['mAP']:.4f}, exact match {details['exact_match']:.4f}, macro F1 "
              f"{details['macro_f1']:.4f} over {summary['images']} images; {out}; per-class "
              f"tables: {', '.join(tables)}")
        picture = os.path.join(self.cfg.output_dir, "pr_curves.png")
        try:
            self.report.plot_pr_curves(picture)
            print(f"precision-recall curves: {picture}")
        except UserError as err:  # no matplotlib: the numbers are written, the picture is not
            print(f"no pr_curves.png: {err}")
            picture = None
        return {"pr_curves": picture}


SCORINGS = {MULTICLASS.name: FolderScoring, MULTILABEL.name: LabelFileScoring}
"""The scoring of each task (``src.utils.tasks.TASKS``) by name."""


class OutOfDistribution:
    """Out-of-distribution scores of a single-label evaluation (docs/ood.md), from the raw
    logits: with ``ood_data_path``, how well each score separates the images evaluated (the
    in-distribution positives) from that folder's (AUROC, FPR at 95% TPR, AUPR, a histogram);
    with ``tune_ood``, the threshold of ``ood_score`` keeping ``ood_tpr`` of the images
    evaluated, recorded in thresholds.json for the checkpoint's weights; with a threshold
    (recorded or tuned), the share of each side it keeps. While any of these is asked,
    ``scoring.update`` also hands it each batch's logits (their scores are kept).

    Raises:
        ConfigError: For a multi-label model, ``tune_ood`` on an exported file, an
            ``ood_data_path`` without images, or ``ood_score`` / ``ood_tpr`` without
            ``tune_ood``.
    """

    def __init__(self, cfg, model, scoring):
        check_unused_keys(cfg, "eval")
        self.cfg, self.model, self.inside, self.paths = cfg, model, [], []
        asked = [f"{key} {cfg[key]}" for key in ("ood_data_path", "tune_ood") if cfg[key]]
        if asked and model.task_object.multi_hot:
            raise ConfigError(f"{asked[0]}: out-of-distribution scores are single-label here "
                              f"(softmax over the classes); {cfg.checkpoint_path} is a "
                              f"{model.task} model (docs/ood.md#multi-label-models)")
        if cfg.tune_ood and formats.model_suffix(cfg.checkpoint_path) != ".ckpt":
            raise ConfigError(f"tune_ood writes thresholds.json beside a .ckpt checkpoint; "
                              f"{cfg.checkpoint_path} is not one (tune on the checkpoint, then "
                              f"export it: the file records the threshold)")
        if cfg.ood_data_path:
            if not os.path.isdir(cfg.ood_data_path):
                raise ConfigError(f"ood_data_path {cfg.ood_data_path} is not a folder")
            try:
                self.paths = list_images(cfg.ood_data_path)
            except MissingFileError as err:
                raise ConfigError(f"ood_data_path {cfg.ood_data_path}: no images to score as "
                                  f"unknown ({err})") from err
        if cfg.tune_ood:  # thresholds.json's class names
            self.names = model.class_names or scoring.report.names
        if asked or model.ood_threshold is not None:
            update = scoring.update

            def keep(logits, labels):
                self.inside.append(all_scores(logits))
                update(logits, labels)
            scoring.update = keep

    def result(self, scores, *, predict, preprocess):
        """``scores`` with ``ood`` (``ood_summary``; the histogram's file name), the threshold
        tuned and recorded first if asked; ``scores`` itself when nothing was asked."""
        cfg, model = self.cfg, self.model
        if not self.inside:
            return scores
        inside = np.concatenate(self.inside)
        if cfg.tune_ood:
            threshold = threshold_for_tpr(inside[:, OOD_SCORES.index(cfg.ood_score)],
                                          cfg.ood_tpr)
            values = {"ood_score": cfg.ood_score, "ood_threshold": threshold}
            written = write_tuned_values(cfg.checkpoint_path, self.names, values,
                                         checkpoint_digest(cfg)(model), task=model.task)
            model = model.with_values(**values)
            print(f"out-of-distribution threshold {cfg.ood_score} {threshold:.6g} keeps "
                  f"{cfg.ood_tpr} of these {len(inside)} images, recorded for the weights of "
                  f"{cfg.checkpoint_path}: {written}")
        outside = None
        if self.paths:
            batches = []
            with Progress(len(self.paths), "ood") as progress:
                for batch in chunks(self.paths, cfg.batch_size):
                    batches.append(all_scores(predict(preprocess_images(batch, preprocess))))
                    progress.update(len(batch))
            outside = np.concatenate(batches)
        result = ood_summary(inside, outside, score=model.ood_score,
                             threshold=model.ood_threshold)
        if cfg.ood_data_path:
            result["data_path"] = cfg.ood_data_path
        if outside is not None:
            picture = os.path.join(cfg.output_dir, HISTOGRAM_FILE)
            marks = [(model.ood_score, model.ood_threshold)] if model.ood_score else []
            try:
                plot_histograms(inside, outside, picture, marks=marks)
                result["histogram"] = HISTOGRAM_FILE
            except UserError as err:  # no matplotlib: the numbers are written, the picture not
                print(f"no {HISTOGRAM_FILE}: {err}")
        print(summary_line(result))
        return dict(scores, ood=result)


class Calibrating:
    """A single-label scoring that also keeps every image's logits and label: with
    ``--calibrate temperature`` it fits T on them (``fit_temperature``: the NLL of
    softmax(logits / T)) and records it in thresholds.json for the checkpoint's weights;
    otherwise T is the model's recorded one. Adds the calibration before (T = 1) and after
    (ECE, adaptive ECE, NLL, Brier, top-1) to the summary, the reliability bins to the
    details, and the reliability diagram (docs/calibration.md)."""

    def __init__(self, cfg, model, scoring):
        self.cfg, self.model, self.scoring = cfg, model, scoring
        self.kept_logits, self.kept_labels = [], []  # not .labels: the scoring's label table

    @classmethod
    def wrap(cls, cfg, model, scoring):
        """``scoring`` wrapped when ``--calibrate temperature`` or the model records a
        temperature (single-label models); else ``scoring`` itself.

        Raises:
            ConfigError: For ``--calibrate temperature`` on a multi-label model or on a file
                other than a ``.ckpt`` (names it and what to do instead).
        """
        if cfg.calibrate == "temperature":
            if model.task_object.multi_hot:
                raise ConfigError(
                    f"calibrate temperature: {cfg.checkpoint_path} is a "
                    f"{model.task_object.name} model (a sigmoid per class); temperature "
                    f"scaling is for single-label (softmax) models here, per-class calibration "
                    f"of multi-label models is not built yet "
                    f"(docs/calibration.md#multi-label-models): use calibrate none")
            if formats.model_suffix(cfg.checkpoint_path) != ".ckpt":
                raise ConfigError(
                    f"calibrate temperature writes thresholds.json beside a .ckpt "
                    f"checkpoint; {cfg.checkpoint_path} is not one (calibrate the checkpoint, "
                    f"then export it: the file records the temperature)")
            images = getattr(scoring.report, "images", None)  # class folders: known already
            if images is not None:
                check_fit_images(len(images), model.class_num)
        elif model.temperature is None or model.task_object.multi_hot:
            return scoring
        return cls(cfg, model, scoring)

    def __getattr__(self, name):  # labels, loss_name, annotate: the scoring's
        return getattr(self.scoring, name)

    def update(self, logits, labels):
        self.scoring.update(logits, labels)
        self.kept_logits.append(np.array(logits, np.float32))
        self.kept_labels.append(np.asarray(labels).astype(np.int64))

    def result(self):
        """The scoring's result with ``calibration`` and ``reliability`` (the diagram drawn,
        the temperature fitted and recorded first when asked)."""
        scores, details = self.scoring.result()
        cfg, classes = self.cfg, self.model.class_num
        logits = (np.concatenate(self.kept_logits) if self.kept_logits
                  else np.zeros((0, classes), np.float32))
        labels = (np.concatenate(self.kept_labels) if self.kept_labels
                  else np.zeros(0, np.int64))
        fitted = cfg.calibrate == "temperature"
        temperature = self.model.temperature
        if fitted:
            temperature, at_end = fit_temperature(logits, labels)
            names = self.model.class_names or self.scoring.report.names
            written = write_tuned_values(
                cfg.checkpoint_path, names,
                {"temperature": temperature,
                 "calibrated_on": {"images": int(len(labels)), "data_path": cfg.data_path,
                                   "split_file": cfg.split_file or None, "tta": cfg.tta}},
                checkpoint_digest(cfg)(self.model), task=self.model.task_object.name)
            print(f"temperature {temperature:.4f} fitted on these {len(labels)} images, "
                  f"recorded for the weights of {cfg.checkpoint_path}: {written}")
            if at_end:
                print(f"warning: the fitted temperature {temperature:.4g} is at an end of the "
                      f"range searched: the NLL still falls beyond it (every image right, or "
                      f"a model no better than chance on these images)")
        summary, reliability = calibration_result(logits, labels, temperature, fitted=fitted)
        picture = os.path.join(cfg.output_dir, DIAGRAM_FILE)
        try:
            plot_reliability(reliability, summary, picture)
            summary["reliability_diagram"] = DIAGRAM_FILE
        except UserError as err:  # no matplotlib: the numbers are written, the picture is not
            print(f"no {DIAGRAM_FILE}: {err}")
        return {**scores, "calibration": summary}, {**details, "reliability": reliability}

    def write(self, summary, details, out):
        """The scoring's lines and pictures, then the calibration line; returns the page's
        extra keywords."""
        extras = self.scoring.write(summary, details, out)
        calibration = summary["calibration"]
        print(calibration_line(calibration))
        if "reliability_diagram" in calibration:
            print(f"reliability diagram: "
                  f"{os.path.join(self.cfg.output_dir, calibration['reliability_diagram'])}")
        return extras


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


def check_data_classes(cfg, model):
    """Raise ``ConfigError`` unless ``cfg.data_path`` is given and, for class folders, holds
    the model's classes: ``class_num`` of them, with the names and order the model records
    (a model that records none: one line says the names are not compared)."""
    if not cfg.data_path:
        raise ConfigError("data_path is empty: give --data_path, the evaluation data folder")
    if model.task_object.label_file:
        return
    names = class_names_of(cfg.data_path) if cfg.dataset == "imagefolder" else CIFAR10_CLASSES
    if cfg.dataset == "imagefolder" and len(names) != model.class_num:
        raise ConfigError(f"data_path {cfg.data_path} has {len(names)} class folders but "
                          f"class_num is {model.class_num}")
    if model.class_names is None:
        print(f"{cfg.checkpoint_path or 'the model'} records no class names: the names of "
              f"data_path's classes are not compared with the model's")
        return
    if tuple(names) != tuple(model.class_names):
        differ = [f"{i}: {a} / {b}" for i, (a, b) in enumerate(zip(names, model.class_names))
                  if a != b][:5]
        raise ConfigError(f"data_path {cfg.data_path} has other classes than "
                          f"{model.source or cfg.checkpoint_path} was trained on (label: folder "
                          f"/ model: {', '.join(differ)}): its labels would be scored against "
                          f"other classes; evaluate on a folder with the model's class names")


def main(argv=None):
    """Evaluate as configured by ``argv``; print and write the result; return 0."""
    given = parse_config(argv, description=__doc__.split("\n")[0], sections=SECTIONS)
    set_max_image_pixels(given.max_image_pixels)
    get_logger("eval")  # also shows the src modules' lines (which weights were loaded)
    model = resolve_model(given)  # the model file's record; the config for what it lacks
    cfg = model_config(given, model)
    preprocess = model_preprocess(cfg, model)
    formats.check_runtime(cfg.checkpoint_path, cfg.runtime, cfg.device_target)  # before slow work
    if cfg.benchmark_steps:
        device.setup_device(cfg.mode, cfg.device_target, device_id=cfg.device_id, seed=cfg.seed)
        return benchmark_inference(cfg)
    check_data_classes(cfg, model)
    indices = split_indices(cfg)  # None: every image (or row of label_file)
    scoring = SCORINGS[model.task_object.name](cfg, model, indices)
    scoring = Calibrating.wrap(cfg, model, scoring)  # calibrate, or a recorded temperature
    ood = OutOfDistribution(cfg, model, scoring)  # checked before the evaluation
    # before the evaluation, not after it; created when the result is written (a run
    # refused by a later check, e.g. of the checkpoint, leaves no empty folder)
    check_output_dir(cfg.output_dir, create=False)
    device.setup_device(cfg.mode, cfg.device_target, device_id=cfg.device_id, seed=cfg.seed)
    dataset = pipeline.create_dataset(cfg.data_path, preprocess, dataset=cfg.dataset,
                                      batch_size=cfg.batch_size,
                                      sampling=Sampling(indices=indices), labels=scoring.labels,
                                      num_parallel_workers=cfg.num_parallel_workers,
                                      check_images=cfg.check_images)
    total = count_images(cfg.data_path, is_training=False, dataset=cfg.dataset, indices=indices,
                         labels=scoring.labels)
    predict = formats.load_predictor(cfg.checkpoint_path, cfg.net_name, cfg.class_num,
                                     cfg.batch_size, use_ema=cfg.use_ema,
                                     device_target=cfg.device_target,
                                     stem_pool_pad_mode=cfg.stem_pool_pad_mode,
                                     runtime=cfg.runtime, tta=cfg.tta)
    start = time.time()
    with readable_pipeline_errors(), Progress(total, "eval") as progress:
        images = evaluate(predict, dataset, scoring, progress, class_num=cfg.class_num,
                          source=cfg.checkpoint_path)
    seconds = time.time() - start
    check_output_dir(cfg.output_dir)
    scores, details = scoring.result()
    scores = ood.result(scores, predict=predict, preprocess=preprocess)
    summary = {"checkpoint_path": cfg.checkpoint_path,
               "runtime": formats.model_runtime(cfg.checkpoint_path, cfg.runtime),
               "tta": cfg.tta, "task": model.task_object.name, "data_path": cfg.data_path,
               "net_name": cfg.net_name, "images": images, **scores,
               "loss_name": scoring.loss_name, "time_s": round(seconds, 2)}
    if scoring.labels is not None:
        summary["label_file"] = cfg.label_file
    if cfg.split_file:
        summary["split_file"] = cfg.split_file  # the images evaluated: those it lists
    print(json.dumps(summary, indent=1))
    scoring.annotate(details, preprocess)
    out = os.path.join(cfg.output_dir, "eval_result.json")
    atomic_write_text(out, json.dumps(dict(summary, **details), indent=1))
    page_extras = scoring.write(summary, details, out)
    page = os.path.join(cfg.output_dir, "report.html")
    atomic_write_text(page, build_report_page(
        dict(summary, **details), output_dir=cfg.output_dir, eval_config=cfg.to_yaml(),
        run_folder=run_folder_of(cfg.checkpoint_path), exif_transpose=cfg.exif_transpose,
        **page_extras))
    print(f"report page: {page}")
    return 0


def add_cam_overlays(cfg, model, misclassified, preprocess):
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
    net = load_network(model.net_name, model.class_num, cfg.checkpoint_path,
                       use_ema=cfg.use_ema, device_target=cfg.device_target,
                       stem_pool_pad_mode=cfg.stem_pool_pad_mode)
    gradcam.write_misclassified(gradcam.GradCam(net), entries, preprocess=preprocess,
                                output_dir=cfg.output_dir, batch_size=cfg.batch_size)
    print(f"Grad-CAM overlays of {len(entries)} misclassified images: "
          f"{os.path.join(cfg.output_dir, gradcam.CAM_FOLDER)}")


if __name__ == "__main__":
    run_entry_point(main)
