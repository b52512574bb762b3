"""Helpers of the PyTorch alignment tests: reference nets with non-trivial statistics, and
copying their weights into ours through the converter."""
import mindspore as ms
import numpy as np
import torch
from mindspore.nn.utils import no_init_parameters

from src.models.resnet import create_network
from src.utils.checkpoint import DROP_PATH_STEP
from tests.torch_resnet import torch_resnet
from tools.convert_torch_checkpoint import torch_state_to_ms_arrays


def reference_pair(net_name, class_num, seed=0, calibrate_on=None):
    """A torch reference network with random weights and non-trivial BatchNorm state
    (gamma, beta, running mean and variance away from 1/0; with ``calibrate_on`` images, the
    running statistics of those images), and ours holding the same weights via the converter
    (built without drawing its weights: the strict load replaces every one, and raises if one
    is left). Returns (torch_net, ms_net)."""
    torch.manual_seed(seed)
    tnet = torch_resnet(net_name, class_num)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in tnet.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                n = module.num_features
                module.weight.copy_(torch.rand(n, generator=gen) * 0.6 + 0.7)
                module.bias.copy_(torch.rand(n, generator=gen) * 0.2 - 0.1)
                module.running_mean.copy_(torch.rand(n, generator=gen) * 0.2 - 0.1)
                module.running_var.copy_(torch.rand(n, generator=gen) * 0.6 + 0.7)
    if calibrate_on is not None:
        calibrate_bn(tnet, calibrate_on)
    with no_init_parameters():
        net = create_network(net_name, class_num=class_num)
    load_torch_weights(net, tnet)
    return tnet, net


def calibrate_bn(tnet, images):
    """Set every BatchNorm's running statistics to those of ``images`` (float32 NCHW numpy),
    with torch's cumulative average, so that eval-mode BN sees realistic statistics."""
    bns = [m for m in tnet.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    tnet.train()
    with torch.no_grad():
        tnet(torch.from_numpy(images))
    for bn in bns:
        bn.momentum = 0.1


def load_torch_weights(net, tnet):
    """Copy a torch network's state_dict into ours through the converter's name mapping (the
    stochastic depth counter, which torch's network has not, stays as it is)."""
    arrays = torch_state_to_ms_arrays(tnet.state_dict())
    params = {name: ms.Parameter(ms.Tensor(a), name=name) for name, a in arrays.items()}
    not_loaded, _ = ms.load_param_into_net(net, params, strict_load=True)
    assert [n for n in not_loaded if n != DROP_PATH_STEP] == []


def max_rel_diff(ours, ref):
    """max |ours - ref| / max |ref| (0 when both are 0)."""
    scale = float(np.abs(ref).max())
    return float(np.abs(ours - ref).max()) / (scale if scale else 1.0)
