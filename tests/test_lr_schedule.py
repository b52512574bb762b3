"""Per-step LR schedules."""
import math

import numpy as np
import pytest

from src.training.lr_schedule import (
    create_lr,
    scale_lr,
    warmup_cosine_lr,
    warmup_linear_lr,
    warmup_step_lr,
)


def test_cosine_length_warmup_peak_decay_end():
    peak, total, warmup = 0.512, 1000, 80
    lr = warmup_cosine_lr(peak, total, warmup, end_lr=0.0)
    assert lr.dtype == np.float32 and lr.shape == (total,)
    # warmup: linear, first step peak/W, last warmup step the peak
    np.testing.assert_allclose(lr[:warmup], peak * np.arange(1, warmup + 1) / warmup, rtol=1e-6)
    assert lr.max() == pytest.approx(peak, rel=1e-6)
    assert lr[warmup] == pytest.approx(peak, rel=1e-6)
    # strictly decreasing after the peak, ending just above 0
    assert np.all(np.diff(lr[warmup:]) < 0)
    expected_last = 0.5 * (1 + math.cos(math.pi * (total - warmup - 1) / (total - warmup))) * peak
    assert lr[-1] == pytest.approx(expected_last, rel=1e-5)
    assert 0 < lr[-1] < 1e-4 * peak


def test_cosine_end_lr_and_no_warmup():
    lr = warmup_cosine_lr(0.1, 100, 0, end_lr=0.01)
    assert lr[0] == pytest.approx(0.1)
    assert np.all(lr >= 0.01) and lr[-1] == pytest.approx(0.01, abs=1e-4)


def test_linear_and_step():
    lin = warmup_linear_lr(1.0, 100, 10, end_lr=0.0)
    assert lin.shape == (100,) and lin[9] == pytest.approx(1.0)
    assert np.all(np.diff(lin[10:]) < 0)
    step = warmup_step_lr(1.0, 100, 0, steps_per_epoch=10, decay_epochs=[3, 6], decay_factor=0.1)
    np.testing.assert_allclose(step[[0, 29, 30, 59, 60, 99]], [1, 1, 0.1, 0.1, 0.01, 0.01],
                               rtol=1e-6)


def test_bad_step_counts_raise():
    with pytest.raises(ValueError, match="total_steps"):
        warmup_cosine_lr(0.1, 0, 0)
    with pytest.raises(ValueError, match="warmup_steps"):
        warmup_cosine_lr(0.1, 10, 11)


def test_linear_scaling_with_global_batch():
    assert scale_lr(0.256, 2048, 256) == pytest.approx(2.048)
    lr, peak = create_lr("cosine", 0.256, 256, global_batch_size=512, epoch_size=2,
                         steps_per_epoch=5, warmup_epochs=1)
    assert peak == pytest.approx(0.512) and lr.shape == (10,) and lr.max() == pytest.approx(0.512)
