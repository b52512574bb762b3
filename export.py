"""Export a ResNet checkpoint to MindIR, ONNX or AIR for inference.

    python export.py --checkpoint_path CKPT --file_format MINDIR --file_name resnet50 --batch_size 1
    python export.py --checkpoint_path CKPT --file_format SAFETENSORS --file_name my_resnet50

The exported graph takes float32 (batch_size, 3, eval_image_size, eval_image_size) images
preprocessed as in eval (resize, center crop, ImageNet normalization) and returns (batch_size,
class_num) logits. A checkpoint's weight EMA is exported when it has one (``use_ema``). MINDIR
and ONNX export on any backend; AIR needs Ascend and is deprecated in MindSpore 2.10 (kept
while it works on Ascend; MINDIR is the path forward). With ``stem_pool_pad_mode pad``
(torchvision's), ONNX and AIR graphs get the zero-padding stem max pool (same output); with
``same`` (MindCV's) the pool is exported as it is. The ONNX graph's input is named ``image``
and its output ``logits``. The file is written under a temporary name in its folder, loaded
back (ONNX checker and ONNX Runtime; MindIR by MindSpore) and only then renamed over
``file_name``: a failed export (disk full, unwritable folder) exits with status 4 naming the
cause and leaves an earlier file of that name as it was. One export per file name at a time:
``FILE.lock`` beside it (deleted at the end) makes a second export to the same name fail at once
(exit status 2) naming the first's process. With ``fold_bn`` (default) every
BatchNorm is folded into the convolution before it (``src/models/bn_fold.py``): same logits to
float32 rounding, fewer operations to run. Every format records the model's ``task`` and, for a
multi-label model, its thresholds and class names (``src/deploy/outputs.py``;
docs/deployment.md#multi-label-models).

With ``--quantize int8`` (ONNX only) the float32 graph is then statically quantized with ONNX
Runtime (``src/deploy/quantize.py``: QDQ, per-channel int8 weights, uint8 activations),
calibrated on ``calibration_images`` real images of ``--calibration_data_path`` (class folders,
preprocessed as in eval); the ``.onnx`` file still takes float32 images and returns float32 logits::

    python export.py --checkpoint_path CKPT --file_format ONNX --quantize int8 \
        --calibration_data_path /data/imagenet/train --file_name resnet50_int8 --batch_size 1

With ``--dynamic_batch true`` (ONNX, int8 ONNX and MINDIR; ``src/deploy/exporting.py``) the
batch dimension is symbolic in the input and the output: ONNX ``(batch, 3, H, W) -> (batch,
class_num)`` (MindSpore 2.10 declares the output with the traced batch: that declared dimension
is rewritten with the onnx library before the file is checked), MindIR ``(-1, 3, H, W) -> (-1,
class_num)`` (with the zero-padding stem max pool: with the padded one MindSpore 2.10's
``nn.GraphCell`` fails at the second batch size it is given). eval.py and predict.py then run
the file at any ``--batch_size``; the check before the rename also requires both declared
batches symbolic::

    python export.py --checkpoint_path CKPT --file_format ONNX --dynamic_batch true --file_name m
"""
import src.env  # noqa: F401  first: sets the oneDNN default before MindSpore loads
import src.startup  # noqa: F401  then: a stop signal while MindSpore loads exits with a line

# isort: split

import json
import logging
import os
import sys
import tempfile

import mindspore as ms
import numpy as np

from src.data import set_max_image_pixels
from src.deploy import (
    check_folder_target,
    check_quantize_config,
    formats,
    hub_config,
    inference,
    model_card,
    quantize,
    reduce_range_for,
    save_hub_folder,
    select_calibration_images,
    timm_config,
    torchvision_state,
    write_model_record,
)
from src.models import fold_batchnorm, with_tta
from src.recipe import model_config, model_preprocess, resolve_model
from src.utils import (
    ConfigError,
    FileLock,
    WriteError,
    check_output_dir,
    device,
    get_logger,
    is_pretrained_source,
    parse_config,
    read_checkpoint,
    run_entry_point,
    stored_config,
)

SECTIONS = ("network", "data", "device", "model file", "export")
"""The config.yaml sections this entry point reads (its --help lists them)."""

LOGGER = logging.getLogger("export")


def export_int8_onnx(net, dummy, cfg, calibration, out_path, *, preprocess,
                     reduce_range=False):
    """Export ``net`` as float32 ONNX into a temporary folder beside ``out_path``, then
    quantize it to ``out_path`` (``src.deploy.quantize.export_int8``), calibrated on the image
    paths ``calibration``, with 7-bit weights if ``reduce_range`` (``reduce_range_for``); with
    ``cfg.dynamic_batch`` both declare a symbolic batch."""
    with tempfile.TemporaryDirectory(prefix=".export.",
                                     dir=os.path.dirname(os.path.abspath(out_path))) as tmp:
        fp32 = os.path.join(tmp, "fp32")
        formats.export_model(net, dummy, fp32, "ONNX", cfg.dynamic_batch)
        formats.check_exported(fp32 + ".onnx", "ONNX", cfg.dynamic_batch)
        quantize.export_int8(fp32 + ".onnx", out_path, calibration, cfg.batch_size,
                             preprocess, reduce_range=reduce_range)


