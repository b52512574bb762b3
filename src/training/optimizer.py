"""Optimizers over parameter groups (no weight decay on BatchNorm and biases, timm's
``layer_decay``, a classifier LR multiple) and the registry ``OPTIMIZERS``: ``nn.Momentum``
and this module's ``AdamW``, ``Lamb`` and ``Lars``, built from standard operators (CPU, GPU,
Ascend). Update rules, sources and why MindSpore's own are not used: docs/training.md#optimizers."""
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

#: A learning rate as ``nn.Optimizer`` takes it: a constant or one value per step.
LearningRate = float | list[float] | np.ndarray | ms.Tensor


def is_decayed(name: str) -> bool:
    """Whether parameter ``name`` is a convolution or dense weight (decayed, adapted by
    LARS), not a BatchNorm gamma/beta or bias (``NO_DECAY_SUFFIXES``)."""
    return not name.endswith(NO_DECAY_SUFFIXES)


def split_weight_decay(
        params: list[ms.Parameter]) -> tuple[list[ms.Parameter], list[ms.Parameter]]:
    """Split trainable parameters into (decayed, not decayed) by ``is_decayed``
    (NVIDIA's ResNet-50 v1.5 grouping)."""
    decay = [p for p in params if is_decayed(p.name)]
    no_decay = [p for p in params if not is_decayed(p.name)]
    return decay, no_decay


def layer_ids(names: list[str]) -> tuple[dict[str, int], int]:
    """Layer id of each parameter for layer-wise LR decay, as timm's
    ``ResNet.group_matcher(coarse=False)``: stem 0, each residual block the next, ``fc`` last.
    ``names``: every parameter name, frozen ones included. Returns (name -> id, layer count)."""
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


def layer_lr_scales(names: list[str], layer_decay: float = 1.0,
                    head_lr_scale: float = 1.0) -> dict[str, float]:
    r"""LR multiple of each parameter: timm's :math:`\text{layer\_decay}^{L-1-i}` for
    layer :math:`i` of :math:`L` (``layer_ids``), times ``head_lr_scale`` for the classifier.

    Returns:
        dict: parameter name -> float multiple of the scheduled LR.
    """
    ids, count = layer_ids(names)
    head = count - 1
    return {name: layer_decay ** (head - i) * (head_lr_scale if i == head else 1.0)
            for name, i in ids.items()}


def parameter_groups(net: nn.Cell, lr: np.ndarray | float, weight_decay: float,
                     layer_decay: float = 1.0, head_lr_scale: float = 1.0) -> list[dict]:
    """Groups for ``nn.Optimizer`` of ``net``'s trainable parameters: decayed
    (``weight_decay``) or not (``split_weight_decay``); with ``layer_decay`` < 1 or
    ``head_lr_scale`` != 1 one group per (LR multiple, decayed or not) whose LR is ``lr`` (per
    step, or a constant) times the multiple (``layer_lr_scales``). The last is ``order_params``."""
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


