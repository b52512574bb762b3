"""The ResNet architectures this package builds, one table for every module that names them.

Depths from He et al. 2016, Table 1; feature widths and parameter counts as torchvision's.
"""
from dataclasses import dataclass

BLOCK_EXPANSION = {"BasicBlock": 1, "Bottleneck": 4}  # block output per 3x3 conv channel
STAGE_WIDTHS = (64, 128, 256, 512)  # 3x3 conv channels of layer1 .. layer4
STEM_CHANNELS = 64  # conv1, bn1


@dataclass(frozen=True)
class Architecture:
    """One depth: block kind (a ``BLOCK_EXPANSION`` key), blocks in ``layer1`` .. ``layer4``,
    trainable parameters at 1000 classes (torchvision's count)."""

    block: str
    layers: tuple[int, int, int, int]
    params: int

    @property
    def num_features(self) -> int:
        """Channels entering the classifier (timm's ``num_features``)."""
        return self.stage_channels[-1]

    @property
    def stage_channels(self) -> tuple[int, ...]:
        """Output channels of ``layer1`` .. ``layer4``."""
        return tuple(w * BLOCK_EXPANSION[self.block] for w in STAGE_WIDTHS)


ARCHITECTURES = {
    "resnet18": Architecture("BasicBlock", (2, 2, 2, 2), 11_689_512),
    "resnet34": Architecture("BasicBlock", (3, 4, 6, 3), 21_797_672),
    "resnet50": Architecture("Bottleneck", (3, 4, 6, 3), 25_557_032),  # v1.5
    "resnet101": Architecture("Bottleneck", (3, 4, 23, 3), 44_549_160),
    "resnet152": Architecture("Bottleneck", (3, 8, 36, 3), 60_192_808),
}
"""``net_name`` -> its ``Architecture``; config.yaml's allowed ``net_name`` values are its keys."""


def architecture_of(block: str, layers: tuple[int, ...]) -> str | None:
    """The ``net_name`` of (block kind, blocks per stage), or None if none is built here."""
    return next((name for name, arch in ARCHITECTURES.items()
                 if (arch.block, arch.layers) == (block, tuple(layers))), None)
