"""Mixed precision: the AMP level and the loss scaling that goes with it."""
import mindspore as ms
import mindspore.nn as nn

from src.utils.config import ConfigError


def resolve_amp_level(amp_level: str, device_target: str) -> str:
    """``amp_level`` "auto" -> O2 on GPU/Ascend, O0 on CPU (where MindSpore's
    fp16 kernels measured 2-4x slower than fp32 and bf16 fails); explicit levels pass through."""
    if amp_level != "auto":
        return amp_level
    return "O0" if device_target == "CPU" else "O2"


LOSS_SCALE_TYPES = ("auto", "fixed", "dynamic")


def resolve_loss_scale_type(loss_scale_type: str, device_target: str) -> str:
    """``loss_scale_type: auto`` -> ``dynamic`` on GPU/Ascend (as MindCV, torch.amp's
    ``GradScaler``, NVIDIA and timm), ``fixed`` on CPU (MindSpore has no overflow check there).

    Raises:
        ConfigError: For ``dynamic`` on CPU, or a type not in ``LOSS_SCALE_TYPES``.
    """
    if loss_scale_type not in LOSS_SCALE_TYPES:
        raise ConfigError(f"loss_scale_type must be one of {LOSS_SCALE_TYPES}, got "
                          f"{loss_scale_type!r}")
    if loss_scale_type == "auto":
        return "fixed" if device_target == "CPU" else "dynamic"
    if loss_scale_type == "dynamic" and device_target == "CPU":
        raise ConfigError("loss_scale_type dynamic needs MindSpore's overflow check, which "
                          "exists on GPU and Ascend only; use fixed (or auto) on CPU")
    return loss_scale_type


def loss_scale_setup(amp_level: str, device_target: str, loss_scale: float, *,
                     loss_scale_type: str = "auto", scale_factor: float = 2.0,
                     scale_window: int = 1000) -> tuple[ms.Tensor | nn.Cell | None, bool, str]:
    """The loss scaling of ``TrainStep`` under ``amp_level``: none under O0; on
    GPU/Ascend a fixed or dynamic scale (``nn.DynamicLossScaleUpdateCell(loss_scale,
    scale_factor, scale_window)``) with the overflow check; on CPU (no overflow check) a fixed
    scale multiplied in and divided out.

    Returns:
        tuple: (``scale_sense``: None, a float32 Tensor or a loss-scale update cell;
        ``check_overflow``; the resolved type "none", "fixed" or "dynamic").

    Raises:
        ConfigError: As ``resolve_loss_scale_type``, checked even under O0.
    """
    kind = resolve_loss_scale_type(loss_scale_type, device_target)
    if amp_level == "O0":
        return None, False, "none"
    if device_target == "CPU":
        return ms.Tensor(loss_scale, ms.float32), False, kind
    if kind == "dynamic":
        return nn.DynamicLossScaleUpdateCell(loss_scale, scale_factor, scale_window), True, kind
    return nn.FixedLossScaleUpdateCell(loss_scale), True, kind
