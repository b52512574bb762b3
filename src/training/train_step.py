"""The training step: gradients (optionally accumulated over calls), loss scaling,
gradient clipping, the optimizer update and an exponential moving average of the weights.

``TrainStep`` replaces the cell ``Model`` builds from (network, loss, optimizer). With none of
its options on it runs the same operations as MindSpore's ``nn.TrainOneStepCell`` (fp32) or
``nn.TrainOneStepWithLossScaleCell`` (loss scaling with overflow checks on GPU/Ascend), so a
recipe without them trains bit-identically to those cells (tests compare the two).
"""
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
    """Exponential moving average of every floating-point parameter of a network (weights and
    BatchNorm moving statistics; not the integer stochastic depth counter), as timm's
    ``ModelEmaV3`` (update_after_step 0, warmup_gamma 1, warmup_power 2/3) and torchvision's
    ``ExponentialMovingAverage`` with ``use_buffers``.

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
        self.weights = ParameterTuple(p for p in network.get_parameters()
                                      if p.dtype in ms.dtype.float_type)
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
    above 1). ``HyperMap`` over the gradients: a Python loop over them builds the same
    operations but compiles many times slower.

    Args:
        grads (tuple[Tensor]): Gradients, float32.
        max_norm (float): Threshold, > 0.

    Returns:
        tuple[Tensor]: Clipped gradients.
    """
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
    """One call: the gradients of one batch and, every ``accumulation_steps`` calls, one
    optimizer step of ``network_with_loss``.

    Inputs ``(image, label)``: image float32 (B, 3, H, W), B the per-device batch
    (``batch_size``); label int32 (B,) or float32 soft targets (B, K).

    Order of an optimizer step: gradients (scaled by the loss scale) -> all-reduce in data
    parallel -> unscale -> overflow check (GPU/Ascend with loss scaling: the step is skipped
    on overflow) -> clip to ``grad_clip_norm`` -> optimizer -> EMA update.

    Gradient accumulation (``accumulation_steps`` k > 1), across calls as MindCV's
    ``TrainStep`` and ModelZoo BERT's ``BertTrainAccumulationAllReducePostWithLossScaleCell``:
    each call adds its micro-batch's (scaled) gradients and loss to buffers
    (``grad_accum.<parameter>``, ``grad_accum_loss``) and counts itself in
    ``grad_accum_step``; the k-th call takes their mean, runs the step above on it (so the
    all-reduce of data parallel runs once per optimizer step, not per micro-batch) and
    clears the buffers. With ``allreduce_per`` "micro_batch" the all-reduce moves out of the
    k-th call's branch: every call all-reduces its micro-batch's gradients and accumulates the
    reduced ones (k all-reduces per optimizer step, none inside a data-dependent branch of the
    graph; the same result, the all-reduce being linear: ``docs/distributed.md``). Peak
    memory is that of one micro-batch plus one copy of the gradients; BatchNorm sees
    micro-batch statistics, as with accumulation in PyTorch. The optimizer runs once per k
    calls, so its ``global_step`` and the LR array it indexes count optimizer steps; the
    callers count k ``Model`` steps per optimizer step (``src.training.callbacks.StepState``)
    and save checkpoints only between optimizer steps, when the buffers are zero (they are
    not saved).

    Overflowed steps are counted on the device in the parameter ``overflow_count`` (int32
    scalar, not trained, saved in training checkpoints and restored on resume): one per
    skipped optimizer step, including the steps inside a dataset-sink call, whose callbacks
    see only the last step's outputs. ``StepState`` reads it after each call; without the
    overflow check it stays 0.

    A network with stochastic depth holds the counter ``drop_path_step`` its draws hash
    (``src.models.resnet.DropPathScales``); every call adds 1 to it after the gradients are
    computed, so each micro-batch draws anew and a resumed run (which restores it) draws as
    an uninterrupted one.

    Args:
        network_with_loss (nn.Cell): ``(image, label) -> scalar loss``.
        optimizer (nn.Optimizer): Over the network's trainable parameters.
        scale_sense (Cell or Tensor, optional): Loss scale: a ``FixedLossScaleUpdateCell``,
            ``DynamicLossScaleUpdateCell`` or a scalar Tensor; None for no loss scaling (fp32).
        check_overflow (bool): Check the gradients for inf/NaN and skip such steps (GPU and
            Ascend only: MindSpore has no overflow check on CPU).
        grad_clip_norm (float): Global-norm threshold, 0 = no clipping.
        accumulation_steps (int): Calls (micro-batches) per optimizer step.
        ema (WeightEma, optional): Updated after every optimizer step.
        allreduce_per (str): With accumulation in data parallel, when the gradients are
            all-reduced: "step" (once per optimizer step, on the accumulated gradients) or
            "micro_batch" (every call, before accumulating).

    Outputs:
        loss (scalar; float32 with accumulation): the micro-batch's; on the call that steps
        the optimizer, the mean over the accumulated micro-batches. With the overflow check
        also the overflow flag (bool; False on calls that only accumulate) and the loss
        scale (float32), as MindSpore's loss-scale cell.

    Raises:
        ValueError: If ``accumulation_steps`` < 1, ``grad_clip_norm`` < 0 or ``allreduce_per``
            is not one of ``ALLREDUCE_PER``.
    """

    ALLREDUCE_PER = ("step", "micro_batch")

    def __init__(self, network_with_loss, optimizer, *, scale_sense=None, check_overflow=False,
                 grad_clip_norm=0.0, accumulation_steps=1, ema=None, allreduce_per="step"):
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
