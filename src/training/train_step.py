"""The training step: gradients (optionally accumulated over calls), loss scaling,
gradient clipping, the optimizer update and a weight EMA. Without its options ``TrainStep``
trains bit-identically to MindSpore's ``nn.TrainOneStep(WithLossScale)Cell``; see
docs/training.md#the-training-step."""
import mindspore as ms
import mindspore.nn as nn
import mindspore.ops as ops
from mindspore import Parameter, ParameterTuple, Tensor

from src.utils.checkpoint import (
    DROP_PATH_STEP,
    EMA_COUNTER,
    EMA_PREFIX,
    GRAD_ACCUM_LOSS,
    GRAD_ACCUM_PREFIX,
    GRAD_ACCUM_STEP,
    OVERFLOW_COUNTER,
)

EMA_WARMUP_POWER = 2.0 / 3.0


class WeightEma(nn.Cell):
    """Exponential moving average of ``network``'s floating-point parameters (timm's
    ``ModelEmaV3``, torchvision's ``ExponentialMovingAverage``): update n sets ``ema = d_n ema +
    (1 - d_n) w`` with d_0 = 0, then ``decay`` in [0, 1) or, with ``warmup``,
    ``min(decay, 1 - (1 + n)^(-2/3))``; ``ema.*`` and ``ema_updates`` are checkpointed.

    Raises:
        ValueError: If ``decay`` is outside [0, 1).
    """

    def __init__(self, network: nn.Cell, decay: float, warmup: bool = False):
        super().__init__(auto_prefix=False)
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1) (0 = off), got {decay}")
        self.weights = ParameterTuple(p for p in network.get_parameters()
                                      if p.dtype in ms.dtype.float_type)
        self.averages = self.weights.clone(prefix=EMA_PREFIX.rstrip("."))
        self.updates = Parameter(Tensor(0.0, ms.float32), name=EMA_COUNTER, requires_grad=False)
        self.decay = Tensor(decay, ms.float32)
        self.warmup = warmup
        self.hyper_map = ops.HyperMap()

    def by_network_name(self) -> dict[str, Parameter]:
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
    """``grads`` (float32) scaled so their global L2 norm is at most ``max_norm``
    (> 0), TensorFlow's ``clip_by_global_norm``; see docs/training.md#the-training-step."""
    hyper_map = ops.HyperMap()
    norm = ops.sqrt(ops.addn(hyper_map(_square_sum, grads)))
    max_norm = float(max_norm)
    factor = max_norm / ops.maximum(norm, max_norm)
    return hyper_map(ops.partial(_scale, factor), grads)


_square_sum = ops.MultitypeFuncGraph("square_sum")


@_square_sum.register("Tensor")
def _square_sum_tensor(grad):
    return ops.reduce_sum(ops.square(grad.astype(ms.float32)))


_scale = ops.MultitypeFuncGraph("scale")


@_scale.register("Tensor", "Tensor")
def _scale_tensor(factor, grad):
    return grad * factor.astype(grad.dtype)


