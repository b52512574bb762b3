"""Stochastic depth (timm's ``drop_path``) with draws that are a hash, not random state.

A draw is a function of (seed, data-parallel rank, block, training call, sample), so a resumed
run draws what an uninterrupted one does: docs/network.md#stochastic-depth.
"""
import mindspore as ms
import mindspore.nn as nn
import mindspore.ops as ops
import numpy as np
from mindspore import Tensor

HASH_MODULUS = 2 ** 31 - 1  # the Mersenne prime of Park and Miller's "minimal standard" generator
# Bijections modulo the prime, each meeting Schrage's condition HASH_MODULUS % a < HASH_MODULUS // a
HASH_MULTIPLIERS = (48271, 69621, 16807, 39373)
HASH_START = 0x2545F491  # any nonzero 31-bit value: an all-zero key does not hash to 0
HashInt = int | np.ndarray | Tensor  # what hash_mix takes and gives


def drop_path_rates(drop_path_rate: float, num_blocks: int) -> list[float]:
    """The rate of each of ``num_blocks`` (>= 2) blocks in network order, timm's linear rule
    ``drop_path_rate * i / (num_blocks - 1)`` (``timm/models/resnet.py`` ``make_blocks``)."""
    return [drop_path_rate * i / (num_blocks - 1) for i in range(num_blocks)]


def _mulmod(h, a):
    """``a * h mod HASH_MODULUS`` for 0 <= h < 2**31 without a product of 2**31 or more."""
    q, r = divmod(HASH_MODULUS, a)
    return (a * (h % q) - r * (h // q)) % HASH_MODULUS


def hash_mix(h: HashInt, value: HashInt) -> HashInt:
    """Fold ``value`` into the hash ``h``: non-negative integers below 2**31 (Python ints, numpy
    or MindSpore int32 arrays, broadcast); the result is one too, the same bits on every
    backend (docs/network.md#the-hash)."""
    h = h ^ value
    for a in HASH_MULTIPLIERS:
        h = _mulmod(h ^ (h // 65536), a)
    return h ^ (h // 65536)


def block_key(seed: int, shard_id: int, block: int) -> int:
    """The hash of (``seed`` 0 .. 2**32 - 1, data-parallel rank ``shard_id``, 0-based
    ``block``): the start of one block's draws on one rank, a Python int below 2**31."""
    h = HASH_START
    for value in (seed % 65536, seed // 65536, shard_id, block):
        h = hash_mix(h, value)
    return h


class DropPathScales(nn.Cell):
    """The stochastic depth scales of one training call: per block with a rate ``p`` in
    ``rates`` (its index in ``blocks``) and sample, ``1 / (1 - p)`` (kept, timm's
    ``scale_by_keep``) or 0 (dropped, probability ``p``); ``seed`` and ``shard_id`` (rank) keyed.

    Inputs:
        - **step** (Tensor) - int32 scalar, the training call (``ResNet.drop_path_step``).
        - **batch_size** (int) - N, the per-device batch.

    Outputs:
        Tensor: float32, (len(rates), N, 1, 1, 1): 0 or 1 / (1 - rate).
    """

    def __init__(self, rates: list[float], blocks: list[int], seed: int, shard_id: int) -> None:
        super().__init__()
        self.rates, self.blocks = list(rates), list(blocks)
        keep = 1.0 - np.array(rates, np.float64).reshape(-1, 1)
        self.keys = Tensor(np.array([[block_key(seed, shard_id, b)] for b in blocks], np.int32))
        self.thresholds = Tensor(np.round(keep * HASH_MODULUS).astype(np.int32))
        self.keep_probs = Tensor(keep.astype(np.float32))

    def construct(self, step: Tensor, batch_size: int) -> Tensor:
        samples = ops.arange(batch_size, dtype=ms.int32).reshape((1, -1))
        draws = hash_mix(hash_mix(self.keys, step), samples)
        kept = (draws < self.thresholds).astype(ms.float32)
        return (kept / self.keep_probs).reshape((self.keys.shape[0], -1, 1, 1, 1))