def bias_correction_table(beta: float, max_steps: int = MAX_BIAS_CORRECTION_STEPS) -> np.ndarray:
    r"""Adam's bias corrections :math:`1 - \beta^t`, :math:`t = 1, 2, \dots`,
    computed in float64 on the host and rounded to float32; the table ends at the first 1.0 or
    after ``max_steps`` entries. See docs/training.md#bias-correction-tables.

    Returns:
        numpy.ndarray: float32 (L,), 1 <= L <= ``max_steps``; entry ``i`` is step ``i + 1``.
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
    """One step of one parameter for ``AdamW`` (``trust_ratio`` False) or
    ``Lamb`` (True); updates ``param``, ``m``, ``v`` in place and returns the new value
    (``gradient`` where ``optim_filter`` is False). Positional: HyperMap passes them so."""
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
    r"""Adam with bias correction and decoupled weight decay, with LAMB's trust
    ratio when ``TRUST_RATIO``: the shared code of ``AdamW`` and ``Lamb``. Moments in the
    parameter's dtype, computed in float32; ``MOMENT_PREFIXES`` names them in checkpoints.
    Bias corrections: docs/training.md#bias-correction-tables.

    Args:
        params, learning_rate: As for ``nn.Optimizer`` (a 1-D LR Tensor: one LR per step).
        beta1, beta2 (float): Moment decays, in (0, 1). eps (float): > 0, added to
            :math:`\sqrt{\hat v_t}`. weight_decay (float): Of groups that set none.

    Raises:
        ValueError: A beta outside (0, 1) in float32, eps <= 0, or (constant LR) a beta whose
            table passes ``MAX_BIAS_CORRECTION_STEPS``.
    """

    TRUST_RATIO = None
    MOMENT_PREFIXES = None

    def __init__(self, params, learning_rate, *, beta1, beta2, eps, weight_decay):
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
        # The LR and 1 - beta^t (t = global_step + 1), read before the increment; why tables:
        # docs/training.md#bias-correction-tables
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
    """AdamW (Loshchilov & Hutter 2019, arXiv:1711.05101), equal to ``torch.optim.AdamW``
    (``amsgrad=False``) up to float rounding. Moments ``adam_m.*``, ``adam_v.*``. Args: as
    ``_BiasCorrectedAdam``."""

    TRUST_RATIO = False
    MOMENT_PREFIXES = ("adam_m", "adam_v")

    def __init__(self, params: list[ms.Parameter] | list[dict], learning_rate: LearningRate, *,
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, learning_rate, beta1=beta1, beta2=beta2, eps=eps,
                         weight_decay=weight_decay)


class Lamb(_BiasCorrectedAdam):
    """LAMB (You et al. 2020, arXiv:1904.00962, Algorithm 2): ``_BiasCorrectedAdam`` with the
    trust ratio ||w|| / ||r|| (1 when a norm is 0) on every tensor. Moments ``lamb_m.*``,
    ``lamb_v.*``. Args: as ``_BiasCorrectedAdam``."""

    TRUST_RATIO = True
    MOMENT_PREFIXES = ("lamb_m", "lamb_v")

    def __init__(self, params: list[ms.Parameter] | list[dict], learning_rate: LearningRate, *,
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-6,
                 weight_decay: float = 0.0):
        super().__init__(params, learning_rate, beta1=beta1, beta2=beta2, eps=eps,
                         weight_decay=weight_decay)


_lars_update = C.MultitypeFuncGraph("resnet_lars_update")


@_lars_update.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor",
                       "Tensor", "Bool", "Bool")
def _lars_update_tensor(momentum, trust_coeff, eps, lr, weight_decay, param, moment, gradient,
                        adapt, optim_filter):
    """One step of one parameter for ``Lars``; updates ``param`` and
    ``moment`` in place and returns the new value (``gradient`` where ``optim_filter`` is False).
    ``adapt`` selects the trust ratio and weight decay. Positional: HyperMap passes them so."""
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
    """LARS (You, Gitman, Ginsburg 2017, arXiv:1708.03888) as the MLPerf reference ResNet-50
    writes it (mlcommons/training ``lars_optimizer.py``): trust ratio and weight decay on
    ``is_decayed`` tensors only, the LR inside the momentum buffer; buffers ``lars_m.*``. See
    docs/training.md#optimizers.

    Args:
        params, learning_rate: As for ``nn.Optimizer``. momentum (float): >= 0.
        trust_coeff (float): > 0 (timm's name). eps (float): > 0.
        weight_decay (float): Of groups that set none.

    Raises:
        ValueError: momentum < 0, trust_coeff <= 0 or eps <= 0.
    """

    MOMENT_PREFIX = "lars_m"

    def __init__(self, params: list[ms.Parameter] | list[dict], learning_rate: LearningRate, *,
                 momentum: float = 0.9, trust_coeff: float = 0.001, eps: float = 1e-8,
                 weight_decay: float = 0.0):
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
    """An entry of ``OPTIMIZERS`` (timm's ``OptimInfo``): ``build(groups, learning_rate,
    **hyperparameters)``, the ``hyperparameters`` it takes with their defaults (config keys of the
    same names, null in config.yaml: a run takes these unless it sets one), and whether it takes
    and divides out a fixed ``loss_scale``."""

    build: Callable[..., nn.Optimizer]
    hyperparameters: dict[str, float] = field(default_factory=dict)
    takes_loss_scale: bool = False


#: name -> ``OptimInfo``: a new optimizer is one builder and one entry here. Sources of the
#: defaults: momentum 0.875 is NVIDIA's ResNet-50 v1.5 recipe (config.yaml's; torch.optim.SGD's
#: own default is 0, no momentum); adamw's are torch.optim.AdamW's, lamb's the same (timm's
#: Lamb has eps 1e-6); lars's momentum and trust_coeff are the MLPerf reference's
#: (--momentum=0.9, eeta 0.001), its eps timm's Lars's.
OPTIMIZERS = {
    "momentum": OptimInfo(_momentum, {"momentum": 0.875}, takes_loss_scale=True),
    "adamw": OptimInfo(_adamw, {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8}),
    "lamb": OptimInfo(_lamb, {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8}),
    "lars": OptimInfo(_lars, {"momentum": 0.9, "eps": 1e-8, "trust_coeff": 0.001}),
}

#: Every optimizer's hyperparameters: the keywords ``create_optimizer`` takes besides its own.
HYPERPARAMETERS = tuple(dict.fromkeys(k for info in OPTIMIZERS.values()
                                      for k in info.hyperparameters))

#: The optimizers that take a fixed loss scale and divide it out of the gradients themselves.
TAKES_LOSS_SCALE = tuple(name for name, info in OPTIMIZERS.items() if info.takes_loss_scale)


def optimizer_hyperparameters(optimizer: str, **hyperparameters: float | None
                              ) -> dict[str, float]:
    """The hyperparameters ``OPTIMIZERS[optimizer]`` is built with: each it takes as given,
    or its declared default where not given or None; those of other optimizers are ignored.

    Raises:
        TypeError: A keyword no optimizer takes (not in ``HYPERPARAMETERS``).
        KeyError: ``optimizer`` is not a key of ``OPTIMIZERS`` (the message lists them).
    """
    for name in hyperparameters:
        if name not in HYPERPARAMETERS:
            raise TypeError(f"create_optimizer() got an unexpected keyword argument {name!r}")
    if optimizer not in OPTIMIZERS:
        raise KeyError(f"unknown optimizer {optimizer!r}; valid names: "
                       f"{', '.join(sorted(OPTIMIZERS))}")
    return {name: default if hyperparameters.get(name) is None else hyperparameters[name]
            for name, default in OPTIMIZERS[optimizer].hyperparameters.items()}


def create_optimizer(net: nn.Cell, lr: np.ndarray | float, momentum: float | None = None,
                     weight_decay: float = 0.0, loss_scale: float = 1.0, *,
                     optimizer: str = "momentum", layer_decay: float = 1.0,
                     head_lr_scale: float = 1.0, **hyperparameters: float | None) -> nn.Optimizer:
    """``OPTIMIZERS[optimizer]`` over ``parameter_groups(net, lr, ...)``; ``lr`` is one LR per
    optimizer step (made a float32 Tensor) or a constant. ``momentum`` (positional for older
    calls) and ``**hyperparameters`` (of ``HYPERPARAMETERS``) set the chosen entry's
    hyperparameters, None or not given its declared default, the others are ignored
    (``optimizer_hyperparameters``); only ``TAKES_LOSS_SCALE`` divide a fixed
    ``loss_scale`` out (``TrainStep`` unscales first, so training passes 1). Weight decay is L2
    for momentum, decoupled for adamw, inside the trust ratio for lamb and lars. See
    docs/training.md#optimizers.

    Raises:
        TypeError: A keyword no optimizer takes.
        KeyError: ``optimizer`` is not a key of ``OPTIMIZERS`` (the message lists them).
        ValueError: ``loss_scale != 1.0`` with an optimizer that cannot divide it out.
    """
    chosen = optimizer_hyperparameters(optimizer, **hyperparameters, momentum=momentum)
    info = OPTIMIZERS[optimizer]
    if loss_scale != 1.0 and not info.takes_loss_scale:
        raise ValueError(f"optimizer {optimizer!r} cannot divide out a fixed loss scale "
                         f"(loss_scale={loss_scale}); only {', '.join(TAKES_LOSS_SCALE)} can. "
                         "Pass loss_scale 1.0 and unscale the gradients before the optimizer, as "
                         "TrainStep does")
    if info.takes_loss_scale:
        chosen["loss_scale"] = loss_scale
    groups = parameter_groups(net, lr, weight_decay, layer_decay, head_lr_scale)
    learning_rate = lr if isinstance(lr, float) else ms.Tensor(np.asarray(lr, np.float32))
    return info.build(groups, learning_rate, **chosen)
