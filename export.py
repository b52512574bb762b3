"""Export a ResNet checkpoint to MindIR, ONNX or AIR for inference.

    python export.py --checkpoint_path CKPT --file_format MINDIR --file_name resnet50 --batch_size 1

The exported graph takes float32 (batch_size, 3, image_size, image_size) images preprocessed as
in eval (resize, center crop, ImageNet normalization) and returns (batch_size, class_num)
logits. MINDIR and ONNX export on any backend; AIR needs Ascend. The ONNX graph's input is
named ``image`` and its output ``logits``. With ``fold_bn`` (default) every BatchNorm is
folded into the convolution before it (``src/bn_fold.py``): same logits to float32 rounding,
fewer operations to run.
"""
import src.env  # first: sets the oneDNN default before MindSpore loads
# isort: split

import mindspore as ms
import numpy as np

from src.bn_fold import fold_batchnorm
from src.cli import run_entry_point
from src.config import ConfigError, parse_config
from src.device import setup_device
from src.inference import load_network

SUFFIXES = {"MINDIR": ".mindir", "ONNX": ".onnx", "AIR": ".air"}

SECTIONS = ("network", "data", "device", "model file", "export")
"""The config.yaml sections this entry point reads (its --help lists them)."""


def export_model(net, dummy, file_name, file_format):
    """Write ``net`` traced on ``dummy``. ONNX goes through ``mindspore.onnx.export`` (the
    successor of ``export(file_format='ONNX')``) with the graph's input named ``image`` and its
    output ``logits``."""
    if file_format == "ONNX":
        ms.onnx.export(net, dummy, file_name=file_name, input_names=["image"],
                       output_names=["logits"])
    else:
        ms.export(net, dummy, file_name=file_name, file_format=file_format)


def main(argv=None):
    """Export as configured by ``argv``; return 0."""
    cfg = parse_config(argv, description=__doc__.split("\n")[0], sections=SECTIONS)
    if cfg.file_format == "AIR" and cfg.device_target != "Ascend":
        raise ConfigError(f"file_format AIR needs device_target Ascend (got "
                          f"{cfg.device_target}); use MINDIR or ONNX here")
    setup_device(cfg.mode, cfg.device_target, device_id=cfg.device_id, seed=cfg.seed)

    net = load_network(cfg.net_name, cfg.class_num, cfg.checkpoint_path)
    folded = fold_batchnorm(net) if cfg.fold_bn else 0
    dummy = ms.Tensor(np.zeros([cfg.batch_size, 3, cfg.image_size, cfg.image_size], np.float32))
    export_model(net, dummy, cfg.file_name, cfg.file_format)
    print(f"exported {cfg.checkpoint_path} -> {cfg.file_name}{SUFFIXES[cfg.file_format]} "
          f"(input float32 {tuple(dummy.shape)}, output ({cfg.batch_size}, {cfg.class_num})"
          f"{f'; {folded} BatchNorms folded into their convolutions' if folded else ''})")
    return 0


if __name__ == "__main__":
    run_entry_point(main)
