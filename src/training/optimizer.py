"""Optimizers over parameter groups: no weight decay on BatchNorm and biases, optional
layer-wise LR decay (timm's ``layer_decay``) and classifier LR multiple.

``create_optimizer`` builds one of the optimizers in ``OPTIMIZERS``: SGD with momentum
(``nn.Momentum``, the default and the recipes' optimizer), AdamW (``AdamW`` below, equal to
``torch.optim.AdamW``; MindSpore's ``nn.AdamWeightDecay`` is not), LAMB (``Lamb`` below:
MindSpore 2.10's ``nn.Lamb`` has no CPU kernel) or LARS (``Lars`` below, the MLPerf
reference's rule: MindSpore's ``nn.LARS`` is deprecated and has no CPU kernel). ``AdamW``
and ``Lamb`` share one update function and one ``construct`` (``_BiasCorrectedAdam``) and
differ only in the trust ratio.

No training graph holds a float64 operation (Ascend's AI Core has no float64): the bias
corrections ``1 - beta^t`` are computed on the host in float64 (``bias_correction_table``) and
gathered per step inside the graph as float32, as the LR array is.
"""
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import mindspore as ms
import mindspore.nn as nn
import numpy as np
from mindspore.common import dtype as mstype
from mindspore.ops import composite as C
from mindspore.ops import functional as F

#: Name endings of the parameters without weight decay (and without LARS's trust ratio):
#: BatchNorm gamma/beta and every bias.
NO_DECAY_SUFFIXES = (".gamma", ".beta", ".bias")


def is_decayed(name):
    """Whether the parameter ``name`` is a convolution or dense weight (decayed, and adapted by
    LARS), not a BatchNorm gamma/beta or a bias (``NO_DECAY_SUFFIXES``)."""
    return not name.endswith(NO_DECAY_SUFFIXES)


def split_weight_decay(params):
    """Split trainable parameters into (decayed, not decayed).

    Following NVIDIA's ResNet-50 v1.5 recipe, only convolution and dense weights are decayed;
    BatchNorm gamma/beta and all biases are not (``is_decayed``).

    Args:
        params (list[Parameter]): ``net.trainable_params()``.

    Returns:
        tuple(list, list): decayed parameters, other parameters.
    """
    decay = [p for p in params if is_decayed(p.name)]
    no_decay = [p for p in params if not is_decayed(p.name)]
    return decay, no_decay


def layer_ids(names):
    """Layer of each parameter for layer-wise LR decay, grouped as timm groups a ResNet
    (``timm.models.resnet.ResNet.group_matcher(coarse=False)`` used by
    ``timm.optim.param_groups_layer_decay``): the stem (``conv1``, ``bn1``) is layer 0, each
    residual block (``layer1.0``, ``layer1.1``, ..., ``layer4.*``) the next layer in network
    order, everything else (``fc``) the last layer.

    Args:
        names (list[str]): Every parameter name of the network (frozen ones included: the
            depth counts all layers, as timm's ``layer_map`` does).

    Returns:
        tuple(dict, int): parameter name -> layer id, and the number of layers.
    """
    blocks = []
    for name in names:
        match = re.match(r"layer(\d+)\.(\d+)\.", name)
        if match and match.group(0) not in blocks:
            blocks.append(match.group(0))
    head = len(blocks) + 1
    ids = {}
    for name in names:
        match = re.match(r"layer(\d+)\.(\d+)\.", name)
        if match:
            ids[name] = blocks.index(match.group(0)) + 1
        elif name.split(".", 1)[0] in ("conv1", "bn1"):
            ids[name] = 0
        else:
            ids[name] = head
    return ids, head + 1


def layer_lr_scales(names, layer_decay=1.0, head_lr_scale=1.0):
    r"""LR multiple of each parameter: timm's layer-wise LR decay
    :math:`\text{layer\_decay}^{L-1-i}` for layer :math:`i` of :math:`L` (``layer_ids``; the
    classifier, the last layer, gets 1), times ``head_lr_scale`` for the classifier.

    Args:
        names (list[str]): Every parameter name of the network.
        layer_decay (float): In (0, 1]; 1 = no decay.
        head_lr_scale (float): The classifier's LR multiple, > 0.

    Returns:
        dict: parameter name -> float multiple of the scheduled LR.
    """
    ids, count = layer_ids(names)
    head = count - 1
    return {name: layer_decay ** (head - i) * (head_lr_scale if i == head else 1.0)
            for name, i in ids.items()}


