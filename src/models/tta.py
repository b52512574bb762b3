"""Test-time augmentation as a Cell: the network's logits averaged over the image and its
horizontal flip, one Cell for eval, predict and export (docs/deployment.md#test-time-augmentation).
"""
from collections.abc import Callable

from mindspore import Tensor, nn, ops

WIDTH_AXIS = 3
"""The width axis of NCHW images."""


class FlipTTA(nn.Cell):
    """``(network(x) + network(flip(x))) / 2``: the logits of float32 (N, 3, H, W) images and
    of their mirror images (width reversed), averaged; (N, class_num) like ``network``'s.
    Parameter names are ``network``'s (no prefix)."""

    def __init__(self, network: nn.Cell) -> None:
        super().__init__(auto_prefix=False)
        self.network = network
        self.flip = ops.ReverseV2(axis=(WIDTH_AXIS,))

    def construct(self, x: Tensor) -> Tensor:
        return (self.network(x) + self.network(self.flip(x))) / 2.0  # a float: ONNX-exportable


TTA_WRAPPERS: dict[str, Callable[[nn.Cell], nn.Cell]] = {
    "none": lambda network: network, "flip": FlipTTA}
"""The network as each value of ``tta`` evaluates it."""

TTA_MODES = tuple(TTA_WRAPPERS)
"""Values of ``tta`` (config.yaml's choices); the first is the default."""


def with_tta(network: nn.Cell, tta: str) -> nn.Cell:
    """``network`` as ``tta`` evaluates it (``TTA_WRAPPERS``). ValueError for a value not in
    ``TTA_MODES``."""
    if tta not in TTA_WRAPPERS:
        raise ValueError(f"tta must be one of {', '.join(TTA_MODES)}, got {tta!r}")
    return TTA_WRAPPERS[tta](network)


def inner_network(net: nn.Cell) -> nn.Cell:
    """The network a ``FlipTTA`` wraps; any other Cell itself."""
    return net.network if isinstance(net, FlipTTA) else net
