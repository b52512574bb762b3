"""Which parts of a ResNet train when fine-tuning: frozen stages and frozen BatchNorm.

``set_trainable_layers`` follows torchvision's ``trainable_backbone_layers``
(``torchvision/models/detection/backbone_utils.py``, ``resnet_fpn_backbone``): of the stages
``conv1``, ``layer1`` .. ``layer4``, the last ``trainable_layers`` train (``bn1``, the stem's
BatchNorm, only with all five), ``fc`` always trains. ``freeze_batchnorm`` is the frozen
BatchNorm of torchvision's ``FrozenBatchNorm2d`` and of Detectron2/MMDetection's
``norm_eval``: running statistics used and kept, scale and shift still trainable.

Both work on a freshly built network (parameter names ``conv1.weight``, ``layer1.0.bn1.gamma``,
``fc.bias``), before it is wrapped in the training cell: the optimizer is then built over
``net.trainable_params()`` only, so frozen parameters get no gradient, no optimizer state and
no weight decay.
"""
import mindspore as ms
import mindspore.nn as nn

from src.utils.device import apply_fusion_config

#: torchvision's order: the first ``trainable_layers`` of these train (5 = all, with ``bn1``).
STAGES_LAST_FIRST = ("layer4", "layer3", "layer2", "layer1", "conv1")
#: The classifier: always trains.
HEAD = "fc"
#: Most stages that can train (``trainable_layers`` is in 0..MAX_TRAINABLE_LAYERS; the config
#: check, ``src.utils.config.check_values``, refuses other values).
MAX_TRAINABLE_LAYERS = len(STAGES_LAST_FIRST)


def trainable_stages(trainable_layers):
    """The top-level cells that train with ``trainable_layers``.

    Args:
        trainable_layers (int): 0 = only ``fc``, 1 = ``layer4`` and ``fc``, ...,
            5 = everything (torchvision's ``trainable_backbone_layers``).

    Returns:
        tuple[str]: Names of top-level cells of ``ResNet`` (``fc`` first).
    """
    stages = list(STAGES_LAST_FIRST[:trainable_layers])
    if trainable_layers == MAX_TRAINABLE_LAYERS:
        stages.append("bn1")
    return (HEAD, *stages)


def _top(name):
    return name.split(".", 1)[0]


def _batchnorms(net):
    return [(name, cell) for name, cell in net.cells_and_names()
            if isinstance(cell, nn.BatchNorm2d)]


#: Parameters that never train (BatchNorm running statistics).
RUNNING_STATISTICS = (".moving_mean", ".moving_variance")


def never_trains(param):
    """Whether ``param`` is state rather than a weight: BatchNorm running statistics, or an
    integer counter (the stochastic depth ``drop_path_step``)."""
    return param.name.endswith(RUNNING_STATISTICS) or param.dtype not in ms.dtype.float_type


def set_trainable_layers(net, trainable_layers, freeze_bn=False):
    """Make the stages of ``trainable_layers`` train and freeze the others, in place, as
    torchvision freezes a backbone: a frozen stage's parameters get ``requires_grad=False``
    and its BatchNorm layers use and keep their running statistics
    (``use_batch_statistics=False``: inference behaviour also in training mode). The stages
    that train get ``requires_grad=True`` back (running statistics never train) and their
    BatchNorm layers batch statistics in training mode, unless ``freeze_bn``. So it can be
    called again to change what trains (LP-FT's switch).

    Args:
        net (ResNet): A network of ``src.models.resnet``, not yet wrapped.
        trainable_layers (int): See ``trainable_stages``.
        freeze_bn (bool): Every BatchNorm layer keeps its running statistics (their gamma and
            beta still train where their stage trains): ``freeze_batchnorm``.

    Returns:
        int: Number of parameter tensors frozen (running statistics not counted).
    """
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


def freeze_batchnorm(net):
    """Make every BatchNorm layer of ``net`` use and keep its running statistics
    (``use_batch_statistics=False``), in place; its gamma and beta still train where their
    stage trains (torchvision's ``FrozenBatchNorm2d`` keeps them fixed; here they follow
    ``trainable_layers``). The usual choice for small batches of a new domain: batch
    statistics of a few images are noisy and would overwrite the pretrained ones.

    Args:
        net (nn.Cell): The network.

    Returns:
        int: Number of BatchNorm layers frozen.
    """
    layers = _batchnorms(net)
    for _, cell in layers:
        cell.use_batch_statistics = False
    return len(layers)


def count_parameters(params):
    """Number of scalar values in ``params`` (an iterable of Parameters)."""
    total = 0
    for param in params:
        size = 1
        for dim in param.shape:
            size *= dim
        total += size
    return total


def set_trainable(net, trainable_layers, freeze_bn, log, device_num=1, fusion_config=(),
                  net_name=""):
    """Set which stages of ``net`` train (``set_trainable_layers``), log how many parameters
    train, and in data parallel fuse the gradient all-reduce over the tensors that train
    (``src.utils.device.apply_fusion_config``).

    Args:
        net (ResNet): A network of ``src.models.resnet``, not yet wrapped.
        trainable_layers (int): 0..5, as ``trainable_stages``.
        freeze_bn (bool): Every BatchNorm layer keeps its running statistics.
        log (logging.Logger): Gets the line of what trains (and of the fusion groups).
        device_num (int): Devices of the run; above 1 the all-reduce fusion is set.
        fusion_config (sequence[int]): The explicit split points of the fused all-reduce
            (``all_reduce_fusion_config``; empty: derived from the trainable tensors).
        net_name (str): For the fusion check's message.
    """
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
