"""Dynamic batching for serve.py: the images of requests that arrive within ``max_wait_ms`` of
the first one waiting are run as one batch of at most ``max_batch_size`` images, in threads of
their own (never on the event loop), and each request gets its own rows back. A batch that
fails is run again one request at a time, so that only the request that fails gets the error.
See docs/serving.md#dynamic-batching.
"""
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

LOGGER = logging.getLogger(__name__)

Forward = Callable[[np.ndarray], np.ndarray]
"""float32 images (N, 3, H, W) -> float32 logits (N, K)."""


def bucket_sizes(max_batch_size: int) -> tuple[int, ...]:
    """The batch shapes a graph compiled per input shape (MindSpore) is run at: the powers of
    two below ``max_batch_size`` and ``max_batch_size`` itself, e.g. 12 -> (1, 2, 4, 8, 12)."""
    sizes = [1 << i for i in range(max_batch_size.bit_length()) if 1 << i < max_batch_size]
    return (*sizes, max_batch_size)


def padded_size(count: int, buckets: tuple[int, ...] | None) -> int:
    """The batch ``count`` images are run at: the smallest bucket that holds them (none: as
    many as they are; more than the largest: themselves, run in chunks by the forward)."""
    if not buckets:
        return count
    return next((size for size in buckets if size >= count), count)


@dataclass(eq=False)
class Job:
    """One request's images (n, 3, H, W) waiting in the queue; ``future`` gets its logits
    (n, K) or its error. ``arrived``: ``time.monotonic()`` when it was queued."""

    images: np.ndarray
    future: Future = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)


class BatchError(RuntimeError):
    """The model failed on a request's images (the message says how); other requests of its
    batch are answered."""


class DynamicBatcher:
    """A queue of requests and ``threads`` threads that each take a batch from it and run it.

    Args:
        forward: The model (``Forward``); called from the batcher's threads, one batch at a
            time per thread (``lock``: one at a time in all, for MindSpore).
        max_batch_size (int): Images per batch at most (a request of more runs alone).
        max_wait_ms (float): How long the first request of a batch waits for others, in ms
            from its arrival (0: a batch of what is queued at once).
        threads (int): Batches run at the same time.
        buckets (tuple[int, ...], optional): Batch sizes to pad batches to with zero images
            (``bucket_sizes``), for graphs compiled per shape; None: no padding.
        lock (threading.Lock, optional): Held while ``forward`` runs.
        on_batch (callable, optional): Called with each batch's image count (metrics).
    """

    def __init__(self, forward: Forward, *, max_batch_size: int, max_wait_ms: float,
                 threads: int = 1, buckets: tuple[int, ...] | None = None,
                 lock: "threading.Lock | None" = None,
                 on_batch: Callable[[int], None] | None = None) -> None:
        self.forward = forward
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.buckets = buckets
        self.lock = lock
        self.on_batch = on_batch or (lambda count: None)
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._held: Job | None = None  # taken from the queue but left for the next batch
        self._collecting = threading.Lock()
        self._waiting = 0  # images queued or held
        self._count_lock = threading.Lock()
        self._stopping = False
        self._threads = [threading.Thread(target=self._run, name=f"batcher-{i}", daemon=True)
                         for i in range(threads)]
        for thread in self._threads:
            thread.start()

    @property
    def queued_images(self) -> int:
        """Images waiting for a batch (metrics: queue length)."""
        return self._waiting

    def submit(self, images: np.ndarray) -> Future:
        """Queue a request's images, float32 (n, 3, H, W), n >= 1; the future gets its logits
        (n, K), or ``BatchError``. RuntimeError once ``stop`` was called."""
        if self._stopping:
            raise RuntimeError("the batcher is stopped")
        job = Job(images)
        self._count(len(images))
        self._queue.put(job)
        return job.future

    def stop(self, timeout: float | None = None) -> None:
        """Run what is queued, then end the threads (waiting ``timeout`` seconds at most)."""
        self._stopping = True
        for _ in self._threads:
            self._queue.put(None)
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _count(self, images: int) -> None:
        with self._count_lock:
            self._waiting += images

    def _next(self, timeout: float | None) -> Job | None:
        """The held job, else one from the queue (None: the stop mark); queue.Empty after
        ``timeout`` seconds (None: wait)."""
        if self._held is not None:
            job, self._held = self._held, None
            return job
        if timeout is not None and timeout <= 0:
            return self._queue.get_nowait()
        return self._queue.get(timeout=timeout)

    def _collect(self) -> list[Job] | None:
        """The next batch: the first job, then those that come before its wait ends, while
        the images fit in ``max_batch_size``; None at the stop mark."""
        with self._collecting:
            first = self._next(None)
            if first is None:
                return None
            batch, count = [first], len(first.images)
            deadline = first.arrived + self.max_wait
            while count < self.max_batch_size:
                try:
                    job = self._next(deadline - time.monotonic())
                except queue.Empty:
                    break
                if job is None:  # stop: let another thread see it, run this batch
                    self._queue.put(None)
                    break
                if count + len(job.images) > self.max_batch_size:
                    self._held = job
                    break
                batch.append(job)
                count += len(job.images)
        self._count(-count)
        return batch

    def _run(self) -> None:
        while True:
            batch = self._collect()
            if batch is None:
                return
            live = [job for job in batch if job.future.set_running_or_notify_cancel()]
            if live:
                self._answer(live)

    def _call(self, images: np.ndarray) -> np.ndarray:
        """``forward`` on ``images`` padded to their bucket (the padding's rows dropped)."""
        count = len(images)
        size = padded_size(count, self.buckets)
        if size > count:
            images = np.concatenate([images, np.zeros((size - count, *images.shape[1:]),
                                                      images.dtype)])
        if self.lock is None:
            return self.forward(images)[:count]
        with self.lock:
            return self.forward(images)[:count]

    def _answer(self, batch: list[Job]) -> None:
        """Run a batch and give each job its rows; if it fails, each job alone."""
        self.on_batch(sum(len(job.images) for job in batch))
        try:
            logits = self._call(np.concatenate([job.images for job in batch]))
        except Exception as err:  # noqa: BLE001  the model's own error types
            if len(batch) > 1:
                LOGGER.warning("a batch of %d requests failed (%s): running them one by one",
                               len(batch), err)
                for job in batch:
                    self._answer([job])
                return
            LOGGER.error("a request failed in the model: %s", err)
            batch[0].future.set_exception(BatchError(f"the model failed on this request: "
                                                     f"{str(err).splitlines()[0] or err}"))
            return
        start = 0
        for job in batch:
            job.future.set_result(logits[start:start + len(job.images)])
            start += len(job.images)
