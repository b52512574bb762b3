"""Per-step learning-rate schedules: pure functions returning one float32 LR per step.

``warmup_cosine_lr`` is NVIDIA DeepLearningExamples' ``lr_cosine_policy`` (ResNet-50 v1.5)
evaluated per step instead of per epoch; ``warmup_linear_lr`` and ``warmup_step_lr`` are
the two other schedules of MindSpore ModelZoo's ResNet; ``warmup_poly_lr`` is the MLPerf
reference ResNet-50's ``PolynomialDecayWithWarmup`` (used with LARS).
"""
import math

import numpy as np


def scale_lr(base_lr, global_batch_size, base_batch_size=256):
    """Linear scaling rule (Goyal et al. 2017): base_lr per base_batch_size images.

    Args:
        base_lr (float): LR at a global batch of ``base_batch_size``.
        global_batch_size (int): Images per step over all devices.
        base_batch_size (int): Reference global batch.

    Returns:
        float: ``base_lr * global_batch_size / base_batch_size``.
    """
    return base_lr * global_batch_size / base_batch_size


def _warmup(peak_lr, warmup_steps):
    # Step s (0-based) of warmup gets peak * (s + 1) / warmup_steps: never 0, peak at the end.
    return [peak_lr * (s + 1) / warmup_steps for s in range(warmup_steps)]


def _check(total_steps, warmup_steps):
    if total_steps < 1:
        raise ValueError(f"total_steps must be positive, got {total_steps}")
    if not 0 <= warmup_steps <= total_steps:
        raise ValueError(f"warmup_steps must be in [0, total_steps={total_steps}], "
                         f"got {warmup_steps}")


def warmup_cosine_lr(peak_lr, total_steps, warmup_steps, end_lr=0.0):
    """Linear warmup to ``peak_lr``, then half-cosine decay towards ``end_lr``.

    Step s < W: peak * (s + 1) / W. Step s >= W: end + (peak - end) * (1 + cos(pi * t / T)) / 2
    with t = s - W and T = total - W, so the first decay step is the peak and the last
    approaches ``end_lr`` (reached at t = T, one step past the end).

    Args:
        peak_lr (float): LR at the end of warmup (already scaled to the global batch).
        total_steps (int): Number of training steps (epochs * steps per epoch).
        warmup_steps (int): Number of warmup steps.
        end_lr (float): Value the cosine decays to.

    Returns:
        numpy.ndarray: float32, shape (total_steps,).

    Raises:
        ValueError: If the step counts are inconsistent.
    """
    _check(total_steps, warmup_steps)
    decay_steps = total_steps - warmup_steps
    decay = [end_lr + 0.5 * (1.0 + math.cos(math.pi * t / decay_steps)) * (peak_lr - end_lr)
             for t in range(decay_steps)]
    return np.array(_warmup(peak_lr, warmup_steps) + decay, dtype=np.float32)


def warmup_linear_lr(peak_lr, total_steps, warmup_steps, end_lr=0.0):
    """Linear warmup to ``peak_lr``, then linear decay towards ``end_lr`` (ModelZoo "linear").

    Returns:
        numpy.ndarray: float32, shape (total_steps,).
    """
    _check(total_steps, warmup_steps)
    decay_steps = total_steps - warmup_steps
    decay = [peak_lr + (end_lr - peak_lr) * t / decay_steps for t in range(decay_steps)]
    return np.array(_warmup(peak_lr, warmup_steps) + decay, dtype=np.float32)


def warmup_poly_lr(peak_lr, total_steps, warmup_steps, end_lr=0.0, power=2.0):
    """Linear warmup to ``peak_lr``, then polynomial decay towards ``end_lr``: the MLPerf
    Training reference ResNet-50's ``PolynomialDecayWithWarmup`` (mlcommons/training
    ``retired_benchmarks/resnet-tf2/tensorflow2/lars_util.py``, commit 3c81f6f; Keras
    ``PolynomialDecay`` with ``cycle=False``, power 2 there).

    Step s < W: peak * (s + 1) / W. Step s >= W: end + (peak - end) * (1 - t / D) ** power
    with t = s - W and D = total - W + 1: the reference's decay steps, counted from the end
    of warmup, so the first decay step is the peak and the last is
    end + (peak - end) * (2 / D) ** power (``end_lr`` would come two steps past the end).
    The decay equals the reference's at every step; its warmup gives peak * s / W at its
    0-based step s (LR 0 on the first step), one step behind this one.

    Args:
        peak_lr (float): LR at the end of warmup (already scaled to the global batch).
        total_steps (int): Number of training steps (epochs * steps per epoch).
        warmup_steps (int): Number of warmup steps.
        end_lr (float): Value the decay approaches (the reference's ``end_learning_rate``).
        power (float): Exponent of the decay, > 0 (the reference's 2).

    Returns:
        numpy.ndarray: float32, shape (total_steps,).

    Raises:
        ValueError: If the step counts are inconsistent or ``power`` <= 0.
    """
    _check(total_steps, warmup_steps)
    if not power > 0:
        raise ValueError(f"lr_poly_power must be > 0, got {power}")
    decay_steps = total_steps - warmup_steps + 1
    decay = [end_lr + (peak_lr - end_lr) * (1.0 - t / decay_steps) ** power
             for t in range(total_steps - warmup_steps)]
    return np.array(_warmup(peak_lr, warmup_steps) + decay, dtype=np.float32)