class TrainStep(nn.TrainOneStepWithLossScaleCell):
    """One call: one micro-batch's gradients of ``network_with_loss`` (image float32
    (B, 3, H, W) per device, label int32 (B,) or float32 (B, K)) and, every ``accumulation_steps``
    calls, one ``optimizer`` step: all-reduce (``allreduce_per`` "step" or "micro_batch"), unscale
    by ``scale_sense`` (a loss-scale cell, a Tensor, or None), skip on overflow
    (``check_overflow``, GPU/Ascend; counted in ``overflow_count``), clip to ``grad_clip_norm``
    (0 = off), step, update ``ema``. See docs/training.md#the-training-step.

    Outputs:
        The loss (the micro-batches' mean on a stepping call); with the overflow check also
        the overflow flag and the loss scale, as MindSpore's loss-scale cell.

    Raises:
        ValueError: ``accumulation_steps`` < 1, ``grad_clip_norm`` < 0 or an unknown
            ``allreduce_per``.
    """

    ALLREDUCE_PER = ("step", "micro_batch")

    def __init__(self, network_with_loss: nn.Cell, optimizer: nn.Optimizer, *,
                 scale_sense: Tensor | nn.Cell | None = None, check_overflow: bool = False,
                 grad_clip_norm: float = 0.0, accumulation_steps: int = 1,
                 ema: WeightEma | None = None, allreduce_per: str = "step"):
        if accumulation_steps < 1:
            raise ValueError(f"grad_accumulation_steps must be >= 1, got {accumulation_steps}")
        if allreduce_per not in self.ALLREDUCE_PER:
            raise ValueError(f"grad_accumulation_allreduce must be one of "
                             f"{', '.join(self.ALLREDUCE_PER)}, got {allreduce_per!r}")
        if grad_clip_norm < 0:
            raise ValueError(f"grad_clip_norm must be >= 0 (0 = off), got {grad_clip_norm}")
        self.loss_scaling = scale_sense is not None
        super().__init__(network_with_loss, optimizer,
                         scale_sense if self.loss_scaling else Tensor(1.0, ms.float32))
        self.check_overflow = self.loss_scaling and check_overflow
        self.grad_clip_norm = float(grad_clip_norm)
        self.accumulation_steps = accumulation_steps
        # all-reduce in each call (before accumulating) instead of in the stepping one
        self.reduce_each_call = accumulation_steps > 1 and allreduce_per == "micro_batch"
        self.ema = ema
        self.mul = ops.Mul()
        self.no_overflow = Tensor(False, ms.bool_)
        self.overflow_count = Parameter(Tensor(0, ms.int32), name=OVERFLOW_COUNTER,
                                        requires_grad=False)
        if accumulation_steps > 1:
            self.grad_accum = self.weights.clone(prefix=GRAD_ACCUM_PREFIX, init="zeros")
            for buffer in self.grad_accum:
                buffer.requires_grad = False
            self.grad_accum_step = Parameter(Tensor(0, ms.int32), name=GRAD_ACCUM_STEP,
                                             requires_grad=False)
            self.grad_accum_loss = Parameter(Tensor(0.0, ms.float32), name=GRAD_ACCUM_LOSS,
                                             requires_grad=False)
        counters = [p for p in network_with_loss.get_parameters() if p.name == DROP_PATH_STEP]
        self.drop_path_step = counters[0] if counters else None

    def micro_batch_gradients(self, image, label, scale):
        """(loss, gradients) of one micro-batch; gradients multiplied by ``scale``."""
        loss = self.network(image, label)
        if not self.loss_scaling:
            return loss, self.grad_no_sens(self.network, self.weights)(image, label)
        sens = ops.ones_like(loss) * scale.astype(loss.dtype)
        return loss, self.grad(self.network, self.weights)(image, label, sens)

    def accumulate(self, image, label, scale):
        """Add the micro-batch's loss and (scaled) gradients, all-reduced first with
        ``allreduce_per`` "micro_batch", to the buffers; returns (its loss, the count of
        micro-batches now accumulated)."""
        loss, grads = self.micro_batch_gradients(image, label, scale)
        loss = loss.astype(ms.float32)  # as the mean of the stepping call: the branches join
        if self.reduce_each_call:
            grads = self.grad_reducer(grads)
        added = self.hyper_map(ops.assign_add, self.grad_accum, grads)
        total = ops.assign_add(self.grad_accum_loss, loss)
        count = ops.assign_add(self.grad_accum_step, Tensor(1, ms.int32))
        return loss, ops.depend(ops.depend(count, added), total)

    def mean_accumulated(self):
        """(mean loss, mean gradients) of the accumulated micro-batches."""
        inv_k = Tensor(1.0 / self.accumulation_steps, ms.float32)
        loss = self.grad_accum_loss * inv_k
        return loss, self.hyper_map(ops.partial(self.mul, inv_k), self.grad_accum)

    def clear_accumulated(self):
        """Zero the buffers and the count; returns a value to depend on."""
        cleared = self.hyper_map(_clear, self.grad_accum)
        cleared = ops.depend(ops.assign(self.grad_accum_step, Tensor(0, ms.int32)), cleared)
        return ops.depend(ops.assign(self.grad_accum_loss, Tensor(0.0, ms.float32)), cleared)

    def apply(self, grads):
        """Clip, run the optimizer and the EMA; returns a value to depend on."""
        if self.grad_clip_norm > 0:
            grads = clip_by_global_norm(grads, self.grad_clip_norm)
        done = self.optimizer(grads)
        if self.ema is not None:
            done = ops.depend(self.ema(), done)
        return done

    def update(self, loss, grads, scale):
        """The optimizer step on (scaled) ``grads``: all-reduce (unless done in each call),
        unscale, overflow check,
        ``apply``. Returns ``loss``, and with the overflow check (``loss``, the overflow flag):
        no flag is built when nothing checks it (an unused output with side effects would be
        pruned from the graph, with MindSpore's "side effect nodes were eliminated" warning)."""
        if not self.reduce_each_call:
            grads = self.grad_reducer(grads)
        if self.loss_scaling:
            grads = self.hyper_map(ops.partial(self.mul, ops.reciprocal(scale)), grads)
        if not self.check_overflow:
            return ops.depend(loss, self.apply(grads))
        status = Tensor([0] * 8, ms.int32)
        # a scalar, as self.no_overflow, on every path (the branches of construct must join)
        overflow = self.process_loss_scale(self.get_overflow_status(status, grads)).reshape(())
        counted = ops.assign_add(self.overflow_count, overflow.astype(ms.int32))
        loss = ops.depend(loss, counted)
        if not overflow:
            loss = ops.depend(loss, self.apply(grads))
        return loss, overflow

    def construct(self, image, label):
        scale = self.scale_sense
        if self.accumulation_steps == 1:
            loss, grads = self.micro_batch_gradients(image, label, scale)
            stepped = self.update(loss, grads, scale)
        else:
            loss, count = self.accumulate(image, label, scale)
            stepped = (loss, self.no_overflow) if self.check_overflow else loss
            if count >= self.accumulation_steps:
                mean_loss, grads = self.mean_accumulated()
                stepped = self.update(mean_loss, grads, scale)
                # cleared after the update consumed the gradients (skipped or applied)
                cleared = self.clear_accumulated()
                stepped = ((ops.depend(stepped[0], cleared), stepped[1]) if self.check_overflow
                           else ops.depend(stepped, cleared))
        if self.drop_path_step is not None:  # after the call's draws were used
            bump = ops.assign_add(self.drop_path_step, Tensor(1, ms.int32))
            stepped = ((ops.depend(stepped[0], bump), stepped[1]) if self.check_overflow
                       else ops.depend(stepped, bump))
        if self.check_overflow:
            return stepped[0], stepped[1], scale
        return stepped


_clear = ops.MultitypeFuncGraph("clear")


@_clear.register("Tensor")
def _clear_tensor(buffer):
    return ops.assign(buffer, ops.zeros_like(buffer))
