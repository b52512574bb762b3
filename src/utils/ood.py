"""Out-of-distribution ("none of these") scores of a single-label classifier's raw logits,
higher = more in-distribution: maximum softmax probability (Hendrycks & Gimpel 2017), energy
(Liu et al. 2020, T = 1: logsumexp of the logits) and max logit (Hendrycks et al. 2022); how
well a score separates in-distribution images (the positives) from unknown ones (AUROC, AUPR,
FPR at a TPR); the threshold that keeps a share of in-distribution images, and the images a
model's recorded threshold marks unknown. numpy only. See docs/ood.md.
"""
import math

import numpy as np

from src.utils.multilabel_metrics import average_precisions, ranked_counts
from src.utils.tasks import softmax

OOD_SCORES = ("msp", "energy", "max_logit")
"""The scores, in the order of ``all_scores``'s columns (config.yaml's ``ood_score``)."""
REPORTED_TPR = 0.95  # FPR is reported at this TPR (the literature's FPR95)


def logsumexp(logits: np.ndarray) -> np.ndarray:
    """log(sum(exp(x))) of each row of float (N, K), without overflow; float64 (N,)."""
    x = np.asarray(logits, np.float64)
    top = x.max(axis=1)
    return top + np.log(np.exp(x - top[:, None]).sum(axis=1))


def all_scores(logits: np.ndarray) -> np.ndarray:
    """The three scores of each image's raw logits (no calibration temperature).

    Args:
        logits (numpy.ndarray): float (N, K).

    Returns:
        numpy.ndarray: float64 (N, 3), columns in ``OOD_SCORES`` order: max softmax
        probability in [1/K, 1], energy score logsumexp(logits) (the negated free energy of
        Liu et al. with T = 1), max logit.
    """
    x = np.asarray(logits, np.float64)
    return np.stack([softmax(x).max(axis=1), logsumexp(x), x.max(axis=1)], axis=1)


def score_of(logits: np.ndarray, name: str) -> np.ndarray:
    """The score ``name`` (one of ``OOD_SCORES``) of each image's logits (N, K); float64 (N,)."""
    return all_scores(logits)[:, OOD_SCORES.index(name)]


def _roc(inside: np.ndarray, outside: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(thresholds, TPR, FPR) at each distinct score, highest first (in-distribution positive)."""
    inside, outside = np.asarray(inside, np.float64), np.asarray(outside, np.float64)
    if not len(inside) or not len(outside):
        raise ValueError(f"{len(inside)} in-distribution and {len(outside)} out-of-distribution "
                         f"scores: both need at least one")
    if not (np.isfinite(inside).all() and np.isfinite(outside).all()):
        raise ValueError("scores hold NaN or infinite values")
    scores = np.concatenate([inside, outside])
    positive = np.r_[np.ones(len(inside), bool), np.zeros(len(outside), bool)]
    thresholds, true, false = ranked_counts(scores, positive)
    return thresholds, true / len(inside), false / len(outside)


def separation(inside: np.ndarray, outside: np.ndarray) -> dict:
    """How well a score separates in-distribution images (positive) from unknown ones.

    Args:
        inside, outside (numpy.ndarray): float (N,) and (M,) scores, higher = in-distribution.

    Returns:
        dict: ``auroc`` (area under the ROC curve, ties half: scikit-learn's
        ``roc_auc_score``), ``fpr_at_95_tpr`` (the share of unknown images kept at the
        highest threshold keeping ``REPORTED_TPR`` of the in-distribution ones) and ``aupr``
        (average precision, scikit-learn's ``average_precision_score``), floats.

    Raises:
        ValueError: If a side is empty or a score is not finite.
    """
    _, tpr, fpr = _roc(inside, outside)
    tpr0, fpr0 = np.r_[0.0, tpr], np.r_[0.0, fpr]
    labels = np.r_[np.ones(len(inside)), np.zeros(len(outside))]
    aupr = average_precisions(np.r_[inside, outside][:, None], labels[:, None])[0]
    return {"auroc": float(np.sum(np.diff(fpr0) * (tpr0[1:] + tpr0[:-1]) / 2)),
            "fpr_at_95_tpr": float(fpr[np.searchsorted(tpr, kept(REPORTED_TPR, len(inside))
                                                       / len(inside))]),
            "aupr": float(aupr)}


def kept(tpr: float, count: int) -> int:
    """The fewest of ``count`` images that make a share of at least ``tpr`` (in (0, 1])."""
    return max(1, math.ceil(round(tpr * count, 9)))


def threshold_for_tpr(scores: np.ndarray, tpr: float) -> float:
    """The highest threshold t that keeps at least ``tpr`` of ``scores`` (score >= t): the
    ceil(tpr * N)-th highest score.

    Args:
        scores (numpy.ndarray): float (N,) in-distribution scores, N >= 1.
        tpr (float): The share kept, in (0, 1).

    Raises:
        ValueError: If ``scores`` is empty or not finite, or ``tpr`` is not in (0, 1).
    """
    scores = np.asarray(scores, np.float64)
    if not 0 < tpr < 1:
        raise ValueError(f"tpr must be in (0, 1), got {tpr}")
    if not len(scores) or not np.isfinite(scores).all():
        raise ValueError(f"{len(scores)} scores: need at least one, all finite")
    return float(np.sort(scores)[::-1][kept(tpr, len(scores)) - 1])


def unknown_marks(logits: np.ndarray, score: str | None,
                  threshold: float | None) -> list[dict] | None:
    """Each image's ``unknown`` mark under a model's recorded ``ood_score`` and
    ``ood_threshold`` (unknown: ``score`` below ``threshold``), from its raw logits (N, K).

    Returns:
        list[dict] | None: Per image ``unknown`` (bool) and ``ood`` (``score``: the name,
        ``value`` rounded to 6 decimals, ``threshold``); None when no threshold is recorded.
    """
    if threshold is None or score is None:
        return None
    return [{"unknown": bool(v < threshold),
             "ood": {"score": score, "value": round(float(v), 6), "threshold": threshold}}
            for v in score_of(logits, score)]
