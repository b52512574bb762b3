"""Export a ResNet checkpoint to MindIR, ONNX or AIR for inference.

    python export.py --checkpoint_path CKPT --file_format MINDIR --file_name resnet50 --batch_size 1

The exported graph takes float32 (batch_size, 3, eval_image_size, eval_image_size) images
preprocessed as in eval (resize, center crop, ImageNet normalization) and returns
(batch_size, class_num) logits. A checkpoint's weight EMA is exported when it has one
(``use_ema``). MINDIR and ONNX export on any backend; AIR needs Ascend and is deprecated in
MindSpore 2.10 (kept while it works on Ascend; MINDIR is the path forward). ONNX and AIR graphs
get the zero-padding stem max pool (same output). The ONNX graph's input is
named ``image`` and its output ``logits``. The file is written under a temporary name in its
folder, loaded back (ONNX checker and ONNX Runtime; MindIR by MindSpore) and only then renamed
over ``file_name``: a failed export (disk full, unwritable folder) exits with status 4 naming
the cause and leaves an earlier file of that name as it was. With ``fold_bn`` (default) every
BatchNorm is folded into the convolution before it (``src/models/bn_fold.py``): same logits to
float32 rounding, fewer operations to run.

With ``--quantize int8`` (ONNX only) the float32 graph is then statically quantized with ONNX
Runtime (``src/deploy/quantize.py``: QDQ, per-channel int8 weights, uint8 activations),
calibrated on ``calibration_images`` real images of ``--calibration_data_path`` (class folders,
preprocessed as in eval); the ``.onnx`` file still takes float32 images and returns float32 logits::

    python export.py --checkpoint_path CKPT --file_format ONNX --quantize int8 \
        --calibration_data_path /data/imagenet/train --file_name resnet50_int8 --batch_size 1
"""
import src.env  # noqa: F401  first: sets the oneDNN default before MindSpore loads
import src.startup  # noqa: F401  then: a stop signal while MindSpore loads exits with a line

# isort: split

import os
import sys
import tempfile

import mindspore as ms
import numpy as np

from src.data.image_check import set_max_image_pixels
from src.deploy.inference import load_mindir, load_network, load_onnx
from src.deploy.quantize import check_quantize_config, export_int8, select_calibration_images
from src.models.bn_fold import fold_batchnorm
from src.models.resnet import use_exportable_max_pool
from src.utils.cli import run_entry_point
from src.utils.config import ConfigError, parse_config
from src.utils.device import setup_device
from src.utils.errors import WriteError
from src.utils.files import check_output_dir
from src.utils.logger import get_logger

SUFFIXES = {"MINDIR": ".mindir", "ONNX": ".onnx", "AIR": ".air"}

SECTIONS = ("network", "data", "device", "model file", "export")
"""The config.yaml sections this entry point reads (its --help lists them)."""

# Formats whose graph gets the zero-padding stem max pool (``MaxPoolPad1``). ONNX: the exporter
# rejects MaxPool3DWithArgmax. AIR: the graph runs on Ascend, where MaxPool3DWithArgmax is only
# an AI CPU operator (a custom one of MindSpore's, CustMaxPool3DWithArgmax); Pad and MaxPool
# have AI Core kernels. MINDIR keeps the network as built.
EXPORTABLE_POOL_FORMATS = ("ONNX", "AIR")

AIR_NOTE = ("note: AIR export is deprecated in MindSpore 2.10 (to be removed in a future "
            "version); it is kept while it works on Ascend, MINDIR is the path forward")
"""Printed (stderr) whenever file_format AIR is chosen; MindSpore itself logs a warning."""


def export_model(net, dummy, file_name, file_format):
    """Write ``net`` traced on ``dummy``. ONNX goes through ``mindspore.onnx.export`` (the
    successor of ``export(file_format='ONNX')``) with the graph's input named ``image`` and its
    output ``logits``. For ONNX and AIR (``EXPORTABLE_POOL_FORMATS``) ``net`` first gets the
    zero-padding stem max pool (in place, same output:
    ``src.models.resnet.use_exportable_max_pool``)."""
    if file_format in EXPORTABLE_POOL_FORMATS:
        use_exportable_max_pool(net)
    if file_format == "ONNX":
        ms.onnx.export(net, dummy, file_name=file_name, input_names=["image"],
                       output_names=["logits"])
    else:
        ms.export(net, dummy, file_name=file_name, file_format=file_format)


