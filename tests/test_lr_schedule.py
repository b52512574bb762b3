"""Per-step LR schedules."""
import math

import numpy as np
import pytest

from src.training.lr_schedule import (
    create_lr,
    scale_lr,
    warmup_cosine_lr,
    warmup_linear_lr,
    warmup_poly_lr,
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
    lr, peak = create_lr(lr_schedule="cosine", base_lr=0.256, base_lr_batch_size=256,
                         global_batch_size=512, epoch_size=2, steps_per_epoch=5, warmup_epochs=1)
    assert peak == pytest.approx(0.512) and lr.shape == (10,) and lr.max() == pytest.approx(0.512)


def mlperf_poly(step, peak, total, warmup, end, power):
    """The MLPerf reference's ``PolynomialDecayWithWarmup`` at its 0-based ``step``
    (mlcommons/training retired_benchmarks/resnet-tf2/tensorflow2/lars_util.py): step <= W:
    peak * step / W, else Keras ``PolynomialDecay(peak, D, end, power)`` at step - W with
    D = total - W + 1."""
    if step <= warmup:
        return peak * step / warmup
    decay_steps = total - warmup + 1
    t = min(step - warmup, decay_steps)
    return (peak - end) * (1 - t / decay_steps) ** power + end


@pytest.mark.parametrize("warmup, end, power", [(45, 1e-4, 2.0), (45, 0.0, 1.5), (1, 0.3, 2.0)])
def test_poly_equals_its_formula_at_every_step(warmup, end, power):
    """Every step: warmup peak * (s + 1) / W, then end + (peak - end) * (1 - (s - W) / (T - W +
    1)) ** power; the decay is the MLPerf reference's at the same step, the warmup the
    reference's one step later (the reference's first step has LR 0)."""
    peak, total = 10.0, 420
    lr = warmup_poly_lr(peak, total, warmup, end_lr=end, power=power)
    assert lr.dtype == np.float32 and lr.shape == (total,)
    formula = [peak * (s + 1) / warmup if s < warmup else
               end + (peak - end) * (1 - (s - warmup) / (total - warmup + 1)) ** power
               for s in range(total)]
    np.testing.assert_allclose(lr, formula, rtol=1e-6)
    reference = [mlperf_poly(s if s >= warmup else s + 1, peak, total, warmup, end, power)
                 for s in range(total)]
    np.testing.assert_allclose(lr, reference, rtol=1e-6)
    assert lr[warmup] == pytest.approx(peak) and lr[-1] > end


def test_poly_without_warmup_and_through_create_lr():
    lr = warmup_poly_lr(2.0, 9, 0, end_lr=0.0, power=2.0)
    np.testing.assert_allclose(lr, [2.0 * (1 - t / 10) ** 2 for t in range(9)], rtol=1e-6)
    lr, peak = create_lr(lr_schedule="poly", base_lr=10.0, base_lr_batch_size=4096,
                         global_batch_size=8192, epoch_size=4, steps_per_epoch=10, warmup_epochs=1,
                         lr_end=1e-4, lr_poly_power=3.0)
    assert peak == pytest.approx(20.0)
    np.testing.assert_allclose(lr, warmup_poly_lr(20.0, 40, 10, 1e-4, 3.0), rtol=0)
    with pytest.raises(ValueError, match="lr_poly_power must be > 0, got 0"):
        warmup_poly_lr(1.0, 10, 2, power=0)
