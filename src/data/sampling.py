"""Which images an epoch reads: a subset of a folder (``val_split``), class-balanced draws
(``class_balance sampler``), repeated augmentation (``aug_repeats``), data-parallel shards,
every epoch's order a function of (seed, epoch) alone; and the inverse-frequency class
weights of ``class_balance``.

``EpochSampler`` draws each epoch's order in numpy from (seed, epoch), then gives this
shard its part, so every rank draws the same order and the shards split it. It replaces
MindSpore's ``SubsetRandomSampler`` / ``WeightedRandomSampler`` (chained under a
``DistributedSampler``), which are seeded from the dataset seed too but, measured with
MindSpore 2.10, over several epochs of one pipeline (dataset sink mode, any multi-epoch
iterator) the weighted one draws the same images in the same order every epoch and the
subset one's later epochs are powers of its first permutation (an image it maps to itself
stays in place every epoch). ``tests/test_class_balance.py`` checks both, so an upgrade that
fixes them shows.
"""
import math

import mindspore.dataset as ds
import numpy as np

SAMPLER_STREAM = 2  # tags the sampler's random streams apart from the split's (split.py)


def class_counts(labels, class_num):
    """Images per class.

    Args:
        labels (array-like): int labels in [0, class_num).
        class_num (int): K.

    Returns:
        numpy.ndarray: int64 (K,).
    """
    return np.bincount(np.asarray(labels, np.int64), minlength=class_num)


def balanced_class_weights(counts):
    """Inverse-frequency class weights ``n / (K * count_c)``, scikit-learn's
    ``compute_class_weight("balanced")``: a class's images weigh together as much as any
    other class's, and the mean weight over the images is exactly 1 (so a weighted mean over
    a batch keeps the scale of the unweighted one, in expectation).

    Args:
        counts (array-like): Images per class (K,), each >= 1.

    Returns:
        numpy.ndarray: float32 (K,).

    Raises:
        ValueError: If a class has no image (its weight would be infinite).
    """
    counts = np.asarray(counts, np.float64)
    if counts.size == 0 or (counts < 1).any():
        raise ValueError(f"every class needs at least one image for class weights, got counts "
                         f"{counts.astype(np.int64).tolist()}")
    return (counts.sum() / (len(counts) * counts)).astype(np.float32)


def balanced_sample_weights(labels):
    """Draw weight of each image for class-balanced sampling: 1 / (images of its class), so
    every class is drawn with probability 1/K (PyTorch's usual ``WeightedRandomSampler``
    weights).

    Args:
        labels (array-like): int label of each image (of the images drawn from only).

    Returns:
        numpy.ndarray: float64 (N,), summing to the number of classes present.
    """
    labels = np.asarray(labels, np.int64)
    counts = np.bincount(labels)
    return 1.0 / counts[labels]


class EpochSampler(ds.Sampler):
    """Positions into a dataset's rows for each epoch, drawn from (seed, epoch) alone, then
    sharded.

    Epoch ``e`` (the ``e``-th pass of this sampler, from 0) is, over all shards:
    ``indices`` in order (``shuffle`` false), a permutation of them (``shuffle``), or, with
    ``weights``, ``len(indices)`` draws with replacement, ``indices[i]`` with probability
    ``weights[i] / sum(weights)`` (``torch.utils.data.WeightedRandomSampler``'s rule). The
    numpy generator is seeded with (``seed``, ``e``). Shard ``s`` of ``S`` then reads
    positions ``s, s + S, ...`` of it after padding with its first positions to a multiple of
    ``S`` (``DistributedSampler``'s layout, which ``src.training.evaluator.shard_rows``
    counts on); weighted draws are drawn that multiple long instead of padded. Every shard
    reads ``ceil(len(indices) / S)`` positions.

    With ``repeats`` k > 1 (repeated augmentation) each position of that order is first
    written k times in a row, the list padded and strided the same way, and every shard keeps
    its first ``ceil(len(indices) / S)`` positions: an epoch is as long as without repeats
    and reads about ``1/k`` of the images, each k times, the copies on consecutive shards
    (on one shard, consecutive rows). This is timm's ``RepeatAugSampler``
    (``timm/data/distributed_sampler.py``, pytorch-image-models commit 372ad5fa) with
    ``selected_round=0``, fed this epoch order instead of its ``torch.randperm`` seeded with
    the epoch; timm's and torchvision's (``RASampler``, ``references/classification/
    sampler.py``, vision commit 775e7604) default instead cuts every shard to
    ``floor(n // 256 * 256 / S)``, which is empty below 256 images. docs/data.md says why.

    A pipeline rebuilt every epoch with the seed of the epoch (``src.recipe.epoch_dataset``)
    reads its first pass; one pipeline over the run (dataset sink mode) reads pass ``e`` in
    epoch ``e``. ``Dataset.set_init_step`` replays the passes it skips (MindSpore calls the
    sampler once per skipped epoch), so a run resumed there reads the same order.

    Args:
        indices (array-like): int positions of the rows to read (e.g. one part of a
            ``val_split``).
        seed (int): Base seed (>= 0; taken modulo 2**64).
        shuffle (bool): Permute every epoch; ignored with ``weights``.
        weights (array-like, optional): Non-negative draw weight of each of ``indices``, not
            all 0.
        num_shards (int, optional): Number of shards (data-parallel devices); None for 1.
        shard_id (int, optional): This shard, in [0, num_shards).
        repeats (int): Copies of each position read in a row (timm's ``num_repeats``,
            torchvision's ``repetitions``); 0 or 1 = none.

    Raises:
        ValueError: If ``indices`` is empty, ``weights`` does not match it or has no positive
            weight, ``shard_id`` is outside [0, num_shards), or ``repeats`` is negative.
    """

    def __init__(self, indices, seed=0, shuffle=True, weights=None, num_shards=None,
                 shard_id=None, repeats=1):
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

    def epoch_order(self, epoch):
        """The positions of pass ``epoch`` over all shards before repeats (int64,
        ``per_shard * num_shards`` long for weighted draws, else ``len(indices)``)."""
        if self.probabilities is None and not self.shuffle:
            return self.indices
        rng = np.random.default_rng([self.seed, SAMPLER_STREAM, epoch])
        if self.probabilities is None:
            return rng.permutation(self.indices)
        return rng.choice(self.indices, size=self.per_shard * self.num_shards, replace=True,
                          p=self.probabilities)

    def shard_order(self, epoch):
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

    def is_shuffled(self):
        return self.shuffle or self.probabilities is not None

    def is_sharded(self):
        return self.num_shards > 1


def class_count_summary(counts, class_names, listed=20):
    """One log line of the images per class, and how unbalanced they are.

    Args:
        counts (array-like): Images per class (K,).
        class_names (list[str]): Name of each class.
        listed (int): Up to this many classes every count is listed; beyond, the smallest,
            median and largest.

    Returns:
        tuple(str, float): The line, and largest / smallest count (inf if a class has none).
    """
    counts = np.asarray(counts, np.int64)
    low, high = int(np.argmin(counts)), int(np.argmax(counts))
    ratio = counts[high] / counts[low] if counts[low] else float("inf")
    if len(counts) <= listed:
        detail = ", ".join(f"{name} {n}" for name, n in zip(class_names, counts.tolist()))
    else:
        detail = (f"smallest {counts[low]} ({class_names[low]}), median "
                  f"{int(np.median(counts))}, largest {counts[high]} ({class_names[high]})")
    return f"{len(counts)} classes, {counts.sum()} images: {detail}", float(ratio)
