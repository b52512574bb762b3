"""Process environment that must be set before MindSpore is imported.

Importing this module has one side effect: it calls ``set_cpu_fast_path()``, which sets
``ONEDNN_MAX_CPU_ISA=AVX2`` unless the variable is already set. The entry points import it
first, before anything imports MindSpore (``import src.env``).

MindSpore 2.10's oneDNN (3.10) runs its NCHW 3x3 and 7x7 convolutions in the reference
kernel (``jit_uni_ncsp:conv+ref:any``) at every AVX-512 level: AVX512_CORE,
AVX512_CORE_VNNI and AVX512_CORE_BF16 alike (AVX512_CORE_AMX resolves to BF16 on a CPU
without AMX). Measured on an AVX-512 CPU with VNNI and BF16, ResNet-50 at batch 4, 224 px:
29-30x slower training and 53-54x slower inference than under AVX2, where every convolution
takes oneDNN's JIT GEMM kernel (``benchmarks/onednn_breakdown.py --isa_levels ...``,
results in ``benchmarks/results/onednn_breakdown/``). So AVX2 is the cap on every CPU; on a
CPU without AVX-512 it changes nothing.
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
