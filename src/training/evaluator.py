"""The evaluator run at the end of training epochs: top-1/top-5 of the live network (and of its
weight EMA), keeping the checkpoint with the best top-1.

In data-parallel training every rank evaluates its own shard of the eval set and the counts
(correct top-1, correct top-5, images) are summed over the ranks once the shards are done (no
collective inside the eval graph), so every image counts exactly once, every rank computes the
same top-1 and takes the same "best" decision, and only rank 0 writes the best checkpoint.
The ranks hold the same weights but their own BatchNorm statistics (each updates them from its
own batches); they evaluate with rank 0's, the statistics of the checkpoints rank 0 writes, so
the top-1 reported is that of the saved weights (``eval.py`` on them gives the same figure).
"""
import json
import math
from collections.abc import Callable
from typing import NamedTuple

import mindspore as ms
import numpy as np
from mindspore.train import Callback

from src.data.pipeline import count_images, create_dataset
from src.utils.checkpoint import BEST_KEY, atomic_save_checkpoint
from src.utils.device import broadcast_from_rank0, sum_ints_over_ranks


class EvalShard(NamedTuple):
    """This process's part of the eval set.

    Attributes:
        dataset (mindspore.dataset.Dataset): Batches of ``image`` float32 (N, 3, H, W) and
            ``label`` int32 (N,), N the per-device batch (the last batch may be smaller).
        images (int, optional): The images of this shard: its first ``images`` rows; the rows
            after them are the sampler's padding (copies of other shards' images), not counted.
            None: every row counts (one process).
        sum_over_ranks (callable, optional): ``list[int] -> list[int]``, summed over the ranks
            (``src.utils.device.sum_ints_over_ranks``); None in one process.
        broadcast (callable, optional): ``list[ndarray] -> list[ndarray]``, rank 0's arrays
            on every rank (``src.utils.device.broadcast_from_rank0``); None in one process.
    """

    dataset: object
    images: int | None = None
    sum_over_ranks: Callable | None = None
    broadcast: Callable | None = None


def shard_rows(total, num_shards, shard_id):
    """How MindSpore's ``DistributedSampler`` (``num_shards``/``shard_id`` of a dataset, no
    shuffling) splits ``total`` images: shard ``s`` reads images ``s, s + num_shards, ...``,
    then pads with images from the start so that every shard has the same row count.

    Returns:
        tuple(int, int): (images of this shard, rows it reads): its first ``images`` rows are
        its own images, the remaining ``rows - images`` (0 or 1) are padding.
    """
    return len(range(shard_id, total, num_shards)), math.ceil(total / num_shards)


def eval_shard(data_path, data_args, num_shards=None, shard_id=None):
    """The eval set of this process: all of it, or in data parallel (``num_shards`` > 1) the
    shard ``shard_id``, with the count of its own images and the collectives that combine the
    shards' results.

    Args:
        data_path (str): Eval folder (as ``create_dataset``).
        data_args (dict): ``create_dataset`` keyword arguments (``dataset``, ``batch_size``
            per device, ``image_size``, ...), without ``is_training`` and the shard keys.
        num_shards (int, optional): Number of ranks.
        shard_id (int, optional): This rank.

    Returns:
        EvalShard: For ``BestCheckpointEvaluator``.

    Raises:
        RuntimeError: If the sharded dataset does not have the rows ``shard_rows`` expects
            (a MindSpore whose sampler shards otherwise: the count would be wrong).
    """
    if not num_shards or num_shards == 1:
        return EvalShard(create_dataset(data_path, is_training=False, **data_args))
    dataset = create_dataset(data_path, is_training=False, num_shards=num_shards,
                             shard_id=shard_id, **data_args)
    total = count_images(data_path, is_training=False,
                         dataset=data_args.get("dataset", "imagefolder"),
                         indices=data_args.get("indices"))
    images, rows = shard_rows(total, num_shards, shard_id)
    batches = math.ceil(rows / data_args["batch_size"])
    if dataset.get_dataset_size() != batches:
        raise RuntimeError(f"eval shard {shard_id} of {num_shards} over {total} images has "
                           f"{dataset.get_dataset_size()} batches, expected {batches} "
                           f"({rows} rows): the sampler's sharding changed")
    return EvalShard(dataset, images, sum_ints_over_ranks, broadcast_from_rank0)


class TopKCounter(Callback):
    """``Model.eval`` callback counting correct top-1 and top-k predictions, as MindSpore's
    ``TopKCategoricalAccuracy`` decides them, over the first ``limit`` rows evaluated.

    Reads each step's network outputs ``(loss, logits (N, C), label (N,))``, as the eval cells
    of ``src.training.model`` give them.

    Args:
        limit (int, optional): Rows counted (the shard's own images); None for all.
        k (int): Top-k (capped at the class count).
    """

    def __init__(self, limit=None, k=5):
        super().__init__()
        self.limit, self.k = limit, k
        self.top1 = self.topk = self.images = 0

    def on_eval_begin(self, run_context):
        self.top1 = self.topk = self.images = 0

    def on_eval_step_end(self, run_context):
        outputs = run_context.original_args().net_outputs
        logits, labels = outputs[1].asnumpy(), outputs[2].asnumpy()
        keep = len(labels) if self.limit is None else max(0, min(len(labels),
                                                                 self.limit - self.images))
        ranked = np.argsort(-logits[:keep], axis=1)[:, :min(self.k, logits.shape[1])]
        hits = ranked == labels[:keep].reshape(-1, 1)
        self.top1 += int(hits[:, 0].sum())
        self.topk += int(hits.sum())
        self.images += keep


