"""Export a ResNet checkpoint to MindIR, ONNX or AIR for inference.

    python export.py --checkpoint_path CKPT --file_format MINDIR --file_name resnet50 --batch_size 1

The exported graph takes float32 (batch_size, 3, eval_image_size, eval_image_size) images
preprocessed as in eval (resize, center crop, ImageNet normalization) and returns
(batch_size, class_num) logits. A checkpoint's weight EMA is exported when it has one
(``use_ema``). MINDIR and ONNX export on any backend; AIR needs Ascend. The ONNX graph's input is
named ``image`` and its output ``logits``. With ``fold_bn`` (default) every BatchNorm is
folded into the convolution before it (``src/models/bn_fold.py``): same logits to float32 rounding,
fewer operations to run.

With ``--quantize int8`` (ONNX only) the float32 graph is then statically quantized with ONNX
Runtime (``src/deploy/quantize.py``: QDQ, per-channel int8 weights, uint8 activations),
calibrated on ``calibration_images`` real images of ``--calibration_data_path`` (class folders,
preprocessed as in eval); the ``.onnx`` file still takes float32 images and returns float32 logits::

    python export.py --checkpoint_path CKPT --file_format ONNX --quantize int8 \
        --calibration_data_path /data/imagenet/train --file_name resnet50_int8 --batch_size 1
"""
import src.env  # noqa: F401  first: sets the oneDNN default before MindSpore loads

# isort: split

import os
import tempfile

import mindspore as ms
import numpy as np

from src.deploy.inference import load_network
from src.deploy.quantize import check_quantize_config, export_int8, select_calibration_images
from src.models.bn_fold import fold_batchnorm
from src.models.resnet import use_exportable_max_pool
from src.utils.cli import run_entry_point
from src.utils.config import ConfigError, parse_config
from src.utils.device import setup_device
from src.utils.logger import get_logger

SUFFIXES = {"MINDIR": ".mindir", "ONNX": ".onnx", "AIR": ".air"}

SECTIONS = ("network", "data", "device", "model file", "export")
"""The config.yaml sections this entry point reads (its --help lists them)."""


def export_model(net, dummy, file_name, file_format):
    """Write ``net`` traced on ``dummy``. ONNX goes through ``mindspore.onnx.export`` (the
    successor of ``export(file_format='ONNX')``) with the graph's input named ``image`` and its
    output ``logits``, after giving ``net`` the max pool the exporter accepts (in place, same
    output: ``src.models.resnet.use_exportable_max_pool``)."""
    if file_format == "ONNX":
        use_exportable_max_pool(net)
        ms.onnx.export(net, dummy, file_name=file_name, input_names=["image"],
                       output_names=["logits"])
    else:
        ms.export(net, dummy, file_name=file_name, file_format=file_format)


def export_int8_onnx(net, dummy, cfg, calibration):
    """Export ``net`` as float32 ONNX into a temporary folder beside ``cfg.file_name``, then
    quantize it to ``cfg.file_name + ".onnx"`` (``src.deploy.quantize.export_int8``: written
    whole or not at all), calibrated on the image paths ``calibration``."""
    folder = os.path.dirname(os.path.abspath(cfg.file_name))
    os.makedirs(folder, exist_ok=True)  # as ms.onnx.export does for the float32 file
    with tempfile.TemporaryDirectory(prefix=".export.", dir=folder) as tmp:
        fp32 = os.path.join(tmp, "fp32")
        export_model(net, dummy, fp32, "ONNX")
        export_int8(fp32 + ".onnx", cfg.file_name + ".onnx", calibration, cfg.batch_size,
                    cfg.eval_image_size, cfg.eval_resize)


def main(argv=None):
    """Export as configured by ``argv``; return 0."""
    cfg = parse_config(argv, description=__doc__.split("\n")[0], sections=SECTIONS)
    get_logger("export")  # also shows the src modules' lines (which weights were loaded)
    if cfg.file_format == "AIR" and cfg.device_target != "Ascend":
        raise ConfigError(f"file_format AIR needs device_target Ascend (got "
                          f"{cfg.device_target}); use MINDIR or ONNX here")
    check_quantize_config(cfg)
    calibration = (select_calibration_images(cfg.calibration_data_path, cfg.calibration_images)
                   if cfg.quantize == "int8" else None)
    setup_device(cfg.mode, cfg.device_target, device_id=cfg.device_id, seed=cfg.seed)

    net = load_network(cfg.net_name, cfg.class_num, cfg.checkpoint_path, cfg.use_ema)
    folded = fold_batchnorm(net) if cfg.fold_bn else 0
    size = cfg.eval_image_size
    dummy = ms.Tensor(np.zeros([cfg.batch_size, 3, size, size], np.float32))
    if calibration:
        export_int8_onnx(net, dummy, cfg, calibration)
    else:
        export_model(net, dummy, cfg.file_name, cfg.file_format)
    int8 = (f"int8 (static QDQ) calibrated on {len(calibration)} images of "
            f"{cfg.calibration_data_path}; " if calibration else "")
    print(f"exported {cfg.checkpoint_path} -> {cfg.file_name}{SUFFIXES[cfg.file_format]} "
          f"({int8}input float32 {tuple(dummy.shape)}, output ({cfg.batch_size}, {cfg.class_num})"
          f"{f'; {folded} BatchNorms folded into their convolutions' if folded else ''})")
    return 0


if __name__ == "__main__":
    run_entry_point(main)
