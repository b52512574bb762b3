"""The training step: gradients (optionally accumulated over micro-batches), loss scaling,
gradient clipping, the optimizer update and an exponential moving average of the weights.

``TrainStep`` replaces the cell ``Model`` builds from (network, loss, optimizer). With none of
its options on it runs the same operations as MindSpore's ``nn.TrainOneStepCell`` (fp32) or
``nn.TrainOneStepWithLossScaleCell`` (loss scaling with overflow checks on GPU/Ascend), so
today's recipes train bit-identically (tests compare the two).
"""
import mindspore as ms
import mindspore.nn as nn
import mindspore.ops as ops
from mindspore import Parameter, ParameterTuple, Tensor

from src.utils.checkpoint import EMA_COUNTER, EMA_PREFIX, OVERFLOW_COUNTER

EMA_WARMUP_POWER = 2.0 / 3.0


class WeightEma(nn.Cell):
    """Exponential moving average of every parameter of a network (weights and BatchNorm
    moving statistics), as timm's ``ModelEmaV3`` (update_after_step 0, warmup_gamma 1,
    warmup_power 2/3) and torchvision's ``ExponentialMovingAverage`` with ``use_buffers``.

    Update ``n`` (0-based count of earlier updates) uses decay
    ``d_n = 0`` for ``n = 0`` (the average starts as a copy of the weights), then
    ``d_n = min(decay, 1 - (1 + n) ** -2/3)`` with warmup or ``d_n = decay`` without, and sets
    ``ema = d_n * ema + (1 - d_n) * w`` after the optimizer step.

    The averages are parameters named ``ema.<network parameter name>`` plus the counter
    ``ema_updates``: they are saved in training checkpoints and restored on resume.

    Args:
        network (nn.Cell): The network whose parameters are averaged.
        decay (float): The decay per optimizer step, in [0, 1).
        warmup (bool): timm's warmup of the decay (short runs reach a useful average sooner).

    Raises:
        ValueError: If ``decay`` is outside [0, 1).
    """

    def __init__(self, network, decay, warmup=False):
        super().__init__(auto_prefix=False)
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1) (0 = off), got {decay}")
        self.weights = ParameterTuple(network.get_parameters())
        self.averages = self.weights.clone(prefix=EMA_PREFIX.rstrip("."))
        self.updates = Parameter(Tensor(0.0, ms.float32), name=EMA_COUNTER, requires_grad=False)
        self.decay = Tensor(decay, ms.float32)
        self.warmup = warmup
        self.hyper_map = ops.HyperMap()

    def by_network_name(self):
        """The averages keyed by the network's parameter names (``ema.`` prefix dropped)."""
        return {p.name[len(EMA_PREFIX):]: p for p in self.averages}

    def current_decay(self):
        """The decay of the coming update (float32 scalar Tensor)."""
        count = self.updates.value()
        started = (count > 0).astype(ms.float32)
        if self.warmup:
            ramp = 1.0 - ops.pow(1.0 + count, -EMA_WARMUP_POWER)
            return ops.minimum(self.decay, ramp) * started
        return self.decay * started

    def construct(self):
        decay = self.current_decay()
        updated = self.hyper_map(ops.partial(_ema_update, decay), self.averages, self.weights)
        return ops.depend(ops.assign_add(self.updates, Tensor(1.0, ms.float32)), updated)


_ema_update = ops.MultitypeFuncGraph("ema_update")


@_ema_update.register("Tensor", "Tensor", "Tensor")
def _ema_update_tensor(decay, average, weight):
    return ops.assign(average, decay * average + (1.0 - decay) * weight)


def clip_by_global_norm(grads, max_norm):
    """Scale ``grads`` so their global L2 norm is at most ``max_norm``: each gradient times
    ``max_norm / max(norm, max_norm)`` (TensorFlow's ``clip_by_global_norm``; torch's
    ``clip_grad_norm_`` divides by ``norm + 1e-6``, a relative difference below 1e-6 for norms
    above 1).

    Args:
        grads (tuple[Tensor]): Gradients, float32.
        max_norm (float): Threshold, > 0.

    Returns:
        tuple[Tensor]: Clipped gradients.
    """
    squares = [ops.reduce_sum(ops.square(g.astype(ms.float32))) for g in grads]
    norm = ops.sqrt(ops.addn(squares))
    max_norm = float(max_norm)
    factor = max_norm / ops.maximum(norm, max_norm)
    return tuple(g * factor.astype(g.dtype) for g in grads)


