"""CrossEntropySmooth against a NumPy formula (PyTorch's label-smoothing convention)."""
import mindspore as ms
import numpy as np
import pytest

from src.loss import CrossEntropySmooth


def numpy_smoothed_ce(logits, labels, eps):
    k = logits.shape[1]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    target = np.full_like(logits, eps / k)
    target[np.arange(len(labels)), labels] += 1.0 - eps
    return float(-(target * log_probs).sum(axis=1).mean())


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_matches_numpy_formula(eps):
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((16, 10)) * 3).astype(np.float32)
    labels = rng.integers(0, 10, 16).astype(np.int32)
    loss = CrossEntropySmooth(eps, 10)(ms.Tensor(logits), ms.Tensor(labels))
    assert float(loss.asnumpy()) == pytest.approx(numpy_smoothed_ce(logits, labels, eps), rel=1e-5)


def test_eps_zero_is_plain_softmax_cross_entropy():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((8, 5)).astype(np.float32)
    labels = rng.integers(0, 5, 8).astype(np.int32)
    ours = CrossEntropySmooth(0.0, 5)(ms.Tensor(logits), ms.Tensor(labels))
    plain = ms.nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")(
        ms.Tensor(logits), ms.Tensor(labels))
    assert float(ours.asnumpy()) == pytest.approx(float(plain.asnumpy()), rel=1e-6)


def test_differs_from_modelzoo_eps_over_k_minus_1():
    logits = np.array([[2.0, 0.5, -1.0]], np.float32)
    labels = np.array([0], np.int32)
    ours = float(CrossEntropySmooth(0.1, 3)(ms.Tensor(logits), ms.Tensor(labels)).asnumpy())
    log_p = logits[0] - np.log(np.exp(logits[0]).sum())
    modelzoo = -(0.9 * log_p[0] + 0.05 * log_p[1] + 0.05 * log_p[2])
    assert ours == pytest.approx(numpy_smoothed_ce(logits, labels, 0.1), rel=1e-5)
    assert abs(ours - modelzoo) > 1e-3


def test_bad_arguments():
    with pytest.raises(ValueError, match="smooth_factor"):
        CrossEntropySmooth(1.0, 10)
    with pytest.raises(ValueError, match="class_num"):
        CrossEntropySmooth(0.1, 0)
