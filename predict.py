"""Classify images: top-k class names with probabilities, from a checkpoint, MindIR or ONNX file.

    python predict.py --checkpoint_path output/resnet50-90_5004.ckpt --image_path photo.jpg
    python predict.py --checkpoint_path resnet50.mindir --image_path folder/ --batch_size 1
    python predict.py --checkpoint_path resnet50.onnx --image_path folder/ --batch_size 1
    python predict.py --checkpoint_path CKPT --runtime onnxruntime --image_path folder/
    python predict.py --checkpoint_path hf-hub:timm/resnet50.tv2_in1k --image_path photo.jpg

Images are preprocessed as in eval (turned upright by their EXIF orientation with
exif_transpose true, resize eval_resize with eval_interpolation, center crop eval_image_size,
ImageNet normalization). The model file's record (docs/deployment.md#the-model-record) gives
its network, classes and their names, task, thresholds, tta and eval preprocessing: no
--config_path is needed; a value set that contradicts it is refused naming both. For a file
that records no class names: --class_names_path, else class_names.txt next to the checkpoint,
else the 1000 ImageNet names shipped in data/ when class_num is 1000. Hub weights (an hf-hub:
id, a safetensors folder or file: src/utils/hub.py) bring what their config.json says.
A MindIR or ONNX file runs at the batch size it was exported with: pass that --batch_size (any
--batch_size if exported with ``export.py --dynamic_batch true``). ONNX files run in ONNX
Runtime (in requirements.txt; the fastest on CPU); ``--runtime onnxruntime`` runs a .ckpt there
too (exported to a temporary ONNX file, BatchNorms folded; CPU only). A header line on stderr
names the model and its runtime. A folder is read --batch_size images at a time (memory does
not grow with it); the result lines go to stdout as each batch is done, progress to stderr (a
bar on a terminal, lines otherwise). A multi-label model (task multilabel: the model's record
unless --task is given) gets a sigmoid per class and each line also lists its ``labels``: the
classes at or above their thresholds (the model's, else 0.5; docs/deployment.md), and with
--label_file (rows relative to data_path, else to the image_path folder) the ``true_labels`` of
the images it lists.
"""
import src.env  # noqa: F401  first: sets the oneDNN default before MindSpore loads
import src.startup  # noqa: F401  then: a stop signal while MindSpore loads exits with a line

# isort: split

import json
import os
import sys

from src.data import read_label_file, set_max_image_pixels
from src.deploy import (
    batch_answers,
    formats,
    gradcam,
    inference,
    list_images,
    load_network,
    model_outputs,
    predict_in_batches,
)
from src.recipe import check_unused_keys, model_config, model_preprocess, resolve_model
from src.utils import (
    ConfigError,
    Progress,
    check_output_dir,
    device,
    get_logger,
    get_task,
    parse_config,
    run_entry_point,
)

SECTIONS = ("network", "data", "device", "model file", "predict")
"""The config.yaml sections this entry point reads (its --help lists them)."""


def check_class_count(cfg, outputs):
    """Raise ``ConfigError`` unless the model's ``outputs`` classes are ``cfg.class_num`` (an
    exported file carries its own class count: the names would not match)."""
    if outputs != cfg.class_num:
        raise ConfigError(f"{cfg.checkpoint_path} outputs {outputs} classes but class_num is "
                          f"{cfg.class_num}: pass --class_num {outputs}")


def cam_writer(cfg, paths, preprocess):
    """``cam_dir``: a function of a batch's paths and probabilities that writes each image's
    Grad-CAM files (``src.deploy.gradcam``) for ``cam_class`` or its top-1 class.

    Raises:
        ConfigError: For an exported graph, a ``cam_class`` out of range, images of 32 px or
            less, or two images of one name; UserError without matplotlib.
    """
    gradcam.check_cam_source(cfg.checkpoint_path, "cam_dir")
    gradcam.check_cam_class(cfg.cam_class, cfg.class_num)
    if gradcam.flat_map_note(cfg.eval_image_size):
        raise ConfigError(f"cam_dir: {gradcam.flat_map_note(cfg.eval_image_size)}")
    gradcam.colormap()  # matplotlib, before any work
    names = dict(zip(paths, gradcam.cam_names(paths, cfg.image_path)))
    check_output_dir(cfg.cam_dir, key="cam_dir")
    cam = gradcam.GradCam(load_network(cfg.net_name, cfg.class_num, cfg.checkpoint_path,
                                       use_ema=cfg.use_ema, device_target=cfg.device_target,
                                       stem_pool_pad_mode=cfg.stem_pool_pad_mode))

    def write(batch, probs):
        images = inference.preprocess_images(batch, preprocess)
        classes = probs.argmax(axis=1) if cfg.cam_class < 0 else [cfg.cam_class] * len(batch)
        maps = gradcam.grad_cam(cam, images, classes, cfg.batch_size)
        seen = gradcam.seen_images(images, preprocess.mean, preprocess.std)
        for path, image, cam_map in zip(batch, seen, maps):
            target = os.path.join(cfg.cam_dir, names[path] + ".png")
            os.makedirs(os.path.dirname(target), exist_ok=True)
            gradcam.write_cam(target, image, cam_map, raw=True)
    return write


