"""Throughput mode (``--benchmark_steps N`` of train.py and eval.py): time N steps on
synthetic data, without a dataset, as NVIDIA's ``--mode benchmark_training`` and ModelZoo's
GPU benchmark script do. What a user runs first on a new machine.

The synthetic batch is created once and stays on the device, so the figure is the step's
speed alone (no decoding, no host-to-device copies); the first ``warmup`` calls (graph
compilation, memory allocation) are timed but left out of the figure.
"""
import statistics
import time

import mindspore as ms
import numpy as np

WARMUP_STEPS = 2


def synthetic_batch(batch_size, image_size, class_num, soft_targets=False, seed=0):
    """A fixed random batch: images float32 (batch_size, 3, image_size, image_size), standard
    normal (as normalized images); labels int32 (batch_size,) in [0, class_num), or with
    ``soft_targets`` float32 (batch_size, class_num) rows summing to 1 (as mixup/cutmix give).

    Returns:
        tuple(numpy.ndarray, numpy.ndarray): images, labels.
    """
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((batch_size, 3, image_size, image_size)).astype(np.float32)
    labels = rng.integers(0, class_num, batch_size).astype(np.int32)
    if soft_targets:
        labels = np.eye(class_num, dtype=np.float32)[labels]
    return images, labels


def time_calls(call, steps, warmup=WARMUP_STEPS):
    """Seconds of each of ``warmup + steps`` calls of ``call`` (which must block until its
    result exists, e.g. by reading it back).

    Returns:
        tuple(list[float], list[float]): warmup seconds, timed seconds.

    Raises:
        ValueError: If ``steps`` < 1.
    """
    if steps < 1:
        raise ValueError(f"benchmark_steps must be >= 1, got {steps}")
    seconds = []
    for _ in range(warmup + steps):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return seconds[:warmup], seconds[warmup:]


def throughput_report(kind, images_per_step, device_num, warmup_s, timed_s):
    """The figures of a throughput run, as a dict and a one-line summary.

    Args:
        kind (str): ``train`` or ``eval``.
        images_per_step (int): Images one device processes per timed call.
        device_num (int): Devices running in data parallel (global = per device x this).
        warmup_s (list[float]): Seconds of the calls left out (compilation first).
        timed_s (list[float]): Seconds of the timed calls.

    Returns:
        tuple(dict, str): ``img_per_s_per_device`` and ``img_per_s_global`` (from the median
        step time), ``ms_per_step_median``/``min``/``max``, ``steps``, ``warmup_steps``,
        ``warmup_s``; and the summary line.
    """
    median = statistics.median(timed_s)
    per_device = images_per_step / median
    record = {"mode": f"benchmark_{kind}", "steps": len(timed_s), "warmup_steps": len(warmup_s),
              "warmup_s": round(sum(warmup_s), 3), "images_per_step": images_per_step,
              "device_num": device_num, "ms_per_step_median": round(median * 1e3, 3),
              "ms_per_step_min": round(min(timed_s) * 1e3, 3),
              "ms_per_step_max": round(max(timed_s) * 1e3, 3),
              "img_per_s_per_device": round(per_device, 2),
              "img_per_s_global": round(per_device * device_num, 2)}
    line = (f"{kind} throughput: {per_device:.1f} img/s per device, "
            f"{per_device * device_num:.1f} img/s global ({device_num} device"
            f"{'s' if device_num > 1 else ''}); {median * 1e3:.1f} ms per step of "
            f"{images_per_step} images (median of {len(timed_s)} steps after {len(warmup_s)} "
            f"warmup steps incl. compilation, {sum(warmup_s):.1f} s); synthetic data")
    return record, line


def as_tensors(*arrays):
    """numpy arrays -> MindSpore Tensors (placed on the device at the first call)."""
    return tuple(ms.Tensor(a) for a in arrays)
