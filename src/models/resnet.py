"""ResNet-18/34/50/101/152 in torchvision's layout (ResNet v1.5), as classifier or backbone.

He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016), as torchvision's
``models/resnet.py``: the stride of a downsampling Bottleneck on its 3x3 convolution, parameter
names as torchvision's (``conv1``, ``layer1.0.downsample.0``, ``fc``). Layout, MindCV's names,
the backbone form and stochastic depth: docs/network.md.
"""
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import mindspore as ms
import mindspore.nn as nn
import mindspore.ops as ops
import numpy as np
from mindspore import Parameter, Tensor
from mindspore.common.initializer import HeNormal, HeUniform, Uniform

from src.models.drop_path import DropPathScales, drop_path_rates
from src.models.stem_pool import BUILT_MAX_POOLS, STEM_POOL_PAD_MODES, use_device_max_pool
from src.utils.architectures import ARCHITECTURES, STAGE_WIDTHS, STEM_CHANNELS
from src.utils.checkpoint import DROP_PATH_STEP

# torch.nn.BatchNorm2d(momentum=0.1) updates running = 0.9 * running + 0.1 * batch;
# MindSpore's momentum is the weight of the old value, so the same update is momentum=0.9.
BN_MOMENTUM = 0.9
BN_EPS = 1e-5
# maps of features_only (timm's out_indices): 0 the stem after its ReLU (stride 2), 1-4 layer1
# .. layer4 (strides 4, 8, 16, 32)
FEATURE_INDICES = (0, 1, 2, 3, 4)


def conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    """3x3 convolution, padding 1 on every side (as torch), no bias."""
    return nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=stride, pad_mode="pad",
                     padding=1, has_bias=False,
                     weight_init=HeNormal(mode="fan_out", nonlinearity="relu"))


def conv1x1(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    """1x1 convolution, no padding, no bias."""
    return nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, pad_mode="valid",
                     has_bias=False, weight_init=HeNormal(mode="fan_out", nonlinearity="relu"))


def batch_norm(num_features: int, zero_init: bool = False) -> nn.BatchNorm2d:
    """BatchNorm2d equal to torch's defaults (eps 1e-5, momentum 0.1); gamma 1 (or 0), beta 0."""
    return nn.BatchNorm2d(num_features, eps=BN_EPS, momentum=BN_MOMENTUM,
                          gamma_init="zeros" if zero_init else "ones", beta_init="zeros")


def is_integer(value: object) -> bool:
    """Whether ``value`` is an integer (Python's or numpy's), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


class ResidualBlock(nn.Cell):
    """The end both blocks share: stochastic depth, the shortcut, the ReLU."""

    def add_shortcut(self, out: Tensor, x: Tensor, drop_path_scales: Tensor | None) -> Tensor:
        """ReLU(branch ``out`` (times its drop path scale) + shortcut of the input ``x``)."""
        identity = x
        if drop_path_scales is not None and self.drop_path_index >= 0:
            out = out * drop_path_scales[self.drop_path_index].astype(out.dtype)
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class BasicBlock(ResidualBlock):
    """Two 3x3 convolutions (the first with ``stride``) and the shortcut; ResNet-18/34.

    Args:
        downsample (nn.Cell, optional): Projection of the shortcut when the shape changes.
        zero_init_residual (bool): Start the last BN's gamma at 0 (the block is the identity).
        drop_path_index (int): This block's row of the stochastic depth scales, or -1: none.

    Inputs: float (N, in_channels, H, W) and ``DropPathScales``' output or None.
    Outputs: (N, channels * expansion, H / stride, W / stride).
    """

    expansion = 1

    def __init__(self, in_channels: int, channels: int, stride: int = 1, *,
                 downsample: nn.Cell | None = None, zero_init_residual: bool = False,
                 drop_path_index: int = -1) -> None:
        super().__init__()
        self.conv1 = conv3x3(in_channels, channels, stride)
        self.bn1 = batch_norm(channels)
        self.relu = nn.ReLU()
        self.conv2 = conv3x3(channels, channels)
        self.bn2 = batch_norm(channels, zero_init=zero_init_residual)
        self.downsample = downsample
        self.drop_path_index = drop_path_index

    def construct(self, x: Tensor, drop_path_scales: Tensor | None = None) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.add_shortcut(self.bn2(self.conv2(out)), x, drop_path_scales)


class Bottleneck(ResidualBlock):
    """1x1 reduce, 3x3 (with ``stride``: v1.5), 1x1 expand by 4; ResNet-50/101/152.
    Arguments, inputs and outputs as ``BasicBlock``'s."""

    expansion = 4

    def __init__(self, in_channels: int, channels: int, stride: int = 1, *,
                 downsample: nn.Cell | None = None, zero_init_residual: bool = False,
                 drop_path_index: int = -1) -> None:
        super().__init__()
        out_channels = channels * self.expansion
        self.conv1 = conv1x1(in_channels, channels)
        self.bn1 = batch_norm(channels)
        self.conv2 = conv3x3(channels, channels, stride)
        self.bn2 = batch_norm(channels)
        self.conv3 = conv1x1(channels, out_channels)
        self.bn3 = batch_norm(out_channels, zero_init=zero_init_residual)
        self.relu = nn.ReLU()
        self.downsample = downsample
        self.drop_path_index = drop_path_index

    def construct(self, x: Tensor, drop_path_scales: Tensor | None = None) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.add_shortcut(self.bn3(self.conv3(out)), x, drop_path_scales)