def parameter_groups(net, lr, weight_decay, layer_decay=1.0, head_lr_scale=1.0):
    """Optimizer groups of ``net``'s trainable parameters: weight decay on convolution and
    dense weights only (``split_weight_decay``), and with layer-wise LR decay or a head LR
    multiple one group per (LR multiple, decayed or not), each with its own LR array (the
    scheduled LR times the multiple, so warmup and cosine shape every group alike).

    Args:
        net (nn.Cell): The network; frozen parameters (``requires_grad=False``) are left out.
        lr (numpy.ndarray or float): The scheduled LR per optimizer step, or a constant.
        weight_decay (float): Of the decayed groups.
        layer_decay (float): timm's ``layer_decay`` in (0, 1]; 1 = off.
        head_lr_scale (float): The classifier's LR multiple, > 0; 1 = off.

    Returns:
        list[dict]: Groups for ``nn.Optimizer`` (the last one ``order_params``).
    """
    trainable = net.trainable_params()
    if layer_decay == 1.0 and head_lr_scale == 1.0:
        decay, no_decay = split_weight_decay(trainable)
        return [{"params": decay, "weight_decay": weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
                {"order_params": trainable}]
    scales = layer_lr_scales([p.name for p in net.get_parameters()], layer_decay,
                             head_lr_scale)
    groups = {}
    for params, wd in zip(split_weight_decay(trainable), (weight_decay, 0.0)):
        for param in params:
            groups.setdefault((scales[param.name], wd), []).append(param)
    result = []
    for (scale, wd), params in groups.items():
        group_lr = (lr * scale if isinstance(lr, float)
                    else ms.Tensor((np.asarray(lr, np.float64) * scale).astype(np.float32)))
        result.append({"params": params, "weight_decay": wd, "lr": group_lr})
    return result + [{"order_params": trainable}]


def lr_group_tags(names: list[str], layer_decay: float = 1.0,
                  head_lr_scale: float = 1.0) -> dict[str, float]:
    """``{TensorBoard tag: LR multiple}`` of the layers whose LR is a multiple of the scheduled
    one (``train/lr/layerNN``, NN the layer's index: 0 = the stem, the last = ``fc``); empty
    without ``layer_decay`` or ``head_lr_scale``. ``names``: every parameter name."""
    if layer_decay == 1.0 and head_lr_scale == 1.0:
        return {}
    ids, _ = layer_ids(names)
    return {f"train/lr/layer{ids[name]:02d}": scale
            for name, scale in layer_lr_scales(names, layer_decay, head_lr_scale).items()}


#: Most entries (steps) of a bias-correction table when the LR gives no number of steps.
MAX_BIAS_CORRECTION_STEPS = 1 << 20


def bias_correction_table(beta, max_steps=MAX_BIAS_CORRECTION_STEPS):
    r"""Adam's bias corrections :math:`1 - \beta^t` of steps :math:`t = 1, 2, \dots`, computed
    on the host in float64 (Python floats, as ``torch.optim.AdamW`` computes them) and rounded
    to float32.

    The table ends at the first step whose float32 value is 1.0: :math:`1 - \beta^t` grows
    with :math:`t`, so every later step's value is 1.0 as well (with ``beta`` 0.9: 165 steps,
    0.999: 17,321 steps, 0.9999: 173,250 steps), or after ``max_steps`` entries.

    Args:
        beta (float): The moment's decay, in (0, 1); used exactly as given (pass its float32
            value to match a graph that decays the moments with float32 ``beta``).
        max_steps (int): Most entries, i.e. steps, >= 1.

    Returns:
        numpy.ndarray: float32, shape (L,) with 1 <= L <= ``max_steps``; entry ``i`` is step
        ``t = i + 1``, i.e. the optimizer's 0-based ``global_step`` before its increment.
    """
    beta = float(beta)
    # float32(1 - beta^t) is 1.0 once beta^t <= 2^-25 (half a float32 ulp below 1.0); the
    # margin covers the rounding of the logarithms.
    last = min(int(max_steps), math.ceil(25 * math.log(2) / -math.log(beta)) + 16)
    values = np.array([1.0 - beta ** t for t in range(1, last + 1)]).astype(np.float32)
    ones = np.flatnonzero(values == 1.0)
    return values[:ones[0] + 1] if ones.size else values


def _schedule_length(learning_rate):
    """Number of steps of a per-step LR (a 1-D Tensor, array or list), else None."""
    if isinstance(learning_rate, (ms.Tensor, np.ndarray, list, tuple)):
        shape = (tuple(learning_rate.shape) if isinstance(learning_rate, ms.Tensor)
                 else np.shape(learning_rate))
        if len(shape) == 1 and shape[0] > 0:
            return int(shape[0])
    return None


def _l2_norm(x):
    """The L2 norm of float32 ``x`` (a scalar Tensor)."""
    return F.sqrt(F.reduce_sum(F.square(x)))


def _ratio_if_norms_positive(numerator, denominator, w_norm, other_norm):
    """``numerator / denominator`` where ``w_norm`` and ``other_norm`` are both > 0, else 1
    (the trust ratios' zero-norm rule; no division by 0 is computed)."""
    both_positive = F.logical_and(w_norm > 0.0, other_norm > 0.0)
    ones = F.ones_like(w_norm)
    return F.select(both_positive, numerator / F.select(both_positive, denominator, ones), ones)


_adam_update = C.MultitypeFuncGraph("resnet_adam_update")


@_adam_update.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Bool", "Tensor",
                       "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Bool", "Bool")
