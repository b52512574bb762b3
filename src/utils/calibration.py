"""Calibration of single-label (softmax) classifiers: temperature scaling, one T > 0 fitted by
the negative log-likelihood of softmax(logits / T) (Guo et al. 2017, arXiv:1706.04599, 4.2),
and the measures of calibration: the expected calibration error over 15 equal-width bins of
the top-1 confidence (Guo et al.'s ECE) and over equal-mass bins (adaptive ECE), the
reliability bins they sum, the NLL and the multi-class Brier score (Brier 1950). numpy and
scipy, float64 inside. See docs/calibration.md.
"""
import math

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

from src.utils.errors import UserError

ECE_BINS = 15
"""Bins of the ECE and the reliability diagram (Guo et al.'s M = 15)."""
TEMPERATURE_RANGE = (1e-2, 1e2)
"""The temperatures searched (the fit is over log T in this range)."""


class CalibrationError(UserError, ValueError):
    """Calibration cannot be done on the data given (too few images, labels out of range)."""


def _checked(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    logits = np.asarray(logits, np.float64)
    labels = np.asarray(labels).astype(np.int64).reshape(-1)
    if logits.ndim != 2 or len(logits) != len(labels):
        raise ValueError(f"expected logits (N, K) and N labels, got {logits.shape} and "
                         f"{labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= logits.shape[1]):
        raise CalibrationError(f"labels must be class indices in 0..{logits.shape[1] - 1}, got "
                               f"{labels.min()}..{labels.max()}")
    return logits, labels


def log_probabilities(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """log softmax(logits / temperature), float64 (N, K)."""
    return log_softmax(np.asarray(logits, np.float64) / temperature, axis=1)


def nll(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood (nats) of the true classes under softmax(logits / T).

    Args:
        logits (numpy.ndarray): (N, K). labels (numpy.ndarray): int (N,), class indices.
        temperature (float): T > 0.
    """
    logits, labels = _checked(logits, labels)
    return float(-log_probabilities(logits, temperature)[np.arange(len(labels)), labels].mean())


def brier_score(probs: np.ndarray, labels: np.ndarray) -> float:
    """Multi-class Brier score: the mean over images of sum_k (p_k - [k = label])^2, in
    [0, 2] (Brier 1950; twice scikit-learn's binary ``brier_score_loss`` at K = 2)."""
    probs, labels = _checked(probs, labels)
    squared = np.square(probs)
    rows = np.arange(len(labels))
    squared[rows, labels] = np.square(probs[rows, labels] - 1.0)
    return float(squared.sum(axis=1).mean())


def reliability_bins(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS, *,
                     equal_mass: bool = False) -> list[dict]:
    """The reliability bins of top-1 confidences: equal-width bins ((m-1)/M, m/M] of [0, 1]
    (Guo et al.; a confidence of 0 falls in the first), or, ``equal_mass``, the images sorted
    by confidence (stable) and cut into ``bins`` runs of floor or ceil(N / bins) images
    (``numpy.array_split``: the longer runs first).

    Args:
        confidence (numpy.ndarray): (N,) top-1 probabilities in [0, 1].
        correct (numpy.ndarray): (N,) bool, top-1 right.

    Returns:
        list[dict]: One per bin: ``lower``, ``upper`` (equal mass: its lowest and highest
        confidence), ``images``, ``confidence`` (mean), ``accuracy``; empty bins have None
        for the means (equal width) or are left out (equal mass with N < bins).
    """
    confidence = np.asarray(confidence, np.float64).reshape(-1)
    correct = np.asarray(correct, bool).reshape(-1)
    if equal_mass:
        order = np.argsort(confidence, kind="stable")
        groups = [g for g in np.array_split(order, bins) if len(g)]
        edges = [(float(confidence[g].min()), float(confidence[g].max())) for g in groups]
    else:
        upper = np.arange(1, bins + 1) / bins  # m / M, correctly rounded
        index = np.minimum(np.searchsorted(upper, confidence, side="left"), bins - 1)
        groups = [np.flatnonzero(index == m) for m in range(bins)]
        edges = [(m / bins, (m + 1) / bins) for m in range(bins)]
    return [{"lower": lower, "upper": upper, "images": int(len(g)),
             "confidence": float(confidence[g].mean()) if len(g) else None,
             "accuracy": float(correct[g].mean()) if len(g) else None}
            for g, (lower, upper) in zip(groups, edges)]


def expected_calibration_error(confidence: np.ndarray, correct: np.ndarray,
                               bins: int = ECE_BINS, *, equal_mass: bool = False) -> float:
    """sum over bins of (images in bin / N) * |accuracy - mean confidence| of
    ``reliability_bins``, in [0, 1]; 0.0 for no images."""
    total = len(np.asarray(confidence).reshape(-1))
    return float(sum(b["images"] / total * abs(b["accuracy"] - b["confidence"])
                     for b in reliability_bins(confidence, correct, bins, equal_mass=equal_mass)
                     if b["images"])) if total else 0.0


def calibration_scores(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0,
                       bins: int = ECE_BINS) -> dict:
    """The calibration of softmax(logits / T) on labelled images.

    Returns:
        dict: ``temperature``, ``ece`` and ``adaptive_ece`` (``bins`` equal-width / equal-mass
        bins), ``nll`` (nats), ``brier``, ``top1`` (fractions), and ``reliability``:
        the equal-width ``reliability_bins``.
    """
    logits, labels = _checked(logits, labels)
    probs = np.exp(log_probabilities(logits, temperature))
    confidence = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    return {"temperature": float(temperature),
            "ece": expected_calibration_error(confidence, correct, bins),
            "adaptive_ece": expected_calibration_error(confidence, correct, bins,
                                                       equal_mass=True),
            "nll": nll(logits, labels, temperature), "brier": brier_score(probs, labels),
            "top1": float(correct.mean()),
            "reliability": reliability_bins(confidence, correct, bins)}


def check_fit_images(images: int, classes: int) -> None:
    """Raise ``CalibrationError`` for fewer ``images`` than ``classes`` (at least one per
    class to fit a temperature on; names both counts)."""
    if images < classes:
        raise CalibrationError(f"{images} images cannot fit a temperature for {classes} "
                               f"classes: give at least {classes} (one per class), better "
                               f"hundreds")


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> tuple[float, bool]:
    """The temperature T minimizing ``nll(logits, labels, T)``: bounded Brent search over
    log T in ``TEMPERATURE_RANGE`` (scipy's ``minimize_scalar``; the NLL is convex in 1/T, so
    unimodal in log T), to a relative 1e-6 of T.

    Args:
        logits (numpy.ndarray): (N, K) of N >= K images. labels (numpy.ndarray): int (N,).

    Returns:
        tuple(float, bool): T, and whether it lies at an end of the range (the NLL still
        falling there: e.g. every image right, or a model no better than chance).

    Raises:
        CalibrationError: For fewer images than classes (names both counts).
    """
    logits, labels = _checked(logits, labels)
    check_fit_images(*logits.shape)
    low, high = (math.log(t) for t in TEMPERATURE_RANGE)
    found = minimize_scalar(lambda log_t: nll(logits, labels, math.exp(log_t)),
                            bounds=(low, high), method="bounded", options={"xatol": 1e-6})
    log_t = float(found.x)
    at_end = min(log_t - low, high - log_t) < 1e-3
    return math.exp(log_t), at_end
