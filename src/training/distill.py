"""Knowledge distillation as timm's ``timm/task/distillation.py``: a frozen teacher inside the
training step, logit (KL) or feature (MSE of pooled pre-logits) loss beside the task loss,
its three loss-weighting modes, the teacher's digest. See docs/training.md#knowledge-distillation.
"""
import hashlib
import logging
import math
from dataclasses import dataclass

import mindspore as ms
import mindspore.nn as nn
import mindspore.ops as ops
import numpy as np
from mindspore import Parameter, Tensor

from src.models.freeze import freeze_batchnorm
from src.models.resnet import create_network
from src.utils.checkpoint import (
    KD_LOSS_PREFIX,
    KD_PROJECTION_PREFIX,
    KD_TEACHER_PREFIX,
    infer_resnet,
    load_into_network,
    read_checkpoint,
    to_network_names,
)
from src.utils.config import ConfigError
from src.utils.hub import is_pretrained_source, resolve_weights
from src.utils.image_constants import IMAGENET_MEAN, IMAGENET_STD

LOGGER = logging.getLogger(__name__)
DISTILL_TYPES = ("logit", "feature")
LOSS_PARTS = ("task", "distill")
"""The loss parts a distilling step records (``kd_loss.task``, ``kd_loss.distill``)."""


def loss_weights(distill_weight: float | None, task_weight: float | None) -> tuple[float, float]:
    """(task weight, distill weight) by timm's rules, None meaning not set: the distill weight
    set: independent (task 1.0 unless set); only the task weight: distill = 1 - task; neither:
    both 1.0.

    Raises:
        ValueError: If a weight, given or derived, is negative.
    """
    if distill_weight is not None:
        weights = (1.0 if task_weight is None else task_weight, distill_weight)
    elif task_weight is not None:
        weights = (task_weight, 1.0 - task_weight)
    else:
        weights = (1.0, 1.0)
    if min(weights) < 0:
        raise ValueError(f"loss weights must be >= 0, got task {weights[0]} and distill "
                         f"{weights[1]} (task_loss_weight above 1 without distill_loss_weight "
                         f"gives a negative distill weight 1 - task)")
    return float(weights[0]), float(weights[1])


# 1/k! for k = 2..13: e^u - 1 - u = u^2 * sum_k u^(k-2)/k!, within 1e-10 relative for |u| <= 1
_EXP_SERIES = tuple(1.0 / math.factorial(k) for k in range(2, 14))
# 1/(2k+1) for k = 0..7: log1p(x) = 2y * sum_k y^(2k)/(2k+1), y = x/(2+x) <= 0.27 for x <= e-2
_ATANH_SERIES = tuple(1.0 / (2 * k + 1) for k in range(8))
NEAR_KL_SPAN = 1.0  # rows whose centered log-ratio stays within +-1 take the series form


