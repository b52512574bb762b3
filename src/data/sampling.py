"""Which images an epoch reads (a ``val_split`` part, class-balanced draws, ``aug_repeats``,
data-parallel shards), every epoch's order a function of (seed, epoch) alone, and the class
weights of ``class_balance``. See docs/data.md#unbalanced-classes-class_balance for why not
MindSpore's samplers.
"""
import math
from collections.abc import Sequence

import mindspore.dataset as ds
import numpy as np

SAMPLER_STREAM = 2  # tags the sampler's random streams apart from the split's (split.py)


def class_counts(labels: Sequence[int] | np.ndarray, class_num: int) -> np.ndarray:
    """Images per class: int64 (class_num,) from int labels in [0, class_num)."""
    return np.bincount(np.asarray(labels, np.int64), minlength=class_num)


def balanced_class_weights(counts: Sequence[int] | np.ndarray) -> np.ndarray:
    """Class weights ``n / (K * count_c)``, float32 (K,), scikit-learn's
    ``compute_class_weight("balanced")``: their mean over the images is exactly 1.

    Raises:
        ValueError: If a class has no image (its weight would be infinite).
    """
    counts = np.asarray(counts, np.float64)
    if counts.size == 0 or (counts < 1).any():
        raise ValueError(f"every class needs at least one image for class weights, got counts "
                         f"{counts.astype(np.int64).tolist()}")
    return (counts.sum() / (len(counts) * counts)).astype(np.float32)


def balanced_sample_weights(labels: Sequence[int] | np.ndarray) -> np.ndarray:
    """Draw weight 1 / (images of its class) of each image, float64 (N,): every class is drawn
    equally often (PyTorch's usual ``WeightedRandomSampler`` weights)."""
    labels = np.asarray(labels, np.int64)
    counts = np.bincount(labels)
    return 1.0 / counts[labels]


class EpochSampler(ds.Sampler):
    """Positions into a dataset's rows for each pass, drawn from (seed, pass) alone: in order,
    permuted or weighted draws, each repeated ``repeats`` times (timm's ``RepeatAugSampler``),
    shard ``s`` of ``S`` reading ``s, s + S, ...`` (``DistributedSampler``'s layout),
    ``ceil(len(indices) / S)`` of them. See docs/data.md#the-epoch-order-epochsampler.

    Args:
        indices: int positions of the rows to read.
        seed: Base seed (>= 0; taken modulo 2**64).
        shuffle: Permute every epoch; ignored with ``weights``.
        weights: Non-negative draw weight of each of ``indices``, not all 0.
        num_shards: Data-parallel shards; None for 1.
        shard_id: This shard, in [0, num_shards).
        repeats: Copies of each position in a row; 0 or 1 = none.

    Raises:
        ValueError: If ``indices`` is empty, ``weights`` does not fit it, ``shard_id`` is
            outside [0, num_shards), or ``repeats`` is negative.
    """

    def __init__(self, indices: Sequence[int] | np.ndarray, *, seed: int = 0,
                 shuffle: bool = True, weights: Sequence[float] | np.ndarray | None = None,
                 num_shards: int | None = None, shard_id: int | None = None, repeats: int = 1):
        self.indices = np.asarray(indices, np.int64)
        if self.indices.ndim != 1 or not len(self.indices):
            raise ValueError(f"EpochSampler needs a non-empty list of indices, got "
                             f"{len(self.indices)}")
        self.probabilities = None
        if weights is not None:
            weights = np.asarray(weights, np.float64)
            if weights.shape != self.indices.shape or (weights < 0).any() or weights.sum() <= 0:
                raise ValueError(f"weights must be {len(self.indices)} non-negative numbers, "
                                 f"not all 0")
            self.probabilities = weights / weights.sum()
        self.num_shards = num_shards or 1
        self.shard_id = shard_id or 0
        if not 0 <= self.shard_id < self.num_shards:
            raise ValueError(f"shard_id {shard_id} is outside [0, {self.num_shards})")
        if int(repeats) < 0:
            raise ValueError(f"repeats must be 0 or more, got {repeats}")
        self.repeats = max(1, int(repeats))
        self.seed, self.shuffle, self.epoch = int(seed) % 2 ** 64, bool(shuffle), 0
        self.per_shard = math.ceil(len(self.indices) / self.num_shards)
        super().__init__(num_samples=self.per_shard)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The int64 positions of pass ``epoch`` over all shards, before repeats."""
        if self.probabilities is None and not self.shuffle:
            return self.indices
        rng = np.random.default_rng([self.seed, SAMPLER_STREAM, epoch])
        if self.probabilities is None:
            return rng.permutation(self.indices)
        return rng.choice(self.indices, size=self.per_shard * self.num_shards, replace=True,
                          p=self.probabilities)

    def shard_order(self, epoch: int) -> np.ndarray:
        """This shard's positions of pass ``epoch`` (int64, ``per_shard`` long)."""
        needed = self.per_shard * self.num_shards  # the positions the shards read
        order = self.epoch_order(epoch)[:-(-needed // self.repeats)]  # those repeated
        order = np.resize(np.repeat(order, self.repeats), needed)  # padded cyclically
        return order[self.shard_id::self.num_shards]

    def __iter__(self):
        order = self.shard_order(self.epoch)
        self.epoch += 1
        return iter(order.tolist())

    def __len__(self):
        return self.per_shard

    def is_shuffled(self) -> bool:
        return self.shuffle or self.probabilities is not None

    def is_sharded(self) -> bool:
        return self.num_shards > 1


def class_count_summary(counts: Sequence[int] | np.ndarray, class_names: list[str],
                        listed: int = 20) -> tuple[str, float]:
    """One log line of the images per class (every count up to ``listed`` classes, else the
    smallest, median and largest), and largest / smallest count (inf if a class has none)."""
    counts = np.asarray(counts, np.int64)
    low, high = int(np.argmin(counts)), int(np.argmax(counts))
    ratio = counts[high] / counts[low] if counts[low] else float("inf")
    if len(counts) <= listed:
        detail = ", ".join(f"{name} {n}" for name, n in zip(class_names, counts.tolist()))
    else:
        detail = (f"smallest {counts[low]} ({class_names[low]}), median "
                  f"{int(np.median(counts))}, largest {counts[high]} ({class_names[high]})")
    return f"{len(counts)} classes, {counts.sum()} images: {detail}", float(ratio)