def export_checked(net, dummy, cfg, calibration, *, model, reduce_range=False):
    """Export to a temporary name in the target folder, load the result back
    (``src.deploy.formats.check_exported``), write the ``model`` record into it
    (``write_model_record``), then rename it over ``file_name`` + suffix: on
    any failure the earlier file of that name is left as it was. With ``calibration`` (image
    paths) the export is int8 (``export_int8_onnx``, ``reduce_range`` its 7-bit weights).

    Returns:
        str: The exported file.

    Raises:
        WriteError: If the export fails or its result does not load (names the cause).
    """
    suffix = formats.SUFFIXES[cfg.file_format]
    final = cfg.file_name + suffix
    folder = os.path.dirname(os.path.abspath(final))
    with tempfile.TemporaryDirectory(prefix=".export.", dir=folder) as tmp:
        partial = os.path.join(tmp, "model")
        try:
            if calibration:
                export_int8_onnx(net, dummy, cfg, calibration, partial + ".onnx",
                                 reduce_range=reduce_range, preprocess=model_preprocess(cfg, model))
            else:
                formats.export_model(net, dummy, partial, cfg.file_format, cfg.dynamic_batch)
        except OSError as err:
            raise WriteError(f"cannot export {final}: {err}") from err
        formats.check_exported(partial + suffix, cfg.file_format, cfg.dynamic_batch)
        try:
            write_model_record(partial + suffix, cfg.file_format, model)
            os.replace(partial + suffix, final)
        except OSError as err:
            raise WriteError(f"cannot write {final}: {err.strerror or err}") from err
    return final


def publish(cfg, model):
    """``file_format SAFETENSORS``: the weights as a folder timm and torchvision load
    (``src.deploy.publish``): ``model.safetensors``, ``config.json`` with the eval settings of
    ``cfg`` and the class names (``class_names.txt`` beside the checkpoint, the Hub weights'
    own, or ImageNet's at 1000 classes), and a model card with the training run's recipe
    (stored in our checkpoints) and ``eval_result.json`` beside the checkpoint, if any.
    BatchNorms are not folded. Returns 0."""
    if cfg.stem_pool_pad_mode != "pad":
        LOGGER.warning("stem_pool_pad_mode %s: timm's and torchvision's networks pool with "
                       "padding 1 (pad); their outputs will differ from this network's",
                       cfg.stem_pool_pad_mode)
    net = inference.load_network(cfg.net_name, cfg.class_num, cfg.checkpoint_path,
                                 use_ema=cfg.use_ema, device_target=None,
                                 stem_pool_pad_mode=cfg.stem_pool_pad_mode)
    names = list(model.class_names) if model.class_names else None
    config = hub_config(timm_config(cfg.net_name, cfg.class_num, model_preprocess(cfg, model),
                                    names), model)
    run_config = eval_result = None
    if not is_pretrained_source(cfg.checkpoint_path):
        run_config = stored_config(read_checkpoint(cfg.checkpoint_path))
        beside = os.path.join(os.path.dirname(os.path.abspath(cfg.checkpoint_path)),
                              "eval_result.json")
        if os.path.isfile(beside):
            with open(beside, encoding="utf-8") as f:
                eval_result = json.load(f)
    card = model_card(os.path.basename(os.path.abspath(cfg.file_name)), config,
                      cfg.checkpoint_path, run_config=run_config, eval_result=eval_result)
    state = torchvision_state(net)
    files = save_hub_folder(cfg.file_name, state, config, card)
    written = ", ".join(os.path.basename(f) for f in files)
    print(f"exported {cfg.checkpoint_path} -> {cfg.file_name}/ ({written}: {len(state)} tensors "
          f"in torchvision's names, input (N, 3, "
          f"{cfg.eval_image_size}, {cfg.eval_image_size}), {cfg.class_num} classes); publish it "
          f"with: hf upload ORG/NAME {cfg.file_name}")
    return 0


def main(argv=None):
    """Export as configured by ``argv``; return 0."""
    given = parse_config(argv, description=__doc__.split("\n")[0], sections=SECTIONS)
    set_max_image_pixels(given.max_image_pixels)  # calibration images
    get_logger("export")  # also shows the src modules' lines (which weights were loaded)
    model = resolve_model(given)  # the model file's record; the config for what it lacks
    cfg = model_config(given, model)
    cfg = cfg.replaced(file_name=export_stem(cfg.file_name, cfg.file_format))  # m.onnx once
    fmt = formats.FORMATS[cfg.file_format]
    if fmt.note:
        print(fmt.note, file=sys.stderr)
    if fmt.devices and cfg.device_target not in fmt.devices:
        raise ConfigError(f"file_format {cfg.file_format} needs device_target "
                          f"{' or '.join(fmt.devices)} (got {cfg.device_target}); use MINDIR "
                          f"or ONNX here")
    if cfg.dynamic_batch and not fmt.dynamic_batch:
        raise ConfigError(f"dynamic_batch true needs file_format "
                          f"{' or '.join(formats.DYNAMIC_BATCH_FORMATS)} (got "
                          f"{cfg.file_format}): pass --dynamic_batch false for AIR")
    check_quantize_config(cfg.quantize, cfg.file_format, cfg.calibration_data_path)
    check_output_dir(os.path.dirname(os.path.abspath(cfg.file_name)), "file_name's folder")
    if cfg.file_format == "SAFETENSORS":
        check_folder_target(cfg.file_name)
    lock = lock_export(cfg)  # one export per file name at a time
    try:
        return export_locked(cfg, model)
    finally:
        lock.release()