BLOCKS = {"BasicBlock": BasicBlock, "Bottleneck": Bottleneck}  # Architecture.block -> class


class ResidualStage(nn.SequentialCell):
    """A stage (``layer1`` .. ``layer4``): blocks in sequence, each given the drop path scales."""

    def construct(self, x: Tensor, drop_path_scales: Tensor | None = None) -> Tensor:
        for block in self.cell_list:
            x = block(x, drop_path_scales)
        return x


class ResNet(nn.Cell):
    """ResNet classifier, or with ``features_only`` backbone; torchvision's initialization.

    Args:
        block (type): ``BasicBlock`` or ``Bottleneck``; ``layers``: blocks per stage.
        zero_init_residual (bool): Zero the last BN gamma of every block (Goyal et al. 2017).
        stem_pool_pad_mode (str): ``pad`` (torchvision's) or ``same`` (MindCV's stem pool).
        drop_path_rate (float): Stochastic depth in training, [0, 1); ``drop_path_seed`` (the
            run's seed) and ``shard_id`` (rank) key its draws: docs/network.md#stochastic-depth.
        features_only (bool): No ``fc``; the output is the maps of ``out_indices``
            (``FEATURE_INDICES``) in network order, whatever their order given (sorted,
            repeats dropped; ``feature_info`` describes them).

    Inputs: float32 (N, 3, H, W) normalized images, H and W at least 32.
    Outputs: (N, class_num) logits, or the tuple of maps (N, C, ceil(H / stride), ceil(W / stride)).

    Raises:
        ValueError: If ``class_num`` is not an integer >= 1, ``layers`` has not 4 entries,
            ``stem_pool_pad_mode`` is not in ``STEM_POOL_PAD_MODES``, ``drop_path_rate`` not in
            [0, 1), ``out_indices`` not a non-empty sequence of integers of
            ``FEATURE_INDICES``, or other than ``FEATURE_INDICES`` without ``features_only``
            (a classifier would ignore it).
    """

    def __init__(self, block: type[ResidualBlock], layers: Sequence[int], *,
                 class_num: int = 1000, zero_init_residual: bool = False,
                 stem_pool_pad_mode: str = "pad", drop_path_rate: float = 0.0,
                 drop_path_seed: int = 0, shard_id: int = 0, features_only: bool = False,
                 out_indices: Sequence[int] = FEATURE_INDICES) -> None:
        super().__init__()
        if not is_integer(class_num) or class_num < 1:
            raise ValueError(f"class_num must be a positive integer, got {class_num!r}")
        if len(layers) != 4:
            raise ValueError(f"layers must give 4 block counts, got {layers}")
        if stem_pool_pad_mode not in STEM_POOL_PAD_MODES:
            raise ValueError(f"stem_pool_pad_mode must be one of {', '.join(STEM_POOL_PAD_MODES)}, "
                             f"got {stem_pool_pad_mode!r}")
        if not 0.0 <= drop_path_rate < 1.0:
            raise ValueError(f"drop_path_rate must be in [0, 1), got {drop_path_rate}")
        if (not isinstance(out_indices, Sequence) or isinstance(out_indices, (str, bytes))
                or not out_indices
                or not all(is_integer(i) and i in FEATURE_INDICES for i in out_indices)):
            raise ValueError(f"out_indices must be a non-empty subset of {FEATURE_INDICES} (a "
                             f"sequence of integers), got {out_indices!r}")
        if not features_only and tuple(sorted(set(out_indices))) != FEATURE_INDICES:
            raise ValueError(f"out_indices {tuple(out_indices)} is only read with features_only "
                             f"(a backbone's maps); a classifier outputs its logits: pass "
                             f"features_only=True, or leave out_indices out")
        self.stem_pool_pad_mode = stem_pool_pad_mode
        self.in_channels = STEM_CHANNELS
        self.zero_init_residual = zero_init_residual
        self.drop_path_rate = float(drop_path_rate)
        self.features_only = features_only
        self.out_indices = tuple(sorted({int(i) for i in out_indices}))  # network order
        rates = drop_path_rates(self.drop_path_rate, sum(layers))
        # the blocks with a rate > 0, in network order (timm adds no DropPath to the others),
        # and each block's row of the scales (-1: none)
        self.drop_path_blocks = [i for i, rate in enumerate(rates) if rate > 0]
        rows = [self.drop_path_blocks.index(i) if rate > 0 else -1
                for i, rate in enumerate(rates)]
        ends = np.cumsum(layers).tolist()
        stage_rows = [rows[end - n:end] for n, end in zip(layers, ends)]
        self.conv1 = nn.Conv2d(3, STEM_CHANNELS, kernel_size=7, stride=2, pad_mode="pad",
                               padding=3, has_bias=False,
                               weight_init=HeNormal(mode="fan_out", nonlinearity="relu"))
        self.bn1 = batch_norm(STEM_CHANNELS)
        self.relu = nn.ReLU()
        self.maxpool = BUILT_MAX_POOLS[stem_pool_pad_mode]()
        self.layer1 = self._make_layer(block, STAGE_WIDTHS[0], stage_rows[0])
        self.layer2 = self._make_layer(block, STAGE_WIDTHS[1], stage_rows[1], stride=2)
        self.layer3 = self._make_layer(block, STAGE_WIDTHS[2], stage_rows[2], stride=2)
        self.layer4 = self._make_layer(block, STAGE_WIDTHS[3], stage_rows[3], stride=2)
        stages = [dict(num_chs=STEM_CHANNELS, reduction=2, module="relu")] + [
            dict(num_chs=w * block.expansion, reduction=4 * 2 ** i, module=f"layer{i + 1}")
            for i, w in enumerate(STAGE_WIDTHS)]
        # timm's and MindCV's: every map on a classifier, the selected ones on a backbone
        self.feature_info = [stages[i] for i in self.out_indices] if features_only else stages
        if not features_only:
            fc_in = STAGE_WIDTHS[-1] * block.expansion
            self.fc = nn.Dense(fc_in, int(class_num),
                               weight_init=HeUniform(negative_slope=math.sqrt(5)),
                               bias_init=Uniform(1.0 / math.sqrt(fc_in)))
        if self.drop_path_blocks:
            self.drop_path_step = Parameter(Tensor(0, ms.int32), name=DROP_PATH_STEP,
                                            requires_grad=False)
            self.drop_path_scales = DropPathScales([rates[i] for i in self.drop_path_blocks],
                                                   self.drop_path_blocks, drop_path_seed,
                                                   shard_id)

    def _make_layer(self, block, channels, rows, stride=1):
        """A stage of ``len(rows)`` blocks; ``rows``: each block's ``drop_path_index``."""
        downsample = None
        if stride != 1 or self.in_channels != channels * block.expansion:
            downsample = nn.SequentialCell([
                conv1x1(self.in_channels, channels * block.expansion, stride),
                batch_norm(channels * block.expansion),
            ])
        cells = [block(self.in_channels, channels, stride, downsample=downsample,
                       zero_init_residual=self.zero_init_residual, drop_path_index=rows[0])]
        self.in_channels = channels * block.expansion
        for row in rows[1:]:
            cells.append(block(self.in_channels, channels,
                               zero_init_residual=self.zero_init_residual, drop_path_index=row))
        return ResidualStage(cells)

    def construct(self, x: Tensor) -> Tensor | tuple[Tensor, ...]:
        if self.features_only:
            maps = self.stage_maps(x)
            return tuple([maps[i] for i in self.out_indices])
        return self.fc(self.pre_logits(x))

    def pre_logits(self, x: Tensor) -> Tensor:
        """The pooled last-stage features (N, C) that ``fc`` reads (timm's
        ``forward_head(pre_logits=True)``)."""
        return ops.mean(self.stage_maps(x)[-1], (2, 3))

    def stage_maps(self, x: Tensor) -> tuple[Tensor, ...]:
        """The maps of ``FEATURE_INDICES``: the stem's and each stage's output."""
        stem = self.relu(self.bn1(self.conv1(x)))
        x = self.maxpool(stem)
        if self.training and self.drop_path_blocks:
            scales = self.drop_path_scales(self.drop_path_step.value(), x.shape[0])
            c2 = self.layer1(x, scales)
            c3 = self.layer2(c2, scales)
            c4 = self.layer3(c3, scales)
            c5 = self.layer4(c4, scales)
        else:
            c2 = self.layer1(x)
            c3 = self.layer2(c2)
            c4 = self.layer3(c3)
            c5 = self.layer4(c4)
        return stem, c2, c3, c4, c5