def true_labels(cfg, names):
    """``label_file`` (task multilabel): the true label names of each image it lists, by
    normalized path, its rows relative to ``data_path`` (as for train.py and eval.py; empty:
    the ``image_path`` folder, or the image's); {} without one.

    Raises:
        ConfigError: With task multiclass. LabelFileError: As ``read_label_file``.
    """
    if not cfg.label_file:
        return {}
    if not get_task(cfg.task).label_file:
        raise ConfigError(f"label_file {cfg.label_file} gives the labels of a multi-label "
                          f"model; {cfg.checkpoint_path} is a {cfg.task} one")
    root = cfg.data_path or (cfg.image_path if os.path.isdir(cfg.image_path)
                             else os.path.dirname(cfg.image_path))
    table = read_label_file(cfg.label_file, root, class_names=names, check_images=False)
    return {os.path.normpath(path): [name for name, on in zip(names, row) if on]
            for path, row in zip(table.paths, table.targets)}


def main(argv=None):
    """Predict as configured by ``argv``; print one JSON line per image; return 0."""
    given = parse_config(argv, description=__doc__.split("\n")[0], sections=SECTIONS)
    set_max_image_pixels(given.max_image_pixels)
    get_logger("predict", stream=sys.stderr)  # stdout holds the JSON lines
    if not given.image_path:
        raise ConfigError("image_path is empty: give --image_path, an image or a folder")
    if not given.checkpoint_path:
        raise ConfigError("checkpoint_path is empty: give a .ckpt, .mindir or .onnx file")
    check_unused_keys(given, "predict")  # cam_class without cam_dir
    formats.check_runtime(given.checkpoint_path, given.runtime, given.device_target)
    model = resolve_model(given)  # the model file's record; the config for what it lacks
    cfg = model_config(given, model)
    preprocess = model_preprocess(cfg, model)
    device.setup_device(cfg.mode, cfg.device_target, device_id=cfg.device_id, seed=cfg.seed)

    paths = list_images(cfg.image_path)
    print(f"predict: {len(paths)} image{'s' if len(paths) > 1 else ''}, model "
          f"{cfg.checkpoint_path}, runtime "
          f"{formats.model_runtime(cfg.checkpoint_path, cfg.runtime)}",
          file=sys.stderr)  # the header line; stdout holds only the JSON lines
    write_cams = cam_writer(cfg, paths, preprocess) if cfg.cam_dir else None
    predict = formats.load_predictor(cfg.checkpoint_path, cfg.net_name, cfg.class_num,
                                     cfg.batch_size, use_ema=cfg.use_ema,
                                     device_target=cfg.device_target,
                                     stem_pool_pad_mode=cfg.stem_pool_pad_mode,
                                     runtime=cfg.runtime, tta=cfg.tta)
    names, thresholds = model_outputs(model)
    truth = true_labels(cfg, names)
    checked = False
    with Progress(len(paths), "predict", quiet=not os.path.isdir(cfg.image_path)) as progress:
        for batch, logits, probs in predict_in_batches(predict, paths, cfg.batch_size,
                                                       preprocess, model=model):
            if not checked:
                check_class_count(cfg, probs.shape[1])
                checked = True
            # "unknown" and its score where the record holds a rejection threshold
            answers = batch_answers(logits, model, names, thresholds, cfg.top_k)
            for path, answer in zip(batch, answers):
                line = {"image": path, **answer}
                if os.path.normpath(path) in truth:
                    line["true_labels"] = truth[os.path.normpath(path)]
                progress.write(json.dumps(line))
            if write_cams:
                write_cams(batch, probs)
            progress.update(len(batch))
    return 0


if __name__ == "__main__":
    run_entry_point(main)
