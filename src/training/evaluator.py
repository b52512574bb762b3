"""The evaluator of training epochs: top-1/top-5 and mean eval loss of the live network
(and its weight EMA); in data parallel each rank evaluates its shard with rank 0's BatchNorm
statistics and the counts are summed. See docs/training.md#evaluation-during-training."""
import math
from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

import mindspore as ms
import mindspore.nn as nn
import numpy as np
from mindspore.train import Callback, Model, RunContext

from src.data.image_check import readable_pipeline_errors
from src.data.pipeline import count_images, create_dataset
from src.data.settings import Sampling
from src.training.train_step import WeightEma
from src.utils.device import (
    all_gather_int,
    all_gather_rows,
    broadcast_from_rank0,
    sum_ints_over_ranks,
    sum_over_ranks,
)
from src.utils.errors import UserError
from src.utils.multilabel_metrics import mean_average_precision, sigmoid


class EvalShard(NamedTuple):
    """This process's part of the eval set: ``dataset`` (``image`` float32 (N, 3, H, W),
    ``label`` int32 (N,), N per device), ``image_count`` (its own rows first; the rest is the
    sampler's padding; None = all count) and the collectives that combine the shards
    (``src.utils.device``'s ``sum_ints_over_ranks``, ``broadcast_from_rank0``,
    ``sum_over_ranks``, ``all_gather_int`` for the failures, ``all_gather_rows`` for multi-label
    scores; None in one process)."""

    dataset: object
    image_count: int | None = None
    sum_over_ranks: Callable | None = None
    broadcast: Callable | None = None
    sum_arrays: Callable | None = None
    gather: Callable | None = None
    gather_rows: Callable | None = None


class EvalFailedOnRank(UserError):
    """The evaluation failed on another rank of data parallel (that rank's log names the
    error); ``exit_status`` is that rank's."""

    def __init__(self, message: str, exit_status: int):
        super().__init__(message)
        self.exit_status = exit_status


def shard_rows(total: int, num_shards: int, shard_id: int) -> tuple[int, int]:
    """(images of shard ``shard_id``, rows it reads) when MindSpore's
    ``DistributedSampler`` splits ``total`` images unshuffled: shard s reads s, s + num_shards,
    ..., padded from the start to the same row count."""
    return len(range(shard_id, total, num_shards)), math.ceil(total / num_shards)


def eval_shard(data_path: str, data_args: dict, num_shards: int | None = None,
               shard_id: int | None = None) -> EvalShard:
    """The eval set of this process: all of ``data_path``, or in data parallel
    (``num_shards`` > 1) shard ``shard_id`` with its image count and collectives.
    ``data_args``: ``create_dataset``'s keywords (``settings``, ``batch_size`` per device, ...;
    ``sampling`` without the shards).

    Raises:
        RuntimeError: If the sharded dataset has other rows than ``shard_rows`` expects.
    """
    if not num_shards or num_shards == 1:
        return EvalShard(create_dataset(data_path, **data_args))
    sampling = replace(data_args.get("sampling") or Sampling(), num_shards=num_shards,
                       shard_id=shard_id)
    dataset = create_dataset(data_path, **dict(data_args, sampling=sampling))
    total = count_images(data_path, is_training=False,
                         dataset=data_args.get("dataset", "imagefolder"),
                         indices=sampling.indices, labels=data_args.get("labels"))
    images, rows = shard_rows(total, num_shards, shard_id)
    batches = math.ceil(rows / data_args["batch_size"])
    if dataset.get_dataset_size() != batches:
        raise RuntimeError(f"eval shard {shard_id} of {num_shards} over {total} images has "
                           f"{dataset.get_dataset_size()} batches, expected {batches} "
                           f"({rows} rows): the sampler's sharding changed")
    return EvalShard(dataset, images, sum_ints_over_ranks, broadcast_from_rank0, sum_over_ranks,
                     all_gather_int, all_gather_rows)


class EvalCounts(NamedTuple):
    """What one network's evaluation counted on a shard (or summed over the shards):
    correct top-1 and top-k images, images, the sum of per-image eval losses, and the int64
    (K, K) confusion matrix (row = true class, column = top-1; None when not kept)."""

    top1: int
    topk: int
    images: int
    loss_sum: float
    confusion: np.ndarray | None = None


