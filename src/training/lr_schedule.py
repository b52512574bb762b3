"""Per-step LR schedules (one float32 LR per optimizer step), each a linear warmup then a
decay: cosine (NVIDIA's ``lr_cosine_policy`` per step), linear and step (ModelZoo's ResNet),
poly (the MLPerf reference's ``PolynomialDecayWithWarmup``). See docs/training.md#lr-schedules."""
import math
from collections.abc import Sequence

import numpy as np

from src.utils.config import ConfigError


def scale_lr(base_lr: float, global_batch_size: int, base_batch_size: int = 256) -> float:
    """Linear scaling rule (Goyal et al. 2017): ``base_lr * global_batch_size /
    base_batch_size``."""
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


def warmup_cosine_lr(peak_lr: float, total_steps: int, warmup_steps: int,
                     end_lr: float = 0.0) -> np.ndarray:
    """Warmup to ``peak_lr`` (step s < W: peak (s + 1) / W), then ``end + (peak -
    end) (1 + cos(pi t / T)) / 2``, t = s - W, T = total - W; float32 (total_steps,). Raises
    ValueError for inconsistent step counts."""
    _check(total_steps, warmup_steps)
    decay_steps = total_steps - warmup_steps
    decay = [end_lr + 0.5 * (1.0 + math.cos(math.pi * t / decay_steps)) * (peak_lr - end_lr)
             for t in range(decay_steps)]
    return np.array(_warmup(peak_lr, warmup_steps) + decay, dtype=np.float32)


def warmup_linear_lr(peak_lr: float, total_steps: int, warmup_steps: int,
                     end_lr: float = 0.0) -> np.ndarray:
    """Warmup to ``peak_lr``, then linear decay towards ``end_lr`` (ModelZoo's
    "linear"); float32 (total_steps,)."""
    _check(total_steps, warmup_steps)
    decay_steps = total_steps - warmup_steps
    decay = [peak_lr + (end_lr - peak_lr) * t / decay_steps for t in range(decay_steps)]
    return np.array(_warmup(peak_lr, warmup_steps) + decay, dtype=np.float32)


def warmup_poly_lr(peak_lr: float, total_steps: int, warmup_steps: int, end_lr: float = 0.0,
                   power: float = 2.0) -> np.ndarray:
    """Warmup to ``peak_lr``, then ``end + (peak - end) (1 - t / D)^power``, t = s - W,
    D = total - W + 1: the MLPerf reference's decay (mlcommons/training ``lars_util.py``);
    float32 (total_steps,). Raises ValueError for inconsistent step counts or ``power`` <= 0."""
    _check(total_steps, warmup_steps)
    if not power > 0:
        raise ValueError(f"lr_poly_power must be > 0, got {power}")
    decay_steps = total_steps - warmup_steps + 1
    decay = [end_lr + (peak_lr - end_lr) * (1.0 - t / decay_steps) ** power
             for t in range(total_steps - warmup_steps)]
    return np.array(_warmup(peak_lr, warmup_steps) + decay, dtype=np.float32)


def warmup_step_lr(peak_lr: float, total_steps: int, warmup_steps: int, *, steps_per_epoch: int,
                   decay_epochs: Sequence[int], decay_factor: float = 0.1) -> np.ndarray:
    """Warmup, then ``peak_lr`` times ``decay_factor`` at each epoch of
    ``decay_epochs`` (0-based starts, placed by ``steps_per_epoch``); float32 (total_steps,)."""
    _check(total_steps, warmup_steps)
    boundaries = [e * steps_per_epoch for e in decay_epochs]
    decay = [peak_lr * decay_factor ** sum(s >= b for b in boundaries)
             for s in range(warmup_steps, total_steps)]
    return np.array(_warmup(peak_lr, warmup_steps) + decay, dtype=np.float32)


def create_lr(*, lr_schedule: str, base_lr: float, base_lr_batch_size: int,
              global_batch_size: int, epoch_size: int, steps_per_epoch: int,
              warmup_epochs: int, lr_end: float = 0.0, lr_decay_epochs: Sequence[int] = (),
              lr_decay_factor: float = 0.1,
              lr_poly_power: float = 2.0) -> tuple[np.ndarray, float]:
    """The per-step LR array of a recipe and its peak ``scale_lr(base_lr,
    global_batch_size, base_lr_batch_size)`` (``global_batch_size``: images per optimizer step
    over all devices): ``lr_schedule`` (a key of ``SCHEDULES``) over ``epoch_size *
    steps_per_epoch`` optimizer steps, ``warmup_epochs`` of them warmup (capped at the run); the
    other arguments are the config keys of the same names.

    Returns:
        tuple: (float32 array (epoch_size * steps_per_epoch,), peak LR).

    Raises:
        KeyError: If ``lr_schedule`` is unknown (lists the valid names).
        ConfigError: If ``lr_end`` is above the peak of a schedule that decays to it.
    """
    if lr_schedule not in SCHEDULES:
        raise KeyError(f"unknown lr_schedule {lr_schedule!r}; valid: {', '.join(SCHEDULES)}")
    peak = scale_lr(base_lr, global_batch_size, base_lr_batch_size)
    if lr_end > peak and lr_schedule in TO_LR_END:
        raise ConfigError(f"lr_end {lr_end} is above the peak LR {peak:g} (base_lr {base_lr} x "
                          f"global batch {global_batch_size} / base_lr_batch_size "
                          f"{base_lr_batch_size}): lr_schedule {lr_schedule} would make the LR "
                          f"climb to lr_end instead of decaying; use an lr_end of at most "
                          f"{peak:g}")
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

TO_LR_END = ("cosine", "linear", "poly")
"""The schedules that decay towards ``lr_end``."""

SCHEDULES = {"cosine": warmup_cosine_lr, "linear": warmup_linear_lr, "step": warmup_step_lr,
             "poly": warmup_poly_lr}
"""Schedule name -> function of (peak, total, warmup, ...); cosine and linear then take
``end_lr``, step its epochs and factor, poly ``end_lr`` and ``power`` (``create_lr``)."""