def _adam_update_tensor(beta1, beta2, eps, bias_correction1, bias_correction2, trust_ratio, lr,
                        weight_decay, param, m, v, gradient, decay_flag, optim_filter):
    """One step of one parameter for ``AdamW`` (``trust_ratio`` False) or ``Lamb`` (True), see
    ``_BiasCorrectedAdam``; updates ``param``, ``m`` and ``v`` in place. ``bias_correction1``
    and ``bias_correction2`` are ``1 - beta1^t`` and ``1 - beta2^t``. ``trust_ratio`` is a
    Python bool (a class constant), so GRAPH mode compiles only the branch taken.

    Returns:
        Tensor: the new parameter value (``gradient`` if ``optim_filter`` is False).
    """
    if not optim_filter:
        return gradient
    w = F.cast(param, mstype.float32)
    g = F.cast(gradient, mstype.float32)
    next_m = beta1 * F.cast(m, mstype.float32) + (1.0 - beta1) * g
    next_v = beta2 * F.cast(v, mstype.float32) + (1.0 - beta2) * F.square(g)
    m_hat = next_m / bias_correction1
    v_hat = next_v / bias_correction2
    update = m_hat / (F.sqrt(v_hat) + eps)
    if decay_flag:
        update = update + weight_decay * w
    if trust_ratio:
        w_norm, u_norm = _l2_norm(w), _l2_norm(update)
        update = _ratio_if_norms_positive(w_norm, u_norm, w_norm, u_norm) * update
    next_w = w - lr * update
    next_w = F.depend(next_w, F.assign(param, F.cast(next_w, F.dtype(param))))
    next_w = F.depend(next_w, F.assign(m, F.cast(next_m, F.dtype(m))))
    next_w = F.depend(next_w, F.assign(v, F.cast(next_v, F.dtype(v))))
    return F.cast(next_w, F.dtype(param))