class TrainStep(nn.TrainOneStepWithLossScaleCell):
    """One optimizer step of ``network_with_loss``.

    Inputs ``(image, label)``: image float32 (B, 3, H, W) with B = ``accumulation_steps`` x
    the micro-batch (per device); label int32 (B,) or float32 soft targets (B, K). With
    ``accumulation_steps`` k > 1 the batch is split into k micro-batches run one after the
    other (BatchNorm sees micro-batch statistics, as with accumulation in PyTorch), their
    gradients averaged and applied in one update: one call is one optimizer step, so the LR
    schedule, checkpoints and ``metrics.jsonl`` count optimizer steps.

    Order: gradients (scaled by the loss scale) -> all-reduce in data parallel -> unscale ->
    overflow check (GPU/Ascend with loss scaling: the step is skipped on overflow) -> clip to
    ``grad_clip_norm`` -> optimizer -> EMA update.

    Overflowed steps are counted on the device in the parameter ``overflow_count`` (int32
    scalar, not trained, saved in training checkpoints and restored on resume): one per
    skipped step, including the steps inside a dataset-sink call, whose callbacks see only
    the last step's outputs. ``StepState`` reads it after each call; without the overflow
    check it stays 0.

    Args:
        network_with_loss (nn.Cell): ``(image, label) -> scalar loss``.
        optimizer (nn.Optimizer): Over the network's trainable parameters.
        scale_sense (Cell or Tensor, optional): Loss scale: a ``FixedLossScaleUpdateCell``,
            ``DynamicLossScaleUpdateCell`` or a scalar Tensor; None for no loss scaling (fp32).
        check_overflow (bool): Check the gradients for inf/NaN and skip such steps (GPU and
            Ascend only: MindSpore has no overflow check on CPU).
        grad_clip_norm (float): Global-norm threshold, 0 = no clipping.
        accumulation_steps (int): Micro-batches per optimizer step.
        ema (WeightEma, optional): Updated after every optimizer step.

    Outputs:
        loss (float32 scalar, mean over the micro-batches); with loss scaling also the
        overflow flag (bool) and the loss scale (float32), as MindSpore's loss-scale cell.

    Raises:
        ValueError: If ``accumulation_steps`` < 1 or ``grad_clip_norm`` < 0.
    """

    def __init__(self, network_with_loss, optimizer, scale_sense=None, check_overflow=False,
                 grad_clip_norm=0.0, accumulation_steps=1, ema=None):
        if accumulation_steps < 1:
            raise ValueError(f"grad_accumulation_steps must be >= 1, got {accumulation_steps}")
        if grad_clip_norm < 0:
            raise ValueError(f"grad_clip_norm must be >= 0 (0 = off), got {grad_clip_norm}")
        self.loss_scaling = scale_sense is not None
        super().__init__(network_with_loss, optimizer,
                         scale_sense if self.loss_scaling else Tensor(1.0, ms.float32))
        self.check_overflow = self.loss_scaling and check_overflow
        self.grad_clip_norm = float(grad_clip_norm)
        self.accumulation_steps = accumulation_steps
        self.ema = ema
        self.mul = ops.Mul()
        self.overflow_count = Parameter(Tensor(0, ms.int32), name=OVERFLOW_COUNTER,
                                        requires_grad=False)

    def micro_batch_gradients(self, image, label, scale):
        """(loss, gradients) of one micro-batch; gradients multiplied by ``scale``."""
        loss = self.network(image, label)
        if not self.loss_scaling:
            return loss, self.grad_no_sens(self.network, self.weights)(image, label)
        sens = ops.ones_like(loss) * scale.astype(loss.dtype)
        return loss, self.grad(self.network, self.weights)(image, label, sens)

    def gradients(self, image, label, scale):
        """(mean loss, mean gradients) over the micro-batches of the step."""
        k = self.accumulation_steps
        if k == 1:
            return self.micro_batch_gradients(image, label, scale)
        size = image.shape[0] // k
        loss, grads = self.micro_batch_gradients(image[:size], label[:size], scale)
        for i in range(1, k):
            part = slice(i * size, (i + 1) * size)
            loss_i, grads_i = self.micro_batch_gradients(image[part], label[part], scale)
            loss = loss + loss_i
            grads = self.hyper_map(ops.add, grads, grads_i)
        inv_k = Tensor(1.0 / k, ms.float32)
        return loss * inv_k, self.hyper_map(ops.partial(self.mul, inv_k), grads)

    def apply(self, grads):
        """Clip, run the optimizer and the EMA; returns a value to depend on."""
        if self.grad_clip_norm > 0:
            grads = clip_by_global_norm(grads, self.grad_clip_norm)
        done = self.optimizer(grads)
        if self.ema is not None:
            done = ops.depend(self.ema(), done)
        return done

    def construct(self, image, label):
        scale = self.scale_sense
        loss, grads = self.gradients(image, label, scale)
        grads = self.grad_reducer(grads)
        if self.loss_scaling:
            grads = self.hyper_map(ops.partial(self.mul, ops.reciprocal(scale)), grads)
        if not self.check_overflow:
            return ops.depend(loss, self.apply(grads))
        status = Tensor([0] * 8, ms.int32)
        overflow = self.process_loss_scale(self.get_overflow_status(status, grads))
        counted = ops.assign_add(self.overflow_count, overflow.astype(ms.int32).reshape(()))
        loss = ops.depend(loss, counted)
        if not overflow:
            loss = ops.depend(loss, self.apply(grads))
        return loss, overflow, scale