def step_outputs(run_context: RunContext, limit: int | None,
                 seen: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """An eval step's ``(loss (N,), logits, labels)`` as numpy arrays, and how many of its rows
    count: those before a shard's first ``limit`` rows are used up (``seen`` so far)."""
    outputs = run_context.original_args().net_outputs
    labels = outputs[2].asnumpy()
    keep = len(labels) if limit is None else max(0, min(len(labels), limit - seen))
    return outputs[0].asnumpy().reshape(-1), outputs[1].asnumpy(), labels, keep


class TopKCounter(Callback):
    """``Model.eval`` callback counting correct top-1 and top-k (as MindSpore's
    ``TopKCategoricalAccuracy``) and summing the per-image loss over the first ``limit`` rows
    (a shard's padding must not count), with ``class_num`` also the confusion matrix. Reads each
    step's ``(loss (N,), logits (N, C), label (N,))`` (``src.training.model``'s eval cells)."""

    def __init__(self, limit: int | None = None, k: int = 5, class_num: int | None = None):
        super().__init__()
        self.limit, self.k, self.class_num = limit, k, class_num
        self.on_eval_begin(None)

    def on_eval_begin(self, run_context: RunContext | None) -> None:
        self.top1 = self.topk = self.images = 0
        self.loss_sum = 0.0
        self.confusion = (None if self.class_num is None
                          else np.zeros((self.class_num, self.class_num), np.int64))

    def on_eval_step_end(self, run_context: RunContext) -> None:
        losses, logits, labels, keep = step_outputs(run_context, self.limit, self.images)
        ranked = np.argsort(-logits[:keep], axis=1)[:, :min(self.k, logits.shape[1])]
        hits = ranked == labels[:keep].reshape(-1, 1)
        self.top1 += int(hits[:, 0].sum())
        self.topk += int(hits.sum())
        self.loss_sum += float(losses[:keep].astype(np.float64).sum())
        if self.confusion is not None:
            np.add.at(self.confusion, (labels[:keep].astype(np.int64), ranked[:, 0]), 1)
        self.images += keep

    def counts(self) -> EvalCounts:
        """The counts so far (``EvalCounts``)."""
        return EvalCounts(self.top1, self.topk, self.images, self.loss_sum, self.confusion)


class Evaluator:
    """Evaluate the network being trained, ``net`` through ``model`` (outputs
    ``(loss, logits, label)``), and with ``ema`` its weight EMA through ``ema_model`` (a twin that
    gets the averages first) on ``shard``: top-1, top-5, mean eval loss, the same on every rank.
    ``confusion_of`` ("top1" or "ema_top1", with ``class_num``) keeps that network's confusion
    matrix of each evaluation in ``confusion``."""

    def __init__(self, model: Model, shard: EvalShard, net: nn.Cell, *,
                 ema: WeightEma | None = None, ema_model: Model | None = None,
                 class_num: int | None = None, confusion_of: str | None = None):
        self.model, self.shard, self.net = model, shard, net
        self.class_num = class_num
        self.confusion_of = confusion_of if class_num is not None else None
        self.confusion = None
        self.ema, self.ema_model = ema, ema_model

    def network(self, metric: str) -> nn.Cell:
        """The network ``metric`` measures: the live one for ``"top1"``, the one holding the
        EMA's averages (as last evaluated) for ``"ema_top1"``."""
        return self.ema_model.predict_network if metric == "ema_top1" else self.net

    def count(self, model: Model, confusion: bool = False) -> EvalCounts:
        """``EvalCounts`` of ``model`` on this process's shard (with the confusion matrix if
        ``confusion``)."""
        counter = TopKCounter(self.shard.image_count,
                              class_num=self.class_num if confusion else None)
        model.eval(self.shard.dataset, callbacks=[counter], dataset_sink_mode=False)
        return counter.counts()

    def agreed_count(self, model: Model, confusion: bool = False) -> EvalCounts:
        """``count``, its failure agreed over the ranks (one exchange): an exception on any
        rank raises on every rank, so none waits alone in the next collective; a failed rank
        raises its own (an undecodable image as ``ImageFolderError``), the others
        ``EvalFailedOnRank`` naming the lowest failed rank (docs/reliability.md)."""
        error, counts = None, None
        try:
            with readable_pipeline_errors():
                counts = self.count(model, confusion)
        except Exception as err:  # noqa: BLE001  re-raised below, after the exchange
            error = err
        if self.shard.gather is not None:
            status = getattr(error, "exit_status", 1) if error is not None else 0
            failed = [(rank, s) for rank, s in enumerate(self.shard.gather(status)) if s]
            if failed and error is None:
                raise EvalFailedOnRank(
                    f"evaluation failed on rank {failed[0][0]} (failed ranks: "
                    f"{', '.join(str(rank) for rank, _ in failed)}; the lowest one's log names "
                    f"the error): every rank stops", failed[0][1])
        if error is not None:
            raise error
        return counts

    def combine(self, runs: list[EvalCounts]) -> list[EvalCounts]:
        """``runs`` (this shard's ``EvalCounts``, one per network) summed over the ranks:
        counts exactly, loss sums and confusion matrices in one float32 all-reduce (exact
        below 2**24 images); unchanged in one process."""
        if self.shard.sum_over_ranks is None:
            return runs
        ints = self.shard.sum_over_ranks([v for c in runs for v in c[:3]])
        floats = [np.array([c.loss_sum for c in runs], np.float32)]
        floats += [c.confusion.astype(np.float32).ravel() for c in runs if c.confusion is not None]
        summed = self.shard.sum_arrays(np.concatenate(floats))
        tail, out = len(runs), []
        for i, c in enumerate(runs):
            confusion = None
            if c.confusion is not None:
                cells = c.confusion.size
                confusion = summed[tail:tail + cells].astype(np.int64).reshape(c.confusion.shape)
                tail += cells
            out.append(EvalCounts(*ints[3 * i:3 * i + 3], float(summed[i]), confusion))
        return out

    def rank0_statistics(self, network: nn.Cell) -> list[tuple[ms.Parameter, np.ndarray]]:
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

    def __call__(self) -> dict[str, float]:
        """Evaluate the network(s) now: ``{"top1", "top5", "eval_loss"[, "ema_top1",
        "ema_top5", "ema_eval_loss"], "eval_images"}`` over all ranks (losses per image); with
        ``confusion_of`` also sets ``confusion``."""
        changed = self.rank0_statistics(self.net)
        try:
            runs = [self.agreed_count(self.model, self.confusion_of == "top1")]
        finally:
            for param, value in changed:
                param.set_data(ms.Tensor(value))
        if self.ema is not None:
            averages = self.ema.by_network_name()
            for param in self.ema_model.predict_network.get_parameters():
                param.set_data(averages[param.name].value())
            self.rank0_statistics(self.ema_model.predict_network)
            runs.append(self.agreed_count(self.ema_model, self.confusion_of == "ema_top1"))
        combined = self.combine(runs)
        return dict(self.summarize(combined), eval_images=combined[0].images)

    def summarize(self, runs: list[EvalCounts]) -> dict[str, float]:
        """The result of the summed ``runs`` (live network, then the EMA's): top-1, top-5, mean
        eval loss (``ema_`` ones for the EMA); sets ``confusion``."""
        names = ("", "ema_")[:len(runs)]
        self.confusion = runs[-1 if self.confusion_of == "ema_top1" else 0].confusion
        result = {}
        for prefix, run in zip(names, runs):
            result.update({f"{prefix}top1": run.top1 / run.images,
                           f"{prefix}top5": run.topk / run.images,
                           f"{prefix}eval_loss": run.loss_sum / run.images})
        return result


class ScoreSet(NamedTuple):
    """What one network's multi-label evaluation kept on a shard (or gathered from all):
    sigmoid scores float32 (n, K), multi-hot targets float32 (n, K), images n, the sum of the
    per-image eval losses."""

    scores: np.ndarray
    targets: np.ndarray
    images: int
    loss_sum: float


class ScoreCollector(Callback):
    """``Model.eval`` callback keeping the sigmoid scores and targets of the first ``limit``
    rows (a shard's padding must not count) and summing their per-image losses. Reads each
    step's ``(loss (N,), logits (N, K), target (N, K))``."""

    def __init__(self, limit: int | None = None):
        super().__init__()
        self.limit = limit
        self.on_eval_begin(None)

    def on_eval_begin(self, run_context: RunContext | None) -> None:
        self.scores, self.targets, self.images, self.loss_sum = [], [], 0, 0.0

    def on_eval_step_end(self, run_context: RunContext) -> None:
        losses, logits, targets, keep = step_outputs(run_context, self.limit, self.images)
        self.scores.append(sigmoid(logits[:keep].astype(np.float32)))
        self.targets.append(targets[:keep].astype(np.float32))
        self.loss_sum += float(losses[:keep].astype(np.float64).sum())
        self.images += keep

    def counts(self) -> ScoreSet:
        """The scores so far (``ScoreSet``)."""
        classes = self.scores[0].shape[1] if self.scores else 0
        stack = lambda rows: (np.concatenate(rows) if rows  # noqa: E731
                              else np.zeros((0, classes), np.float32))
        return ScoreSet(stack(self.scores), stack(self.targets), self.images, self.loss_sum)


class MultiLabelEvaluator(Evaluator):
    """``Evaluator`` of a multi-label network (``task multilabel``): mAP (scikit-learn's
    macro average precision over the classes with a positive, ``src.utils.multilabel_metrics``)
    and mean eval loss; in data parallel the scores of every rank are gathered and mAP is
    computed once over the whole eval set (docs/multilabel.md)."""

    def count(self, model: Model, confusion: bool = False) -> ScoreSet:
        """``ScoreSet`` of ``model`` on this process's shard (no confusion matrix)."""
        collector = ScoreCollector(self.shard.image_count)
        model.eval(self.shard.dataset, callbacks=[collector], dataset_sink_mode=False)
        return collector.counts()

    def combine(self, runs: list[ScoreSet]) -> list[ScoreSet]:
        """``runs`` gathered from every rank (``gather_rows``); unchanged in one process."""
        if self.shard.gather_rows is None:
            return runs
        losses = self.shard.sum_arrays(np.array([r.loss_sum for r in runs], np.float32))
        out = []
        for run, loss_sum in zip(runs, losses):
            scores = self.shard.gather_rows(run.scores)
            targets = self.shard.gather_rows(run.targets)
            out.append(ScoreSet(scores, targets, len(scores), float(loss_sum)))
        return out

    def summarize(self, runs: list[ScoreSet]) -> dict[str, float]:
        """``mAP`` and ``eval_loss`` of the gathered ``runs`` (``ema_`` ones for the EMA)."""
        result = {}
        for prefix, run in zip(("", "ema_"), runs):
            result.update({f"{prefix}mAP": mean_average_precision(run.scores, run.targets),
                           f"{prefix}eval_loss": run.loss_sum / run.images})
        return result
