"""The stem's 3x3 / stride-2 max pool in its forms per ``stem_pool_pad_mode``, device and export.

No form holds parameters; which runs where and why: docs/network.md#stem-max-pool.
"""
import mindspore.nn as nn
import mindspore.ops as ops
from mindspore import Tensor


def stem_max_pool() -> nn.MaxPool2d:
    """torchvision's ``MaxPool2d(3, 2, padding=1)``: float (N, C, H, W) -> (N, C, (H + 1) // 2,
    (W + 1) // 2), -inf padding."""
    return nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="pad", padding=1)


class MaxPoolPad1(nn.Cell):
    """``stem_max_pool`` as zero padding + 'valid' pooling: equal on non-negative input (after
    the stem's ReLU); Ascend AI Core kernels and an ONNX form."""

    def __init__(self) -> None:
        super().__init__()
        # ops.Pad (not nn.ZeroPad2d / PadV3, which the ONNX exporter also rejects).
        self.pad = ops.Pad(((0, 0), (0, 0), (1, 1), (1, 1)))
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="valid")

    def construct(self, x: Tensor) -> Tensor:
        return self.pool(self.pad(x))


def same_max_pool() -> nn.MaxPool2d:
    """MindCV's ``nn.MaxPool2d(3, 2, pad_mode="same")`` (``mindcv/models/resnet.py``): float
    (N, C, H, W) -> (N, C, ceil(H / 2), ceil(W / 2)), an even side padded at the end only."""
    return nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="same")


# stem_pool_pad_mode: pad = torchvision's pool, same = MindCV's
STEM_POOL_PAD_MODES = ("pad", "same")
# the form a network is built with (create_network without device_target)
BUILT_MAX_POOLS = {"pad": stem_max_pool, "same": same_max_pool}
# the form per pad mode and device target: the one with native kernels there
STEM_MAX_POOLS = {
    "pad": {"CPU": stem_max_pool, "GPU": stem_max_pool, "Ascend": MaxPoolPad1},
    "same": {"CPU": same_max_pool, "GPU": same_max_pool, "Ascend": same_max_pool},
}
# the form of ONNX and AIR exports, equal after the ReLU
EXPORTABLE_MAX_POOLS = {"pad": MaxPoolPad1, "same": same_max_pool}


def use_exportable_max_pool(net: nn.Cell) -> nn.Cell:
    """Give ``net`` (a ``ResNet``) its ``EXPORTABLE_MAX_POOLS`` stem pool in place; returns it."""
    net.maxpool = EXPORTABLE_MAX_POOLS[net.stem_pool_pad_mode]()
    return net


def use_device_max_pool(net: nn.Cell, device_target: str) -> nn.Cell:
    """Give ``net`` (a ``ResNet``) its ``STEM_MAX_POOLS`` stem pool for ``device_target`` (CPU,
    GPU, Ascend) in place, before ``auto_mixed_precision`` and compiling; returns it.

    Raises:
        ValueError: If ``device_target`` has no entry (lists the valid ones).
    """
    forms = STEM_MAX_POOLS[net.stem_pool_pad_mode]
    if device_target not in forms:
        raise ValueError(f"no stem max pool for device_target {device_target!r}; valid: "
                         f"{', '.join(forms)}")
    net.maxpool = forms[device_target]()
    return net
