"""Multi-label metrics on (N, K) scores and multi-hot targets (numpy only): average precision
per class and its mean (mAP), precision / recall / F1 at decision thresholds, the exact-match
ratio, and per-class thresholds that maximize F1.

Definitions as scikit-learn's ``average_precision_score`` and
``precision_recall_fscore_support(zero_division=0)``, except that a class with no positive has
no AP (NaN) and is left out of mAP. See docs/multilabel.md#metrics.
"""
import numpy as np

DEFAULT_THRESHOLD = 0.5  # a label is predicted when its score is >= its threshold


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Element-wise logistic function of a float array, in its dtype, without overflow: the
    multi-label scores of logits (training's evaluator, eval.py, predict.py)."""
    logits = np.asarray(logits)
    exp = np.exp(-np.abs(logits))
    return np.where(logits >= 0, 1 / (1 + exp), exp / (1 + exp)).astype(logits.dtype)


def checked(scores: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``scores`` as an (N, K) float array and ``targets`` as an (N, K) bool array.

    Raises:
        ValueError: If the shapes differ or are not 2-D, a score is not finite, or a target
            is not 0 or 1.
    """
    scores, targets = np.asarray(scores), np.asarray(targets)
    if scores.ndim != 2 or scores.shape != targets.shape:
        raise ValueError(f"scores {scores.shape} and targets {targets.shape} must both be "
                         f"(images, classes)")
    if not np.issubdtype(scores.dtype, np.floating):
        scores = scores.astype(np.float64)
    if not np.isfinite(scores).all():
        raise ValueError("scores hold NaN or infinite values")
    if not ((targets == 0) | (targets == 1)).all():
        raise ValueError("targets must be multi-hot (0 or 1)")
    return scores, targets.astype(bool)


def ranked_counts(score: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, ...]:
    """One class's distinct scores, highest first, and at each the true and false positives
    of predicting every image scoring at least that much (tied scores are one threshold).

    Returns:
        (thresholds (M,), true positives (M,) int64, false positives (M,) int64).
    """
    order = np.argsort(-score, kind="stable")
    score, positive = score[order], positive[order]
    last = np.r_[np.flatnonzero(np.diff(score)), len(score) - 1]  # last image of each tie
    true = np.cumsum(positive, dtype=np.int64)[last]
    return score[last], true, last + 1 - true


def precision_recall_points(score: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, ...]:
    """One class's precision-recall curve: at each distinct score, highest first, the recall
    and precision of predicting every image scoring at least that much.

    Args:
        score: (N,) float; positive: (N,) bool with at least one True.

    Returns:
        (recall (M,), precision (M,)) float64, recall rising to 1.
    """
    _, true, false = ranked_counts(score, positive)
    return true / true[-1], true / (true + false)


def average_precisions(scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Average precision of each class: sum over distinct thresholds of (R_n - R_{n-1}) P_n
    (scikit-learn's ``average_precision_score``, ties one threshold).

    Args:
        scores: (N, K) float, higher = more likely.
        targets: (N, K) multi-hot (0/1).

    Returns:
        float64 (K,); NaN for a class with no positive (scikit-learn gives 0.0 and warns).
    """
    scores, targets = checked(scores, targets)
    result = np.full(scores.shape[1], np.nan)
    for k in np.flatnonzero(targets.any(axis=0)):
        recall, precision = precision_recall_points(scores[:, k], targets[:, k])
        result[k] = np.sum(np.diff(recall, prepend=0.0) * precision)
    return result


def mean_average_precision(scores: np.ndarray, targets: np.ndarray) -> float:
    """mAP: the mean of ``average_precisions`` over the classes with a positive; NaN if none."""
    return mean_of_known(average_precisions(scores, targets))


def mean_of_known(ap: np.ndarray) -> float:
    """The mean of the APs that are not NaN (mAP from ``average_precisions``); NaN if none."""
    known = ap[~np.isnan(ap)]
    return float(known.mean()) if known.size else float("nan")


def ratio(top: np.ndarray, bottom: np.ndarray) -> np.ndarray:
    """``top / bottom`` as float64, 0.0 where ``bottom`` is 0 (``zero_division=0``)."""
    top, bottom = np.asarray(top, np.float64), np.asarray(bottom, np.float64)
    return np.divide(top, bottom, out=np.zeros_like(top), where=bottom > 0)


def decisions(scores: np.ndarray, thresholds: np.ndarray | float) -> np.ndarray:
    """The labels predicted: bool (N, K), True iff a score is >= its class's threshold.

    Raises:
        ValueError: If ``thresholds`` is neither one value nor (K,).
    """
    thresholds = np.asarray(thresholds)
    if thresholds.ndim > 1 or thresholds.size not in (1, scores.shape[1]):
        raise ValueError(f"thresholds {thresholds.shape}: expected one or {scores.shape[1]}")
    return scores >= thresholds


def threshold_metrics(scores: np.ndarray, targets: np.ndarray,
                      thresholds: np.ndarray | float = DEFAULT_THRESHOLD) -> dict:
    """Precision, recall and F1 per class, their macro and micro means, and the exact-match
    ratio of the labels predicted at ``thresholds`` (a label is predicted iff score >= its
    threshold).

    Args:
        scores: (N, K) float.
        targets: (N, K) multi-hot.
        thresholds: One for all classes, or (K,).

    Returns:
        ``precision``, ``recall``, ``f1`` float64 (K,), ``support`` int64 (K,) positives,
        ``exact_match`` (share of images whose K decisions are all right), ``macro_*`` (mean
        over all K classes) and ``micro_*`` (of the counts summed over classes) floats.
    """
    scores, targets = checked(scores, targets)
    predicted = decisions(scores, thresholds)
    true = (predicted & targets).sum(axis=0)
    guessed, support = predicted.sum(axis=0), targets.sum(axis=0)
    out = {"precision": ratio(true, guessed), "recall": ratio(true, support),
           "f1": ratio(2 * true, guessed + support), "support": support.astype(np.int64),
           "exact_match": float(ratio((predicted == targets).all(axis=1).sum(),
                                      len(scores)))}
    for name in ("precision", "recall", "f1"):
        out["macro_" + name] = float(out[name].mean()) if scores.shape[1] else 0.0
    total, total_guessed, total_support = true.sum(), guessed.sum(), support.sum()
    out["micro_precision"] = float(ratio(total, total_guessed))
    out["micro_recall"] = float(ratio(total, total_support))
    out["micro_f1"] = float(ratio(2 * total, total_guessed + total_support))
    return out


def tune_thresholds(scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per class, the threshold of highest F1 on these images: halfway between the lowest
    score it predicts and the next lower score (the score itself when it is the lowest, or
    when float32 has nothing between them); the highest such threshold on a tie of F1.

    Args:
        scores: (N, K) float, compared in float32 (the thresholds' dtype).
        targets: (N, K) multi-hot.

    Returns:
        float32 (K,); ``DEFAULT_THRESHOLD`` for a class with no positive.
    """
    scores, targets = checked(np.asarray(scores, np.float32), targets)
    result = np.full(scores.shape[1], DEFAULT_THRESHOLD, np.float32)
    for k in np.flatnonzero(targets.any(axis=0)):
        values, true, false = ranked_counts(scores[:, k], targets[:, k])
        best = int(np.argmax(2 * true / (true + false + true[-1])))
        if best + 1 < len(values):
            lower = values[best + 1]
            middle = np.float32((np.float64(values[best]) + np.float64(lower)) / 2)
            result[k] = middle if middle > lower else values[best]
        else:
            result[k] = values[best]
    return result
