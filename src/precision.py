"""Mixed precision: the AMP level and the loss scaling that goes with it."""
from mindspore.train import FixedLossScaleManager


def resolve_amp_level(amp_level, device_target):
    """``amp_level: auto`` -> O2 on GPU/Ascend, O0 (fp32) on CPU; explicit levels pass through.

    On CPU MindSpore's fp16 kernels measured 2-4x slower than fp32 and bf16 fails, so fp32.

    Args:
        amp_level (str): ``auto``, ``O0``, ``O1``, ``O2`` or ``O3``.
        device_target (str): ``CPU``, ``GPU`` or ``Ascend``.

    Returns:
        str: the level ``Model`` gets.
    """
    if amp_level != "auto":
        return amp_level
    return "O0" if device_target == "CPU" else "O2"


def loss_scale_setup(amp_level, device_target, loss_scale):
    """(loss-scale manager for ``Model``, loss scale for the optimizer) under ``amp_level``.

    fp32 (O0): no loss scaling. GPU/Ascend: a fixed scale whose overflowed steps are skipped
    (MindSpore's loss-scale cell checks the gradients and drops the update). CPU with mixed
    precision: MindSpore supports only a fixed scale without overflow detection there, so the
    optimizer divides it out and a non-finite loss stops training instead.

    Args:
        amp_level (str): The resolved level (``resolve_amp_level``).
        device_target (str): ``CPU``, ``GPU`` or ``Ascend``.
        loss_scale (float): The fixed scale.

    Returns:
        tuple: (``FixedLossScaleManager`` or None, float).
    """
    if amp_level == "O0":
        return None, 1.0
    if device_target == "CPU":
        return FixedLossScaleManager(loss_scale, drop_overflow_update=False), loss_scale
    return FixedLossScaleManager(loss_scale, drop_overflow_update=True), 1.0