def _build(net_name: str, device_target: str | None = None, **kwargs: Any) -> ResNet:
    """The ``ARCHITECTURES`` entry ``net_name`` as a ``ResNet`` (``kwargs``: its keywords), its
    stem pool the form of ``device_target`` (``use_device_max_pool``) when given."""
    arch = ARCHITECTURES[net_name]
    net = ResNet(BLOCKS[arch.block], list(arch.layers), **kwargs)
    return net if device_target is None else use_device_max_pool(net, device_target)


NETWORK_REGISTRY: dict[str, Callable[..., ResNet]] = {}  # net_name -> constructor


def register_network(constructor: Callable[..., ResNet]) -> Callable[..., ResNet]:
    """Add ``constructor`` to ``NETWORK_REGISTRY`` under its function name; returns it."""
    NETWORK_REGISTRY[constructor.__name__] = constructor
    return constructor


@register_network
def resnet18(class_num: int = 1000, **kwargs: Any) -> ResNet:
    """ResNet-18; keywords as ``create_network``'s."""
    return _build("resnet18", class_num=class_num, **kwargs)


@register_network
def resnet34(class_num: int = 1000, **kwargs: Any) -> ResNet:
    """ResNet-34; keywords as ``create_network``'s."""
    return _build("resnet34", class_num=class_num, **kwargs)