def _horner(coefficients: tuple, x: Tensor) -> Tensor:
    out = ops.full_like(x, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        out = out * x + c
    return out


def _near_kl(p_s: Tensor, d: Tensor) -> Tensor:
    """KL(p_t || p_s) per row for p_t = p_s * e^d / Z, d (N, K) within +-1 of its p_s-mean:
    every term second order in d (docs/training.md#knowledge-distillation)."""
    u = d - (p_s * d).sum(-1, keepdims=True)
    u = ops.clamp(u, -NEAR_KL_SPAN, NEAR_KL_SPAN)  # finite on the rows the far form takes
    r = (p_s * u).sum(-1)  # 0 but for rounding
    g = u * u * _horner(_EXP_SERIES, u)  # e^u - 1 - u
    w = r + (p_s * g).sum(-1)  # Z - 1
    num = r + (p_s * (u + g) * u).sum(-1)  # sum p_s e^u u
    y = w / (2.0 + w)
    return num / (1.0 + w) - 2.0 * y * _horner(_ATANH_SERIES, y * y)  # - log1p(w)


def logit_distillation(student_logits: Tensor, teacher_logits: Tensor,
                       temperature: float) -> Tensor:
    """KL(softmax(teacher / T) || softmax(student / T)) summed over classes, averaged over
    the batch (torch's ``batchmean``), times T^2 (Hinton et al. 2015; timm's
    ``LogitDistillationTask``). Logits (N, K) of any float dtype; float32 scalar. Near-equal
    rows by a series in (teacher - student) / T, within float32's error where log-softmax
    differences lose it (docs/training.md#knowledge-distillation)."""
    student = student_logits.astype(ms.float32)
    teacher = teacher_logits.astype(ms.float32)
    log_s = ops.log_softmax(student / temperature, -1)
    log_t = ops.log_softmax(teacher / temperature, -1)
    far = (ops.exp(log_t) * (log_t - log_s)).sum(-1)
    p_s = ops.softmax(student / temperature, -1)
    d = (teacher - student) / temperature  # the difference before any rounding of its own
    centered = d - (p_s * d).sum(-1, keepdims=True)
    near = ops.stop_gradient(ops.amax(ops.abs(centered), -1) <= NEAR_KL_SPAN)
    kl = ops.where(near, _near_kl(p_s, d), far).sum()
    return kl / student_logits.shape[0] * (temperature * temperature)


def feature_distillation(student_features: Tensor, teacher_features: Tensor) -> Tensor:
    """Mean squared error of (N, C) features (timm's ``FeatureDistillationTask``); float32."""
    diff = student_features.astype(ms.float32) - teacher_features.astype(ms.float32)
    return ops.square(diff).mean()


def resnet_inside(net: nn.Cell) -> nn.Cell:
    """The ``ResNet`` of ``net`` or of its AMP output cast (``auto_mixed_precision`` O2/O3).

    Raises:
        ValueError: If there is none (its pooled features cannot be had).
    """
    inner = getattr(net, "_backbone", net)
    if not hasattr(inner, "pre_logits"):
        raise ValueError(f"{type(net).__name__} gives no pooled pre-logit features")
    return inner


class Teacher(nn.Cell):
    """A frozen network (no gradients, BatchNorm on its running statistics, parameters named
    ``kd_teacher.*``) giving logits or, with ``features``, pooled pre-logit features of
    images normalized for the student, renormalized for it when ``student_norm`` and
    ``teacher_norm`` ((mean, std) of [0, 1] RGB) differ, as timm's ``normalize_input``.

    Inputs: float32 (N, 3, H, W). Outputs: (N, K) logits or (N, C) features, no gradient.
    """

    def __init__(self, net: nn.Cell, *, features: bool = False,
                 student_norm: tuple = (IMAGENET_MEAN, IMAGENET_STD),
                 teacher_norm: tuple = (IMAGENET_MEAN, IMAGENET_STD)):
        super().__init__(auto_prefix=False)
        freeze_batchnorm(net)
        for param in net.get_parameters():
            param.requires_grad = False
            param.name = KD_TEACHER_PREFIX + param.name
        self.net = net
        self.features = features
        self.renormalize = not np.allclose(np.asarray(student_norm, np.float64),
                                           np.asarray(teacher_norm, np.float64), rtol=0, atol=0)
        (s_mean, s_std), (t_mean, t_std) = (np.asarray(v, np.float32).reshape(2, 1, 3, 1, 1)
                                            for v in (student_norm, teacher_norm))
        # x_teacher = (x * s_std + s_mean - t_mean) / t_std
        self.scale = Tensor(s_std / t_std)
        self.shift = Tensor((s_mean - t_mean) / t_std)
        self.resnet = resnet_inside(net) if features else None

    def construct(self, image):
        if self.renormalize:
            image = image * self.scale + self.shift
        out = self.resnet.pre_logits(image) if self.features else self.net(image)
        return ops.stop_gradient(out)


class DistillationLoss(nn.Cell):
    """The training loss with a teacher: ``task_weight * loss_fn(student(image), label) +
    distill_weight * distillation``, ``logit_distillation`` at ``temperature`` or, for
    ``distill_type`` "feature", ``feature_distillation`` of the student's pooled features
    through ``projection`` (an ``nn.Dense`` named ``kd_proj.*`` or None) and the teacher's.
    Like ``nn.WithLossCell`` (``backbone_network``); the step's parts are kept in
    ``kd_loss.task`` and ``kd_loss.distill`` (never saved).

    Inputs: image float32 (N, 3, H, W); label int32 (N,) or float32 (N, K).
    Outputs: float32 scalar.
    """

    def __init__(self, student: nn.Cell, loss_fn: nn.Cell, teacher: Teacher, *,
                 distill_type: str, temperature: float, task_weight: float,
                 distill_weight: float, projection: nn.Dense | None = None):
        super().__init__(auto_prefix=False)
        if distill_type not in DISTILL_TYPES:
            raise ValueError(f"kd_distill_type must be one of {', '.join(DISTILL_TYPES)}, "
                             f"got {distill_type!r}")
        if temperature <= 0:
            raise ValueError(f"kd_temperature must be > 0, got {temperature}")
        self._backbone, self._loss_fn, self.teacher = student, loss_fn, teacher
        self.features = distill_type == "feature"
        self.student_resnet = resnet_inside(student) if self.features else None
        self.projection = projection
        self.temperature = float(temperature)
        self.task_weight, self.distill_weight = float(task_weight), float(distill_weight)
        self.parts = [Parameter(Tensor(0.0, ms.float32), name=KD_LOSS_PREFIX + part,
                                requires_grad=False) for part in LOSS_PARTS]
        self.task_part, self.distill_part = self.parts

    @property
    def backbone_network(self) -> nn.Cell:
        """The student (as ``nn.WithLossCell.backbone_network``)."""
        return self._backbone

    def construct(self, image, label):
        target = self.teacher(image)
        if self.features:
            pooled = self.student_resnet.pre_logits(image)
            logits = self.student_resnet.fc(pooled)
            if self.projection is not None:
                pooled = self.projection(pooled.astype(ms.float32))  # float32 under AMP
            distill = feature_distillation(pooled, target)
        else:
            logits = self._backbone(image)
            distill = logit_distillation(logits, target, self.temperature)
        task = self._loss_fn(logits, label)
        total = self.task_weight * task + self.distill_weight * distill
        recorded = ops.assign(self.task_part, task)
        recorded = ops.depend(ops.assign(self.distill_part, distill), recorded)
        return ops.depend(total, recorded)


@dataclass(frozen=True, eq=False)
class Distillation:
    """What a distilling ``TrainStep`` adds (``src.recipe.distillation`` fills it): the
    ``Teacher``, ``distill_type``, ``temperature``, the resolved weights, the feature
    ``projection`` (kept across LP-FT's switch) and the teacher's ``source`` and ``digest``."""

    teacher: Teacher
    distill_type: str
    temperature: float
    task_weight: float
    distill_weight: float
    projection: nn.Dense | None
    source: str
    digest: str

    def loss(self, student: nn.Cell, loss_fn: nn.Cell) -> DistillationLoss:
        """The ``DistillationLoss`` of ``student`` with the task loss ``loss_fn``."""
        return DistillationLoss(student, loss_fn, self.teacher, distill_type=self.distill_type,
                                temperature=self.temperature, task_weight=self.task_weight,
                                distill_weight=self.distill_weight, projection=self.projection)


def feature_projection(student_width: int, teacher_width: int) -> nn.Dense | None:
    """The learned linear map of the student's pooled features to the teacher's width
    (``kd_proj.weight`` (teacher, student), ``kd_proj.bias``; torch ``nn.Linear``'s
    initialization), or None when the widths are equal (timm's)."""
    if student_width == teacher_width:
        return None
    projection = nn.Dense(student_width, teacher_width)
    for param in projection.get_parameters():
        param.name = KD_PROJECTION_PREFIX + param.name
    return projection


def tensors_digest(net: nn.Cell) -> str:
    """SHA-256 hex digest of ``net``'s tensors: each name (the ``kd_teacher.`` prefix
    dropped) and its bytes, in name order."""
    digest = hashlib.sha256()
    params = sorted((p.name.removeprefix(KD_TEACHER_PREFIX), p) for p in net.get_parameters())
    for name, param in params:
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(param.asnumpy()).tobytes())
    return digest.hexdigest()