class _BiasCorrectedAdam(nn.Optimizer):
    r"""Adam moments with bias correction and decoupled weight decay, optionally with LAMB's
    layer-wise trust ratio; the shared code of ``AdamW`` and ``Lamb``, built from standard
    operators, so it runs on CPU, GPU and Ascend alike. Per parameter tensor :math:`w`, step
    :math:`t = 1, 2, \dots`:

    .. math::
        m_t = \beta_1 m_{t-1} + (1-\beta_1) g_t,\quad v_t = \beta_2 v_{t-1} + (1-\beta_2) g_t^2 \\
        \hat m_t = m_t / (1-\beta_1^t),\quad \hat v_t = v_t / (1-\beta_2^t) \\
        r_t = \hat m_t / (\sqrt{\hat v_t} + \epsilon) + \lambda w_{t-1} \\
        w_t = w_{t-1} - \eta_t \rho_t r_t

    with :math:`\rho_t = 1` (``AdamW``) or the trust ratio (``Lamb``). :math:`\lambda` is the
    group's weight decay (0 for the no-decay group). Moments are kept in the parameter's dtype
    and computed in float32; :math:`t` is the optimizer's ``global_step`` + 1, saved in
    training checkpoints with the moments.

    The bias corrections :math:`1-\beta_1^t` and :math:`1-\beta_2^t` come from two float32
    tables computed on the host in float64 (``bias_correction_table``, with the float32
    betas the moments decay with), gathered at ``global_step`` like the LR array: no float64
    operation in the graph (Ascend's AI Core has none), and the same float32 values as
    ``torch.optim.AdamW``'s Python-float corrections rounded once. The tables are constants
    (Tensors, not Parameters): nothing new in checkpoints, and a resumed run gathers the same
    values from the restored ``global_step``. A table ends where its float32 value reaches 1.0
    or at the last step of a per-step LR array; beyond its end its last entry is used.

    Subclasses set ``TRUST_RATIO`` (bool) and ``MOMENT_PREFIXES`` (names of the first and
    second moments' parameter copies, listed as optimizer state in ``src.utils.checkpoint``).

    Args:
        params (Union[list[Parameter], list[dict]]): Parameters or groups, as for ``nn.Optimizer``.
        learning_rate (Union[float, Tensor, Iterable, LearningRateSchedule]): As for
            ``nn.Optimizer``; a 1-D Tensor gives the LR of each step.
        beta1 (float): Decay of the first moment, in (0, 1).
        beta2 (float): Decay of the second moment, in (0, 1).
        eps (float): Added to :math:`\sqrt{\hat v_t}`, > 0.
        weight_decay (float): :math:`\lambda` of parameters not in a group that sets its own.

    Raises:
        ValueError: A beta outside (0, 1) as a float32 (1 - 1e-9 is 1.0 there) or eps <= 0;
            or, when ``learning_rate`` gives no number of steps (a float or a
            ``LearningRateSchedule``), a beta so close to 1 that its float32 bias correction
            stays below 1.0 for more than ``MAX_BIAS_CORRECTION_STEPS`` steps (give the LR per
            step instead).
    """

    TRUST_RATIO = None
    MOMENT_PREFIXES = None

    def __init__(self, params, learning_rate, beta1, beta2, eps, weight_decay):
        super().__init__(learning_rate, params, weight_decay)
        cls = type(self).__name__
        for name, value in (("beta1", beta1), ("beta2", beta2)):
            if not 0.0 < float(np.float32(value)) < 1.0:  # the graph computes with float32
                raise ValueError(f"{cls}: {name} must be in (0, 1) as a float32, got {value} "
                                 f"({float(np.float32(value))!r} in float32)")
        if not float(eps) > 0.0:
            raise ValueError(f"{cls}: eps must be > 0, got {eps}")
        self.beta1 = ms.Tensor(np.array([beta1], np.float32))
        self.beta2 = ms.Tensor(np.array([beta2], np.float32))
        self.eps = ms.Tensor(np.array([eps], np.float32))
        steps = _schedule_length(learning_rate)
        tables = []
        for name, value in (("beta1", beta1), ("beta2", beta2)):
            table = bias_correction_table(np.float32(value),
                                          steps or MAX_BIAS_CORRECTION_STEPS)
            if steps is None and table[-1] != 1.0:
                raise ValueError(
                    f"{cls}: {name}={value} is so close to 1 that its bias correction "
                    f"1 - {name}^t stays below 1.0 (float32) for more than "
                    f"{MAX_BIAS_CORRECTION_STEPS} steps; give the learning rate per step "
                    f"(a 1-D array) so that its table can end at the last step")
            tables.append(table)
        # Constants of the graph, not Parameters: not checkpointed; the step picks the entry.
        self.bias_correction1 = ms.Tensor(tables[0])
        self.bias_correction2 = ms.Tensor(tables[1])
        self.last_entry1 = ms.Tensor(np.array([len(tables[0]) - 1], np.int32))
        self.last_entry2 = ms.Tensor(np.array([len(tables[1]) - 1], np.int32))
        first, second = self.MOMENT_PREFIXES
        self.moments1 = self._parameters.clone(prefix=first, init="zeros")
        self.moments2 = self._parameters.clone(prefix=second, init="zeros")

    @ms.jit(backend="ms_backend")
    def construct(self, gradients):
        weight_decay = self.get_weight_decay()
        # The LR and the bias corrections 1 - beta^t (t = global_step + 1) of step global_step
        # (0-based), read before the increment. 1 - beta^t comes from float64 host tables, not
        # from Pow in the graph: in float32, 1 - 0.999^t at small t keeps only ~5 significant
        # digits (relative error ~7e-6, ~4e-7 in a step of lr 0.1; MindSpore's CPU expm1 is no
        # better), and a float64 Pow would not run on Ascend's AI Core.
        lr = self.get_lr()
        bc1 = F.gather(self.bias_correction1, F.minimum(self.global_step, self.last_entry1), 0)
        bc2 = F.gather(self.bias_correction2, F.minimum(self.global_step, self.last_entry2), 0)
        self.assignadd(self.global_step, self.global_step_increase_tensor)  # after the reads
        gradients = self.flatten_gradients(gradients)
        beta1, beta2, eps, trust_ratio = self.beta1, self.beta2, self.eps, self.TRUST_RATIO
        if self.is_group:
            if self.is_group_lr:
                return self.hyper_map(
                    F.partial(_adam_update, beta1, beta2, eps, bc1, bc2, trust_ratio),
                    lr, weight_decay, self._parameters, self.moments1, self.moments2, gradients,
                    self.decay_flags, self.optim_filter)
            return self.hyper_map(
                F.partial(_adam_update, beta1, beta2, eps, bc1, bc2, trust_ratio, lr),
                weight_decay, self._parameters, self.moments1, self.moments2, gradients,
                self.decay_flags, self.optim_filter)
        return self.hyper_map(
            F.partial(_adam_update, beta1, beta2, eps, bc1, bc2, trust_ratio, lr, weight_decay),
            self._parameters, self.moments1, self.moments2, gradients, self.decay_flags,
            self.optim_filter)


