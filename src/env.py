"""Process environment set before MindSpore is imported (``import src.env`` first).

Importing it calls ``set_cpu_fast_path()``, by design. See docs/speed.md#cpu-speed (the oneDNN
ISA cap) for why AVX2.
"""
import os

ONEDNN_ISA_VAR = "ONEDNN_MAX_CPU_ISA"
FAST_CPU_ISA = "AVX2"


def set_cpu_fast_path() -> str:
    """Set ``ONEDNN_MAX_CPU_ISA=AVX2`` unless the user set it (``ALL``: oneDNN's own choice).

    Must run before ``import mindspore`` (oneDNN reads it once); CPU kernels only. Returns the
    value in force.
    """
    return os.environ.setdefault(ONEDNN_ISA_VAR, FAST_CPU_ISA)


set_cpu_fast_path()