def teacher_norm(source: str) -> tuple:
    """(mean, std) the teacher's weights expect: Hub weights' ``pretrained_cfg`` values when
    given, else ImageNet's (every ``.ckpt`` of this package and MindCV)."""
    mean, std = IMAGENET_MEAN, IMAGENET_STD
    if is_pretrained_source(source):
        info = resolve_weights(source).pretrained_cfg
        mean, std = info.get("mean", mean), info.get("std", std)
    for name, value, low in (("mean", mean, -np.inf), ("std", std, 0.0)):
        if (not isinstance(value, (list, tuple)) or len(value) != 3
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                           and low < v < np.inf for v in value)):
            raise ConfigError(f"kd_teacher {source}: pretrained_cfg {name} {value!r}; expected "
                              f"3 finite numbers (per RGB channel{', > 0' if low == 0 else ''})")
    return tuple(map(float, mean)), tuple(map(float, std))


def build_teacher(source: str, *, net_name: str, class_num: int, amp_level: str,
                  device_target: str, features: bool = False) -> tuple[Teacher, str, int]:
    """The frozen ``Teacher`` of weights ``source`` (as ``pre_trained`` takes them), cast by
    ``amp_level`` as the student; ``net_name`` "" = the weights' own network.

    Returns:
        tuple: (the ``Teacher``, its ``net_name``, its pooled feature width).

    Raises:
        ConfigError: If its network is not ``net_name`` or its class count not ``class_num``.
        UserError: As ``read_checkpoint`` and ``load_into_network`` (unreadable, mismatched).
    """
    params, _ = to_network_names(read_checkpoint(source), source)
    arch, classes = infer_resnet({n: tuple(p.shape) for n, p in params.items()
                                  if hasattr(p, "shape")})
    del params
    if net_name and arch != net_name:
        raise ConfigError(f"kd_teacher {source} holds a {arch} but kd_net_name is {net_name}: "
                          f"pass --kd_net_name {arch} (or leave it empty)")
    if classes != class_num:
        raise ConfigError(f"kd_teacher {source} has {classes} classes but class_num is "
                          f"{class_num}: the teacher must predict the student's classes (a "
                          f"teacher fine-tuned on them, or a {classes}-class student)")
    net = create_network(arch, class_num=class_num, device_target=device_target)
    load_into_network(net, source)
    width = net.fc.in_channels
    net = ms.amp.auto_mixed_precision(net, amp_level)
    mean, std = teacher_norm(source)
    teacher = Teacher(net, features=features, teacher_norm=(mean, std))
    return teacher, arch, width