class AdamW(_BiasCorrectedAdam):
    r"""AdamW (Loshchilov & Hutter 2019, arXiv:1711.05101) equal to ``torch.optim.AdamW``
    (``amsgrad=False``, ``maximize=False``) up to float rounding: ``_BiasCorrectedAdam`` without
    the trust ratio,

    .. math::
        w_t = w_{t-1} - \eta_t \left(\hat m_t / (\sqrt{\hat v_t} + \epsilon)
              + \lambda w_{t-1}\right)

    which is torch's :math:`w_{t-1}(1 - \eta_t\lambda) - \eta_t \hat m_t /
    (\sqrt{\hat v_t} + \epsilon)`: decoupled weight decay (multiplied by the full LR, as
    torch), bias correction, eps added to :math:`\sqrt{\hat v_t}`. Why not MindSpore's
    ``nn.AdamWeightDecay``: see ``create_optimizer``. Moments: ``adam_m.*``, ``adam_v.*``.

    Args: as ``_BiasCorrectedAdam``; defaults eps 1e-8 (torch's) and weight_decay 0.0 (torch's
    is 1e-2; ``create_optimizer`` sets it per group from the config).
    """

    TRUST_RATIO = False
    MOMENT_PREFIXES = ("adam_m", "adam_v")

    def __init__(self, params, learning_rate, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
        super().__init__(params, learning_rate, beta1, beta2, eps, weight_decay)


class Lamb(_BiasCorrectedAdam):
    r"""LAMB (You et al. 2020, Algorithm 2): ``_BiasCorrectedAdam`` with the trust ratio

    .. math::
        \rho_t = \|w_{t-1}\|_2 / \|r_t\|_2 \text{ if both norms are } > 0 \text{, else } 1

    applied to every tensor (one "layer"), the no-decay group included.

    MindSpore 2.10's ``nn.Lamb`` calls the ``Lamb`` primitive, which has no CPU kernel
    ("Unsupported op [Lamb] on CPU"), and whose GPU kernel departs from the paper (see
    ``create_optimizer``). Moments: ``lamb_m.*``, ``lamb_v.*``.

    Args: as ``_BiasCorrectedAdam``; defaults eps 1e-6 and weight_decay 0.0.
    """

    TRUST_RATIO = True
    MOMENT_PREFIXES = ("lamb_m", "lamb_v")

    def __init__(self, params, learning_rate, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0):
        super().__init__(params, learning_rate, beta1, beta2, eps, weight_decay)


_lars_update = C.MultitypeFuncGraph("resnet_lars_update")


@_lars_update.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor",
                       "Tensor", "Bool", "Bool")