class BestCheckpointEvaluator:
    """Evaluate the network being trained (and its weight EMA) on a dataset and keep the
    checkpoint with the best top-1.

    The best checkpoint holds the weights it was chosen on, under the network's parameter
    names: the live ones, or the EMA's with ``best_on_ema``, and its score (``best_score``,
    ``{"top1", "epoch"}``: a resumed run keeps the higher of it and its checkpoint's). In
    data parallel (``shard`` with collectives) every rank must call the evaluator at the same
    points: each evaluates its shard with rank 0's BatchNorm statistics (its own are put back
    afterwards, so evaluating does not change training), the counts are summed over the
    ranks, and only the process with ``write`` saves.

    Args:
        model (mindspore.train.Model): Evaluates the live network; its eval network gives
            ``(loss, logits, label)``.
        shard (EvalShard): The eval set of this process (``eval_shard``).
        best_path (str): Where the best checkpoint is written (atomically).
        net (nn.Cell): The network being trained.
        ema (WeightEma, optional): Its weight EMA (``src.training.train_step``).
        ema_model (mindspore.train.Model, optional): Evaluates a second network of the same
            architecture, into which the averages are copied before each evaluation.
        best_on_ema (bool): Choose the best checkpoint by the EMA's top-1.
        write (bool): Whether this process writes the best checkpoint (rank 0).
    """

    def __init__(self, model, shard, best_path, net, ema=None, ema_model=None,
                 best_on_ema=False, write=True):
        self.model, self.shard, self.best_path, self.net = model, shard, best_path, net
        self.ema, self.ema_model = ema, ema_model
        self.best_key = "ema_top1" if best_on_ema and ema is not None else "top1"
        self.best_top1 = -1.0
        self.best_epoch = None
        self.write = write

    def best_score(self):
        """The best so far, for the training checkpoints: ``{"top1", "epoch"}``, or None
        before the first evaluation."""
        return (None if self.best_epoch is None
                else {"top1": self.best_top1, "epoch": self.best_epoch})

    def restore(self, best):
        """Continue from a resumed checkpoint's best (``stored_best``; None: nothing yet), so
        a worse evaluation after a resume does not replace the best checkpoint. Every rank
        reads the same checkpoint, so every rank holds the same value."""
        if best is not None:
            self.best_top1, self.best_epoch = float(best["top1"]), int(best["epoch"])

    def count(self, model):
        """[correct top-1, correct top-5, images] of ``model`` on this process's shard."""
        counter = TopKCounter(self.shard.images)
        model.eval(self.shard.dataset, callbacks=[counter], dataset_sink_mode=False)
        return [counter.top1, counter.topk, counter.images]

    def rank0_statistics(self, network):
        """Give ``network``'s non-trainable parameters (BatchNorm moving statistics) rank 0's
        values (one all-reduce; on rank 0, and wherever they are equal, nothing is written).

        Returns:
            list: (parameter, its own value) of the parameters changed, to put back.
        """
        if self.shard.broadcast is None:
            return []
        params = [p for p in network.get_parameters()  # not the stochastic depth counter
                  if not p.requires_grad and p.dtype in ms.dtype.float_type]
        own = [p.asnumpy().copy() for p in params]  # asnumpy() may share the host memory
        changed = []
        for param, mine, rank0 in zip(params, own, self.shard.broadcast(own)):
            if not np.array_equal(mine, rank0):
                param.set_data(ms.Tensor(rank0))
                changed.append((param, mine))
        return changed

    def __call__(self, epoch=None):
        """Evaluate after ``epoch`` (1-based, recorded with the best); save if the chosen
        top-1 improved. Returns {"top1", "top5"[, "ema_top1", "ema_top5"], "best_top1",
        "eval_images"} (over all ranks)."""
        changed = self.rank0_statistics(self.net)
        try:
            counts = self.count(self.model)
        finally:
            for param, value in changed:
                param.set_data(ms.Tensor(value))
        if self.ema is not None:
            averages = self.ema.by_network_name()
            for param in self.ema_model.predict_network.get_parameters():
                param.set_data(averages[param.name].value())
            self.rank0_statistics(self.ema_model.predict_network)
            counts += self.count(self.ema_model)[:2]
        if self.shard.sum_over_ranks is not None:
            counts = self.shard.sum_over_ranks(counts)
        images = counts[2]
        result = {"top1": counts[0] / images, "top5": counts[1] / images}
        if self.ema is not None:
            result.update(ema_top1=counts[3] / images, ema_top5=counts[4] / images)
        if result[self.best_key] > self.best_top1:  # the same numbers, so the same on each rank
            self.best_top1, self.best_epoch = result[self.best_key], epoch
            chosen = (self.ema_model.predict_network if self.best_key == "ema_top1"
                      else self.net)
            if self.write:  # with its score: a resume compares it with the checkpoint's
                atomic_save_checkpoint(chosen, self.best_path,
                                       {BEST_KEY: json.dumps(self.best_score())})
        return dict(result, best_top1=self.best_top1, eval_images=images)