@register_network
def resnet50(class_num: int = 1000, **kwargs: Any) -> ResNet:
    """ResNet-50 v1.5; keywords as ``create_network``'s."""
    return _build("resnet50", class_num=class_num, **kwargs)


@register_network
def resnet101(class_num: int = 1000, **kwargs: Any) -> ResNet:
    """ResNet-101 v1.5; keywords as ``create_network``'s."""
    return _build("resnet101", class_num=class_num, **kwargs)


@register_network
def resnet152(class_num: int = 1000, **kwargs: Any) -> ResNet:
    """ResNet-152 v1.5; keywords as ``create_network``'s."""
    return _build("resnet152", class_num=class_num, **kwargs)


def create_network(net_name: str, *, class_num: int = 1000, zero_init_residual: bool = False,
                   device_target: str | None = None, stem_pool_pad_mode: str = "pad",
                   drop_path_rate: float = 0.0, drop_path_seed: int = 0, shard_id: int = 0,
                   features_only: bool = False,
                   out_indices: Sequence[int] = FEATURE_INDICES) -> ResNet:
    """Build a ResNet by name: ``NETWORK_REGISTRY[net_name]`` with these keywords (``ResNet``'s,
    and ``device_target``: the stem pool form with native kernels there; None: the built form).

    Raises:
        KeyError: If ``net_name`` is not a known network; the message lists the valid names.
        ValueError: As ``ResNet`` and ``use_device_max_pool``.
    """
    if net_name not in NETWORK_REGISTRY:
        raise KeyError(f"unknown net_name {net_name!r}; valid names: {', '.join(NETWORK_REGISTRY)}")
    return NETWORK_REGISTRY[net_name](
        class_num=class_num, zero_init_residual=zero_init_residual, device_target=device_target,
        stem_pool_pad_mode=stem_pool_pad_mode, drop_path_rate=drop_path_rate,
        drop_path_seed=drop_path_seed, shard_id=shard_id, features_only=features_only,
        out_indices=out_indices)


def last_feature_map_side(image_size: int) -> int:
    """Side in pixels of ``layer4``'s map for square inputs of ``image_size`` pixels: the stem,
    the max pool and ``layer2`` .. ``layer4`` each halve it, rounding up."""
    side = image_size
    for _ in range(5):
        side = -(-side // 2)
    return side