def _lars_update_tensor(momentum, trust_coeff, eps, lr, weight_decay, param, moment, gradient,
                        adapt, optim_filter):
    """One step of one parameter for ``Lars``, returning its new value (or ``gradient``
    where ``optim_filter`` is False); updates ``param`` and ``moment`` in place. ``adapt``
    (a Python bool per parameter) selects the trust ratio and weight decay."""
    if not optim_filter:
        return gradient
    w = F.cast(param, mstype.float32)
    g = F.cast(gradient, mstype.float32)
    scaled_lr = lr
    if adapt:
        w_norm, g_norm = _l2_norm(w), _l2_norm(g)
        scaled_lr = lr * _ratio_if_norms_positive(
            trust_coeff * w_norm, g_norm + weight_decay * w_norm + eps, w_norm, g_norm)
        g = g + weight_decay * w
    next_m = momentum * F.cast(moment, mstype.float32) + scaled_lr * g
    next_w = w - next_m
    next_w = F.depend(next_w, F.assign(param, F.cast(next_w, F.dtype(param))))
    next_w = F.depend(next_w, F.assign(moment, F.cast(next_m, F.dtype(moment))))
    return F.cast(next_w, F.dtype(param))


class Lars(nn.Optimizer):
    r"""LARS (You, Gitman, Ginsburg 2017, arXiv:1708.03888) as the MLPerf Training reference
    ResNet-50 writes it: mlcommons/training ``retired_benchmarks/resnet-tf2/tensorflow2/
    lars_optimizer.py`` (``LARSOptimizer``, commit 3c81f6f), with its ``skip_list``
    ``['batch_normalization', 'bias', 'bn']`` as ``is_decayed``. Per parameter tensor
    :math:`w` with gradient :math:`g`, LR :math:`\eta_t` (the scheduled LR, times the
    group's multiple), weight decay :math:`\lambda`, momentum :math:`\mu`, trust coefficient
    :math:`\tau` and :math:`\epsilon`:

    .. math::
        \rho_t = \tau \|w\|_2 / (\|g\|_2 + \lambda \|w\|_2 + \epsilon)
            \text{ if } \|w\|_2 > 0 \text{ and } \|g\|_2 > 0 \text{, else } 1 \\
        m_t = \mu m_{t-1} + \eta_t \rho_t (g + \lambda w_{t-1}) \\
        w_t = w_{t-1} - m_t

    for convolution and dense weights; BatchNorm gamma/beta and biases take
    :math:`\rho_t = 1` and no weight decay (plain momentum SGD: :math:`m_t = \mu m_{t-1} +
    \eta_t g`). The norms are of the pre-step weights and the unscaled, all-reduced gradient.
    The LR sits inside the momentum buffer (TensorFlow's form), so a changing LR acts on new
    gradients only; NVIDIA's MXNet submissions (``SGDwFASTLARS``) rescale the momentum by
    :math:`\eta_t / \eta_{t-1}`, which is timm's ``Lars`` form :math:`v_t = \mu v_{t-1} +
    \rho_t (g + \lambda w)`, :math:`w_t = w_{t-1} - \eta_t v_t` (docs/training.md,
    "Optimizers"). Built from standard operators (CPU, GPU, Ascend); the buffers
    :math:`m` are ``lars_m.*``, in the parameter's dtype, computed in float32.

    Args:
        params (Union[list[Parameter], list[dict]]): Parameters or groups, as for
            ``nn.Optimizer``; a group's ``weight_decay`` is its :math:`\lambda`.
        learning_rate (Union[float, Tensor, Iterable, LearningRateSchedule]): As for
            ``nn.Optimizer``; a 1-D Tensor gives the LR of each step.
        momentum (float): :math:`\mu`, >= 0.
        trust_coeff (float): :math:`\tau` (timm's ``trust_coeff``, the reference's ``eeta``,
            NVIDIA's ``lars_eta``), > 0.
        eps (float): :math:`\epsilon`, > 0 (the reference's ``epsilon``: its flag 0 gives
            Keras's 1e-7).
        weight_decay (float): :math:`\lambda` of parameters not in a group that sets its own.

    Raises:
        ValueError: momentum < 0, trust_coeff <= 0 or eps <= 0.
    """

    MOMENT_PREFIX = "lars_m"

    def __init__(self, params, learning_rate, momentum=0.9, trust_coeff=0.001, eps=1e-8,
                 weight_decay=0.0):
        super().__init__(learning_rate, params, weight_decay)
        for name, value, low in (("momentum", momentum, None), ("trust_coeff", trust_coeff, 0),
                                 ("eps", eps, 0)):
            if not (float(value) >= 0.0 if low is None else float(value) > 0.0):
                raise ValueError(f"Lars: {name} must be {'>= 0' if low is None else '> 0'}, "
                                 f"got {value}")
        self.momentum = ms.Tensor(np.array([momentum], np.float32))
        self.trust_coeff = ms.Tensor(np.array([trust_coeff], np.float32))
        self.eps = ms.Tensor(np.array([eps], np.float32))
        self.adapt_flags = tuple(is_decayed(p.name) for p in self._parameters)
        self.moments = self._parameters.clone(prefix=self.MOMENT_PREFIX, init="zeros")

    @ms.jit(backend="ms_backend")
    def construct(self, gradients):
        weight_decay = self.get_weight_decay()
        lr = self.get_lr()  # of step global_step, read before the increment
        self.assignadd(self.global_step, self.global_step_increase_tensor)
        gradients = self.flatten_gradients(gradients)
        momentum, trust_coeff, eps = self.momentum, self.trust_coeff, self.eps
        if not self.is_group:
            return self.hyper_map(
                F.partial(_lars_update, momentum, trust_coeff, eps, lr, weight_decay),
                self._parameters, self.moments, gradients, self.adapt_flags, self.optim_filter)
        if not self.is_group_lr:
            return self.hyper_map(F.partial(_lars_update, momentum, trust_coeff, eps, lr),
                                  weight_decay, self._parameters, self.moments, gradients,
                                  self.adapt_flags, self.optim_filter)
        return self.hyper_map(F.partial(_lars_update, momentum, trust_coeff, eps), lr,
                              weight_decay, self._parameters, self.moments, gradients,
                              self.adapt_flags, self.optim_filter)


