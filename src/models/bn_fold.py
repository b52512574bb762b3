"""Folding BatchNorm into the preceding convolution for exported inference graphs, as
torch.ao's ``fuse_conv_bn_eval``: docs/network.md#freezing-and-batchnorm-folding."""
import mindspore as ms
import mindspore.nn as nn
import numpy as np


def folded_conv(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A new ``nn.Conv2d`` (float32 weight and bias) equal to ``conv`` then ``bn`` in inference.

    Raises:
        ValueError: If the channel counts of the two cells differ.
    """
    weight = conv.weight.asnumpy().astype(np.float64)
    if weight.shape[0] != bn.moving_mean.shape[0]:
        raise ValueError(f"cannot fold BatchNorm {bn.moving_mean.name} ({bn.moving_mean.shape[0]}"
                         f" channels) into {conv.weight.name} ({weight.shape[0]} outputs)")
    scale = bn.gamma.asnumpy().astype(np.float64) / np.sqrt(
        bn.moving_variance.asnumpy().astype(np.float64) + bn.eps)
    bias = conv.bias.asnumpy().astype(np.float64) if conv.has_bias else 0.0
    new_bias = bn.beta.asnumpy() + (bias - bn.moving_mean.asnumpy().astype(np.float64)) * scale
    folded = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                       pad_mode=conv.pad_mode, padding=conv.padding, dilation=conv.dilation,
                       group=conv.group, has_bias=True,
                       weight_init=ms.Tensor((weight * scale[:, None, None, None])
                                             .astype(np.float32)),
                       bias_init=ms.Tensor(new_bias.astype(np.float32)))
    folded.set_train(False)
    return folded


def conv_bn_pairs(cell: nn.Cell) -> list[tuple[str, str]]:
    """(conv, BatchNorm) child name pairs of ``cell``: ``convN``/``bnN`` siblings, and a Conv2d
    followed by a BatchNorm2d in a ``SequentialCell`` (``downsample``)."""
    children = dict(cell.name_cells())
    if isinstance(cell, nn.SequentialCell):
        names = list(children)
        return [(a, b) for a, b in zip(names, names[1:])
                if isinstance(children[a], nn.Conv2d) and isinstance(children[b], nn.BatchNorm2d)]
    return [(f"conv{name[2:]}", name) for name, child in children.items()
            if name.startswith("bn") and isinstance(child, nn.BatchNorm2d)
            and isinstance(children.get(f"conv{name[2:]}"), nn.Conv2d)]


def fold_batchnorm(net: nn.Cell) -> int:
    """Fold every BatchNorm of ``net`` (torchvision's layout, weights loaded) into the
    convolution before it, in place (the BatchNorm cells become ``nn.Identity``; inference
    only); returns how many."""
    folded = 0
    for _, cell in list(net.cells_and_names()):
        for conv_name, bn_name in conv_bn_pairs(cell):
            children = dict(cell.name_cells())
            new_conv = folded_conv(children[conv_name], children[bn_name])
            prefix = children[conv_name].weight.name[:-len("weight")]
            if isinstance(cell, nn.SequentialCell):
                cell[int(conv_name)], cell[int(bn_name)] = new_conv, nn.Identity()
            else:
                setattr(cell, conv_name, new_conv)
                setattr(cell, bn_name, nn.Identity())
            # a cell assigned in place gets only its attribute name as prefix: restore the
            # full name (layer1.0.conv1.weight), and name the new bias beside it
            new_conv.weight.name, new_conv.bias.name = prefix + "weight", prefix + "bias"
            folded += 1
    net.set_train(False)
    return folded