def export_stem(file_name, file_format):
    """``file_name`` without the suffix ``file_format`` adds, when it already ends in it
    (``--file_name model.onnx`` writes ``model.onnx``, not ``model.onnx.onnx``).

    Raises:
        ConfigError: If it ends in another format's suffix (``--file_format ONNX --file_name
            model.mindir``): the file would not be what its name says.
    """
    stem, suffix = os.path.splitext(file_name)
    own = formats.FORMATS[file_format].suffix
    if own and suffix.lower() == own:
        return stem
    for name, fmt in formats.FORMATS.items():
        if fmt.suffix and suffix.lower() == fmt.suffix:
            raise ConfigError(f"file_name {file_name} ends in {suffix}, a {name} file, but "
                              f"file_format {file_format} writes {own or 'a folder'}: give "
                              f"--file_name {stem} (the suffix is added), or --file_format "
                              f"{name}")
    return file_name


def lock_export(cfg):
    """Lock the file ``cfg`` exports to, through ``FILE.lock`` beside it (``FileLock``, deleted
    when the export ends): a second export to the same name fails at once naming the first's
    process instead of both writing it and both reporting success. The path is normalized
    first (``DIR/`` and ``DIR``, or a link to it, lock the same file). A lock file left by
    an export that was killed is taken over.

    Returns:
        FileLock: Held; ``release`` it when the export ends.

    Raises:
        OutputDirError: If another export to that file runs (names it and the lock file).
        WriteError: If the lock file cannot be written (disk full).
    """
    suffix = formats.FORMATS[cfg.file_format].suffix  # SAFETENSORS: "", the folder
    final = os.path.abspath(cfg.file_name + suffix)
    final = (os.path.realpath(final) if not suffix else  # a folder is written where it leads
             os.path.join(os.path.realpath(os.path.dirname(final)), os.path.basename(final)))
    path = final + ".lock"
    lock = FileLock(path, lambda holder: (
        f"{final} is being exported by another process (host and process id: {holder}, lock "
        f"file {path}): wait for it to end, or choose another --file_name"),
                    f"the export to {final}", remove=True)
    ended = lock.acquire()
    if ended:
        LOGGER.info("%s: took over the lock of an ended export (host and process id %s)", path,
                    ended)
    return lock


def export_locked(cfg, model):
    """The export of ``main`` (the resolved ``model``'s weights and record), its file locked
    (``lock_export``); returns 0."""
    if cfg.file_format == "SAFETENSORS":
        device.setup_device(cfg.mode, cfg.device_target, device_id=cfg.device_id, seed=cfg.seed)
        return publish(cfg, model)
    calibration = (select_calibration_images(cfg.calibration_data_path, cfg.calibration_images)
                   if cfg.quantize == "int8" else None)
    device.setup_device(cfg.mode, cfg.device_target, device_id=cfg.device_id, seed=cfg.seed)

    net = inference.load_network(cfg.net_name, cfg.class_num, cfg.checkpoint_path,
                                 use_ema=cfg.use_ema, device_target=None,  # the pool as built
                                 stem_pool_pad_mode=cfg.stem_pool_pad_mode)
    folded = fold_batchnorm(net) if cfg.fold_bn else 0
    net = with_tta(net, cfg.tta)  # flip: the graph averages the image's and its mirror's logits
    size = cfg.eval_image_size
    dummy = ms.Tensor(np.zeros([cfg.batch_size, 3, size, size], np.float32))
    reduce_range = bool(calibration) and reduce_range_for(cfg.quantize_reduce_range)
    final = export_checked(net, dummy, cfg, calibration, model=model, reduce_range=reduce_range)
    int8 = (f"int8 (static QDQ, {7 if reduce_range else 8}-bit weights: quantize_reduce_range "
            f"{cfg.quantize_reduce_range}) calibrated on {len(calibration)} images of "
            f"{cfg.calibration_data_path}; " if calibration else "")
    batch = "batch" if cfg.dynamic_batch else cfg.batch_size  # the symbolic dimension's name
    tta = "; test-time augmentation flip in the graph" if cfg.tta == "flip" else ""
    print(f"exported {cfg.checkpoint_path} -> {final} "
          f"({int8}input float32 ({batch}, 3, {size}, {size}), output ({batch}, {cfg.class_num})"
          f"{f'; {folded} BatchNorms folded into their convolutions' if folded else ''}{tta})")
    return 0


if __name__ == "__main__":
    run_entry_point(main)
