"""Throughput mode (--benchmark_steps): train.py and eval.py time steps on synthetic data,
print img/s per device and global, read no data and write nothing."""
import json
import os

import numpy as np
import pytest

from src.utils.throughput import synthetic_batch, throughput_report, time_calls
from tests.helpers import run_in_process

QUICK = ["--config_path", "configs/quick_start.yaml", "--batch_size", "8", "--benchmark_steps",
         "3"]


def record_of(stdout):
    lines = [line for line in stdout.splitlines() if line.startswith('{"mode"')]
    assert len(lines) == 1, stdout[-2000:]
    return json.loads(lines[0])


# train.py times the recipe's own step: with 2 accumulated micro-batches, 16 images per step
RECIPE = ["--grad_accumulation_steps", "2", "--mixup_alpha", "0.2", "--ema_decay", "0.99"]


@pytest.mark.slow
@pytest.mark.parametrize("script, kind, extra, images", [
    ("train.py", "train", RECIPE, 16), ("eval.py", "eval", [], 8),
    # multi-label: multi-hot float targets, the task's own loss (bce unless set)
    ("train.py", "train", ["--task", "multilabel", "--grad_accumulation_steps", "2"], 16)])
def test_benchmark_steps_prints_throughput_and_writes_nothing(script, kind, extra, images,
                                                              tmp_path):
    out = tmp_path / "out"
    result = run_in_process(script, *QUICK, *extra, "--data_path", tmp_path / "no_such_folder",
                            "--output_dir", out)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    record = record_of(result.stdout)
    assert record["mode"] == f"benchmark_{kind}" and record["steps"] == 3
    assert record["images_per_step"] == images and record["img_per_s_per_device"] > 0
    if kind == "train":  # every timed and warmup step a whole optimizer step (2 calls each)
        assert record["optimizer_steps"] == record["warmup_steps"] + 3
    assert record["img_per_s_global"] == record["img_per_s_per_device"]  # one device
    assert f"{kind} throughput:" in result.stdout
    assert os.listdir(tmp_path) == []  # no output folder, no checkpoint, no log


def test_report_uses_the_median_and_scales_by_devices():
    record, line = throughput_report("train", 32, 8, [5.0, 0.3], [0.1, 0.2, 0.4])
    assert record["ms_per_step_median"] == 200.0
    assert record["img_per_s_per_device"] == 160.0 and record["img_per_s_global"] == 1280.0
    assert record["warmup_steps"] == 2 and record["warmup_s"] == 5.3
    assert "160.0 img/s per device, 1280.0 img/s global (8 devices)" in line


def test_time_calls_leaves_out_the_warmup_calls():
    calls = []
    warmup, timed = time_calls(lambda: calls.append(1), 4, warmup=2)
    assert len(calls) == 6 and len(warmup) == 2 and len(timed) == 4
    with pytest.raises(ValueError, match="benchmark_steps"):
        time_calls(lambda: None, 0)


def test_synthetic_batch_shapes_and_soft_targets():
    images, labels = synthetic_batch(4, 32, 10)
    assert images.shape == (4, 3, 32, 32) and images.dtype == np.float32
    assert labels.dtype == np.int32 and labels.min() >= 0 and labels.max() < 10
    _, soft = synthetic_batch(4, 32, 10, soft_targets=True)
    assert soft.shape == (4, 10) and np.allclose(soft.sum(axis=1), 1.0)