def export_int8_onnx(net, dummy, cfg, calibration, out_path):
    """Export ``net`` as float32 ONNX into a temporary folder beside ``out_path``, then
    quantize it to ``out_path`` (``src.deploy.quantize.export_int8``), calibrated on the image
    paths ``calibration``."""
    with tempfile.TemporaryDirectory(prefix=".export.",
                                     dir=os.path.dirname(os.path.abspath(out_path))) as tmp:
        fp32 = os.path.join(tmp, "fp32")
        export_model(net, dummy, fp32, "ONNX")
        check_exported(fp32 + ".onnx", "ONNX")
        export_int8(fp32 + ".onnx", out_path, calibration, cfg.batch_size,
                    cfg.eval_image_size, cfg.eval_resize)


def check_exported(path, file_format):
    """Load an exported file back, as eval.py and predict.py would: ONNX through the ONNX
    checker and an ONNX Runtime session, MindIR through ``mindspore.load``; AIR, which only
    Ascend's tools read, must exist and not be empty.

    Raises:
        WriteError: Naming the file and why it is not a usable model (MindSpore's ONNX
            exporter logs a failed write, removes the file and returns normally; a failed
            MindIR write leaves a file cut short).
    """
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        raise WriteError(f"export wrote no {file_format} file (disk full, or the folder not "
                         f"writable? MindSpore's log above may say more)")
    try:
        if file_format == "ONNX":
            import onnx
            onnx.checker.check_model(path)
            load_onnx(path)
        elif file_format == "MINDIR":
            load_mindir(path)
    except Exception as err:  # onnx's, ONNX Runtime's and MindSpore's own error types
        raise WriteError(f"the exported {file_format} file does not load back: "
                         f"{str(err).splitlines()[0]}") from err


def export_checked(net, dummy, cfg, calibration):
    """Export to a temporary name in the target folder, load the result back
    (``check_exported``), then rename it over ``file_name`` + suffix: on any failure the
    earlier file of that name is left as it was.

    Returns:
        str: The exported file.

    Raises:
        WriteError: If the export fails or its result does not load (names the cause).
    """
    final = cfg.file_name + SUFFIXES[cfg.file_format]
    folder = os.path.dirname(os.path.abspath(final))
    with tempfile.TemporaryDirectory(prefix=".export.", dir=folder) as tmp:
        partial = os.path.join(tmp, "model")
        try:
            if calibration:
                export_int8_onnx(net, dummy, cfg, calibration, partial + ".onnx")
            else:
                export_model(net, dummy, partial, cfg.file_format)
        except OSError as err:
            raise WriteError(f"cannot export {final}: {err}") from err
        check_exported(partial + SUFFIXES[cfg.file_format], cfg.file_format)
        try:
            os.replace(partial + SUFFIXES[cfg.file_format], final)
        except OSError as err:
            raise WriteError(f"cannot write {final}: {err.strerror or err}") from err
    return final


def main(argv=None):
    """Export as configured by ``argv``; return 0."""
    cfg = parse_config(argv, description=__doc__.split("\n")[0], sections=SECTIONS)
    set_max_image_pixels(cfg.max_image_pixels)  # calibration images
    get_logger("export")  # also shows the src modules' lines (which weights were loaded)
    if cfg.file_format == "AIR":
        print(AIR_NOTE, file=sys.stderr)
    if cfg.file_format == "AIR" and cfg.device_target != "Ascend":
        raise ConfigError(f"file_format AIR needs device_target Ascend (got "
                          f"{cfg.device_target}); use MINDIR or ONNX here")
    check_quantize_config(cfg)
    check_output_dir(os.path.dirname(os.path.abspath(cfg.file_name)), "file_name's folder")
    calibration = (select_calibration_images(cfg.calibration_data_path, cfg.calibration_images)
                   if cfg.quantize == "int8" else None)
    setup_device(cfg.mode, cfg.device_target, device_id=cfg.device_id, seed=cfg.seed)

    net = load_network(cfg.net_name, cfg.class_num, cfg.checkpoint_path, cfg.use_ema)
    folded = fold_batchnorm(net) if cfg.fold_bn else 0
    size = cfg.eval_image_size
    dummy = ms.Tensor(np.zeros([cfg.batch_size, 3, size, size], np.float32))
    final = export_checked(net, dummy, cfg, calibration)
    int8 = (f"int8 (static QDQ) calibrated on {len(calibration)} images of "
            f"{cfg.calibration_data_path}; " if calibration else "")
    print(f"exported {cfg.checkpoint_path} -> {final} "
          f"({int8}input float32 {tuple(dummy.shape)}, output ({cfg.batch_size}, {cfg.class_num})"
          f"{f'; {folded} BatchNorms folded into their convolutions' if folded else ''})")
    return 0


if __name__ == "__main__":
    run_entry_point(main)
