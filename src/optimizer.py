"""SGD with momentum and parameter groups: no weight decay on BatchNorm and biases."""
import mindspore as ms
import mindspore.nn as nn
import numpy as np


def split_weight_decay(params):
    """Split trainable parameters into (decayed, not decayed).

    Following NVIDIA's ResNet-50 v1.5 recipe, only convolution and dense weights are decayed;
    BatchNorm gamma/beta and all biases are not.

    Args:
        params (list[Parameter]): ``net.trainable_params()``.

    Returns:
        tuple(list, list): decayed parameters, other parameters.
    """
    no_decay_suffixes = (".gamma", ".beta", ".bias")
    decay = [p for p in params if not p.name.endswith(no_decay_suffixes)]
    no_decay = [p for p in params if p.name.endswith(no_decay_suffixes)]
    return decay, no_decay


def create_optimizer(net, lr, momentum, weight_decay, loss_scale=1.0):
    """``nn.Momentum`` over two parameter groups, same update as ``torch.optim.SGD``.

    MindSpore's Momentum computes v = momentum * v + (grad + wd * w); w -= lr * v, which is
    torch.optim.SGD with dampening 0 and nesterov False.

    Args:
        net (nn.Cell): The network.
        lr (numpy.ndarray or float): One LR per step (float32 array) or a constant.
        momentum (float): Momentum coefficient.
        weight_decay (float): L2 coefficient of the decayed group.
        loss_scale (float): Gradients arrive multiplied by this (fixed loss scaling);
            the optimizer divides it out.

    Returns:
        nn.Momentum: the optimizer.
    """
    decay, no_decay = split_weight_decay(net.trainable_params())
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0},
              {"order_params": net.trainable_params()}]
    learning_rate = lr if isinstance(lr, float) else ms.Tensor(np.asarray(lr, np.float32))
    return nn.Momentum(groups, learning_rate=learning_rate, momentum=momentum,
                       loss_scale=loss_scale)