def warmup_step_lr(peak_lr, total_steps, warmup_steps, *, steps_per_epoch, decay_epochs,
                   decay_factor=0.1):
    """Linear warmup, then ``peak_lr`` multiplied by ``decay_factor`` at each decay epoch.

    Args:
        steps_per_epoch (int): Steps in one epoch, to place ``decay_epochs``.
        decay_epochs (list[int]): Epochs (0-based starts) at which the LR drops.
        decay_factor (float): Multiplier applied at each drop.

    Returns:
        numpy.ndarray: float32, shape (total_steps,).
    """
    _check(total_steps, warmup_steps)
    boundaries = [e * steps_per_epoch for e in decay_epochs]
    decay = [peak_lr * decay_factor ** sum(s >= b for b in boundaries)
             for s in range(warmup_steps, total_steps)]
    return np.array(_warmup(peak_lr, warmup_steps) + decay, dtype=np.float32)


def create_lr(*, lr_schedule, base_lr, base_lr_batch_size, global_batch_size, epoch_size,
              steps_per_epoch, warmup_epochs, lr_end=0.0, lr_decay_epochs=(),
              lr_decay_factor=0.1, lr_poly_power=2.0):
    """The per-step LR array of a recipe (the config keys of the same names).

    Args:
        lr_schedule (str): ``cosine``, ``linear``, ``step`` or ``poly`` (``SCHEDULES``).
        base_lr (float): LR per ``base_lr_batch_size`` images of global batch.
        base_lr_batch_size (int): Global batch at which ``base_lr`` applies (images).
        global_batch_size (int): Images per optimizer step over all devices:
            ``batch_size * grad_accumulation_steps * device_num``.
        epoch_size (int): Training epochs.
        steps_per_epoch (int): Optimizer steps in one epoch (per device = global).
        warmup_epochs (int): Linear warmup length, epochs (capped at the whole run).
        lr_end (float): Value cosine, linear and poly decay towards (absolute, not scaled).
        lr_decay_epochs (list[int]): ``step``: epochs at which the LR drops.
        lr_decay_factor (float): ``step``: multiplier at each drop.
        lr_poly_power (float): ``poly``: exponent of the decay.

    Returns:
        tuple: (numpy float32 array of shape (epoch_size * steps_per_epoch,), peak LR).

    Raises:
        KeyError: If ``lr_schedule`` is unknown; lists the valid names.
    """
    if lr_schedule not in SCHEDULES:
        raise KeyError(f"unknown lr_schedule {lr_schedule!r}; valid: {', '.join(SCHEDULES)}")
    peak = scale_lr(base_lr, global_batch_size, base_lr_batch_size)
    total = epoch_size * steps_per_epoch
    warmup = min(warmup_epochs * steps_per_epoch, total)
    options = {"step": {"steps_per_epoch": steps_per_epoch, "decay_epochs": lr_decay_epochs,
                        "decay_factor": lr_decay_factor},
               "poly": {"end_lr": lr_end, "power": lr_poly_power}}
    return SCHEDULES[lr_schedule](peak, total, warmup,
                                  **options.get(lr_schedule, {"end_lr": lr_end})), peak


LR_KEYS = ("lr_schedule", "base_lr", "base_lr_batch_size", "epoch_size", "warmup_epochs",
           "lr_end", "lr_decay_epochs", "lr_decay_factor", "lr_poly_power")
"""Config keys that define the LR recipe (``create_lr``'s arguments besides the batch and
the steps per epoch)."""

SCHEDULES = {"cosine": warmup_cosine_lr, "linear": warmup_linear_lr, "step": warmup_step_lr,
             "poly": warmup_poly_lr}
"""Schedule name -> function of (peak, total, warmup, ...); cosine and linear then take
``end_lr``, step its epochs and factor, poly ``end_lr`` and ``power`` (``create_lr``)."""