def _momentum(groups, learning_rate, *, momentum, loss_scale):
    """``nn.Momentum``: exactly the recipes' optimizer."""
    return nn.Momentum(groups, learning_rate=learning_rate, momentum=momentum,
                       loss_scale=loss_scale)


def _adamw(groups, learning_rate, *, beta1, beta2, eps):
    """``AdamW`` of this module."""
    return AdamW(groups, learning_rate=learning_rate, beta1=float(beta1), beta2=float(beta2),
                 eps=float(eps))


def _lamb(groups, learning_rate, *, beta1, beta2, eps):
    """``Lamb`` of this module."""
    return Lamb(groups, learning_rate=learning_rate, beta1=float(beta1), beta2=float(beta2),
                eps=float(eps))


def _lars(groups, learning_rate, *, momentum, eps, trust_coeff):
    """``Lars`` of this module."""
    return Lars(groups, learning_rate=learning_rate, momentum=float(momentum),
                trust_coeff=float(trust_coeff), eps=float(eps))


@dataclass(frozen=True)
class OptimInfo:
    """An optimizer of ``OPTIMIZERS`` (timm's ``OptimInfo``).

    Attributes:
        build: ``build(groups, learning_rate, **hyperparameters)`` -> the optimizer.
        hyperparameters: The keywords ``build`` takes, with their defaults (the config keys
            of the same names set them; the other optimizers' keys are not passed).
        takes_loss_scale: Whether ``build`` also takes ``loss_scale`` and divides the
            gradients by it (a fixed loss scale).
    """

    build: Callable[..., nn.Optimizer]
    hyperparameters: dict[str, float] = field(default_factory=dict)
    takes_loss_scale: bool = False


