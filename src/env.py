"""Process environment that must be set before MindSpore is imported.

Importing this module has one side effect: it calls ``set_cpu_fast_path()``, which sets
``ONEDNN_MAX_CPU_ISA=AVX2`` unless the variable is already set. The entry points import it
first, before anything imports MindSpore (``import src.env``).

MindSpore 2.10's oneDNN build picks a reference (very slow) kernel for NCHW convolutions on
AVX-512 CPUs; capping oneDNN at AVX2 selects the JIT kernels (ResNet-50 training measured
0.18 -> 6.4 img/s at batch 32, 224 px). ``benchmarks/cpu_benchmark.py`` measures it (run it
with ``ONEDNN_MAX_CPU_ISA=ALL`` set).
"""
import os

ONEDNN_ISA_VAR = "ONEDNN_MAX_CPU_ISA"
FAST_CPU_ISA = "AVX2"


def set_cpu_fast_path():
    """Cap oneDNN at AVX2 unless the user already set ``ONEDNN_MAX_CPU_ISA``.

    Must run before ``import mindspore``: oneDNN reads the variable once, when it loads.
    A user can choose any other ISA by exporting the variable (``ONEDNN_MAX_CPU_ISA=ALL``
    restores oneDNN's own choice). It only affects CPU kernels. Importing this module already
    calls it; calling it again changes nothing.

    Returns:
        str: the value in force.
    """
    return os.environ.setdefault(ONEDNN_ISA_VAR, FAST_CPU_ISA)


set_cpu_fast_path()
