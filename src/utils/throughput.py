"""Throughput mode (``--benchmark_steps N``): N steps timed on one synthetic batch kept on the
device, as NVIDIA's ``--mode benchmark_training``; see docs/speed.md#speed-on-every-backend."""
import statistics
import time
from collections.abc import Callable

import mindspore as ms
import numpy as np

WARMUP_STEPS = 2


def synthetic_batch(batch_size: int, image_size: int, class_num: int,
                    soft_targets: bool = False, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A fixed random batch: images float32 (N, 3, S, S), standard normal; labels int32 (N,)
    in [0, class_num), or with ``soft_targets`` one-hot float32 (N, class_num)."""
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((batch_size, 3, image_size, image_size)).astype(np.float32)
    labels = rng.integers(0, class_num, batch_size).astype(np.int32)
    if soft_targets:
        labels = np.eye(class_num, dtype=np.float32)[labels]
    return images, labels


def time_calls(call: Callable[[], object], steps: int,
               warmup: int = WARMUP_STEPS) -> tuple[list[float], list[float]]:
    """Seconds of each warmup call, then of each timed call, of ``call`` (which must block
    until its result exists). Raises ValueError if ``steps`` < 1."""
    if steps < 1:
        raise ValueError(f"benchmark_steps must be >= 1, got {steps}")
    seconds = []
    for _ in range(warmup + steps):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return seconds[:warmup], seconds[warmup:]


def throughput_report(kind: str, images_per_step: int, device_num: int,
                      warmup_s: list[float], timed_s: list[float]) -> tuple[dict, str]:
    """The figures of a throughput run (img/s per device and global from the median step time,
    ms per step) as a record and a one-line summary; ``kind`` is ``train`` or ``eval``,
    ``images_per_step`` per device."""
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


def as_tensors(*arrays: np.ndarray) -> tuple[ms.Tensor, ...]:
    """numpy arrays -> MindSpore Tensors (placed on the device at the first call)."""
    return tuple(ms.Tensor(a) for a in arrays)