#: name -> ``OptimInfo``: a new optimizer is one builder and one entry here.
OPTIMIZERS = {
    "momentum": OptimInfo(_momentum, {"momentum": 0.9}, takes_loss_scale=True),
    "adamw": OptimInfo(_adamw, {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8}),
    "lamb": OptimInfo(_lamb, {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8}),
    "lars": OptimInfo(_lars, {"momentum": 0.9, "eps": 1e-8, "trust_coeff": 0.001}),
}

#: Every optimizer's hyperparameters: the keywords ``create_optimizer`` takes besides its own.
HYPERPARAMETERS = tuple(dict.fromkeys(k for info in OPTIMIZERS.values()
                                      for k in info.hyperparameters))

#: The optimizers that take a fixed loss scale and divide it out of the gradients themselves.
TAKES_LOSS_SCALE = tuple(name for name, info in OPTIMIZERS.items() if info.takes_loss_scale)


def create_optimizer(net: nn.Cell, lr: np.ndarray | float, momentum: float | None = None,
                     weight_decay: float = 0.0, loss_scale: float = 1.0, *,
                     optimizer: str = "momentum", layer_decay: float = 1.0,
                     head_lr_scale: float = 1.0, **hyperparameters: float) -> nn.Optimizer:
    """One of ``OPTIMIZERS`` over the parameter groups of ``parameter_groups``: weight decay
    on convolution and dense weights only, frozen parameters left out, split by LR multiple
    with ``layer_decay`` < 1 or ``head_lr_scale`` != 1. The update rules and their sources:
    docs/training.md#optimizers. ``TrainStep`` unscales the gradients before any optimizer,
    so training passes ``loss_scale`` 1.

    Args:
        net: The network.
        lr: One LR per optimizer step (made a float32 Tensor) or a constant.
        momentum: The momentum coefficient ("momentum", "lars"); None = the entry's default.
        weight_decay: Of the decayed group (L2 added to the gradient for "momentum",
            decoupled for "adamw", inside the trust ratio for "lamb" and "lars").
        loss_scale: Gradients arrive multiplied by this; only ``TAKES_LOSS_SCALE`` divide it
            out, the others need 1.0.
        optimizer: A key of ``OPTIMIZERS``.
        layer_decay: timm's layer-wise LR decay in (0, 1] (``layer_lr_scales``).
        head_lr_scale: The classifier's LR multiple.
        **hyperparameters: Of ``HYPERPARAMETERS`` (``beta1``, ``beta2``, ``eps``,
            ``trust_coeff``, ...); the chosen optimizer takes those of its entry, the
            others are ignored.

    Returns:
        The optimizer.

    Raises:
        TypeError: A keyword no optimizer takes.
        KeyError: ``optimizer`` is not a key of ``OPTIMIZERS`` (the message lists them).
        ValueError: ``loss_scale != 1.0`` with an optimizer that cannot divide it out.
    """
    for name in hyperparameters:
        if name not in HYPERPARAMETERS:
            raise TypeError(f"create_optimizer() got an unexpected keyword argument {name!r}")
    if optimizer not in OPTIMIZERS:
        raise KeyError(f"unknown optimizer {optimizer!r}; valid names: "
                       f"{', '.join(sorted(OPTIMIZERS))}")
    info = OPTIMIZERS[optimizer]
    if loss_scale != 1.0 and not info.takes_loss_scale:
        raise ValueError(f"optimizer {optimizer!r} cannot divide out a fixed loss scale "
                         f"(loss_scale={loss_scale}); only {', '.join(TAKES_LOSS_SCALE)} can. "
                         "Pass loss_scale 1.0 and unscale the gradients before the optimizer, as "
                         "TrainStep does")
    if momentum is not None:
        hyperparameters["momentum"] = momentum
    chosen = {name: hyperparameters.get(name, default)
              for name, default in info.hyperparameters.items()}
    if info.takes_loss_scale:
        chosen["loss_scale"] = loss_scale
    groups = parameter_groups(net, lr, weight_decay, layer_decay, head_lr_scale)
    learning_rate = lr if isinstance(lr, float) else ms.Tensor(np.asarray(lr, np.float32))
    return info.build(groups, learning_rate, **chosen)
