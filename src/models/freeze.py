"""Which parts of a ResNet train when fine-tuning: frozen stages (torchvision's
``trainable_backbone_layers``) and frozen BatchNorm (``FrozenBatchNorm2d``, ``norm_eval``).

Applied to a network before it is wrapped: docs/network.md#freezing-and-batchnorm-folding.
"""
import logging
from collections.abc import Iterable, Sequence

import mindspore as ms
import mindspore.nn as nn

from src.utils.device import apply_fusion_config
from src.utils.limits import MAX_TRAINABLE_LAYERS

STAGES_LAST_FIRST = ("layer4", "layer3", "layer2", "layer1", "conv1")
"""torchvision's order: the first ``trainable_layers`` of these train (5 = all, with ``bn1``)."""
HEAD = "fc"  # the classifier: always trains


def trainable_stages(trainable_layers: int) -> tuple[str, ...]:
    """Names of the top-level cells (``fc`` first) that train with ``trainable_layers``: 0 =
    only ``fc``, 1 = ``layer4`` and ``fc``, ..., 5 = everything."""
    stages = list(STAGES_LAST_FIRST[:trainable_layers])
    if trainable_layers == MAX_TRAINABLE_LAYERS:
        stages.append("bn1")
    return (HEAD, *stages)


def _top(name):
    return name.split(".", 1)[0]


def _batchnorms(net):
    return [(name, cell) for name, cell in net.cells_and_names()
            if isinstance(cell, nn.BatchNorm2d)]


RUNNING_STATISTICS = (".moving_mean", ".moving_variance")


def never_trains(param: ms.Parameter) -> bool:
    """Whether ``param`` is state, not a weight: BatchNorm running statistics or an integer
    counter (``drop_path_step``)."""
    return param.name.endswith(RUNNING_STATISTICS) or param.dtype not in ms.dtype.float_type


def set_trainable_layers(net: nn.Cell, trainable_layers: int, freeze_bn: bool = False) -> int:
    """Make the stages of ``trainable_layers`` (0..5, ``trainable_stages``) of ``net`` (not yet
    wrapped) train and freeze the others, in place, every BatchNorm frozen with ``freeze_bn``;
    callable again (LP-FT's switch). Returns the parameter tensors frozen (not BN statistics)."""
    keep = trainable_stages(trainable_layers)
    frozen = 0
    for param in net.get_parameters():
        if never_trains(param):
            continue
        param.requires_grad = _top(param.name) in keep
        frozen += not param.requires_grad
    for name, cell in _batchnorms(net):
        cell.use_batch_statistics = None if _top(name) in keep and not freeze_bn else False
    return frozen


def freeze_batchnorm(net: nn.Cell) -> int:
    """Make every BatchNorm layer of ``net`` use and keep its running statistics, in place
    (gamma and beta still train where their stage trains); returns how many."""
    layers = _batchnorms(net)
    for _, cell in layers:
        cell.use_batch_statistics = False
    return len(layers)


def count_parameters(params: Iterable[ms.Parameter]) -> int:
    """Number of scalar values in ``params`` (an iterable of Parameters)."""
    total = 0
    for param in params:
        size = 1
        for dim in param.shape:
            size *= dim
        total += size
    return total


def set_trainable(net: nn.Cell, *, trainable_layers: int, freeze_bn: bool, log: logging.Logger,
                  device_num: int = 1, fusion_config: Sequence[int] = (),
                  net_name: str = "") -> None:
    """``set_trainable_layers``, a log line of what trains, and with ``device_num`` > 1 the
    gradient all-reduce fused over the trainable tensors (``apply_fusion_config``:
    ``fusion_config`` its split points, empty: derived; ``net_name`` for its message)."""
    set_trainable_layers(net, trainable_layers, freeze_bn)
    params = net.trainable_params()
    everything = [p for p in net.get_parameters() if not never_trains(p)]
    log.info("trainable_layers %d%s: %d of %d parameters train (%d of %d tensors)",
             trainable_layers, ", BatchNorm frozen" if freeze_bn else "",
             count_parameters(params), count_parameters(everything), len(params),
             len(everything))
    if device_num > 1:
        fusion = apply_fusion_config(list(fusion_config), len(params), net_name)
        log.info("gradient all-reduce fused in groups split at %s of %d trainable tensors",
                 fusion, len(params))
