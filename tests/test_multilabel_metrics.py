"""Multi-label metrics (``src/utils/multilabel_metrics.py``) against scikit-learn on fixed
random scores: AP and mAP (distinct scores, many ties, a class with no positive), precision /
recall / F1 per class, macro and micro, exact match, and the tuned thresholds against a brute
force search."""
import numpy as np
import pytest
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    f1_score,
    precision_recall_fscore_support,
)

from src.utils.multilabel_metrics import (
    DEFAULT_THRESHOLD,
    average_precisions,
    mean_average_precision,
    threshold_metrics,
    tune_thresholds,
)


def fixed_case(images=60, classes=6, seed=0, decimals=None):
    """float32 scores in [0, 1) (rounded to ``decimals``: many ties) and multi-hot uint8
    targets with about 30 % positives, every class with a positive and a negative."""
    rng = np.random.default_rng(seed)
    targets = (rng.random((images, classes)) < 0.3).astype(np.uint8)
    targets[0], targets[1] = 1, 0
    # informative scores: positives shifted up, so AP is far from the positive rate
    scores = rng.random((images, classes)) * 0.7 + 0.3 * targets
    if decimals is not None:
        scores = np.round(scores, decimals)
    return scores.astype(np.float32), targets


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_average_precision_equals_scikit_learn(seed):
    scores, targets = fixed_case(seed=seed)
    assert len(np.unique(scores)) == scores.size  # no ties here
    ap = average_precisions(scores, targets)
    assert ap.dtype == np.float64 and ap.shape == (6,)
    assert ap == pytest.approx(average_precision_score(targets, scores, average=None),
                               rel=1e-12)
    assert mean_average_precision(scores, targets) == pytest.approx(
        average_precision_score(targets, scores, average="macro"), rel=1e-12)


def test_tied_scores_are_one_threshold_as_in_scikit_learn():
    scores, targets = fixed_case(images=80, decimals=1, seed=3)
    assert len(np.unique(scores)) <= 11  # 480 scores on 11 values
    reference = average_precision_score(targets, scores, average=None)
    assert average_precisions(scores, targets) == pytest.approx(reference, rel=1e-12)
    # the case is sensitive to ties: ranking the tied images in any fixed order changes AP
    broken = scores + np.arange(len(scores))[:, None].astype(np.float32) * 1e-5
    assert np.abs(average_precision_score(targets, broken, average=None)
                  - reference).max() > 1e-3


def test_a_class_without_positive_has_no_ap_and_is_left_out_of_map():
    scores, targets = fixed_case(seed=4)
    targets[:, 2] = 0
    ap = average_precisions(scores, targets)
    assert np.isnan(ap[2]) and not np.isnan(np.delete(ap, 2)).any()
    # scikit-learn warns and gives 0.0 for it, which its macro mean counts
    with pytest.warns(UserWarning, match="No positive class found"):
        reference = average_precision_score(targets, scores, average=None)
    assert reference[2] == 0.0
    assert np.delete(ap, 2) == pytest.approx(np.delete(reference, 2), rel=1e-12)
    assert mean_average_precision(scores, targets) == pytest.approx(
        np.delete(reference, 2).mean(), rel=1e-12)
    assert mean_average_precision(scores, targets) > reference.mean() + 0.05
    assert np.isnan(mean_average_precision(scores, np.zeros_like(targets)))


@pytest.mark.parametrize("decimals", [None, 1])
def test_precision_recall_f1_equal_scikit_learn_at_per_class_thresholds(decimals):
    scores, targets = fixed_case(seed=5, decimals=decimals)
    targets[:, 4] = 0  # no positive: recall and F1 0/0 -> 0, as zero_division=0
    thresholds = np.array([0.5, 0.3, 0.7, 0.6, 0.2, 0.9], np.float32)
    out = threshold_metrics(scores, targets, thresholds)
    predicted = (scores >= thresholds).astype(np.uint8)
    precision, recall, f1, support = precision_recall_fscore_support(
        targets, predicted, zero_division=0)
    assert out["precision"] == pytest.approx(precision, rel=1e-12)
    assert out["recall"] == pytest.approx(recall, rel=1e-12)
    assert out["f1"] == pytest.approx(f1, rel=1e-12)
    assert out["support"].dtype == np.int64 and out["support"].tolist() == support.tolist()
    for average in ("macro", "micro"):
        reference = precision_recall_fscore_support(targets, predicted, average=average,
                                                    zero_division=0)
        got = [out[f"{average}_{name}"] for name in ("precision", "recall", "f1")]
        assert got == pytest.approx(reference[:3], rel=1e-12)
    assert out["micro_f1"] != pytest.approx(out["macro_f1"])  # the case tells them apart
    assert out["exact_match"] == accuracy_score(targets, predicted)


def test_exact_match_counts_images_whose_every_label_is_right():
    scores, targets = fixed_case(images=30, classes=3, seed=6)
    scores[:10] = targets[:10]  # ten images certainly right at 0.5
    out = threshold_metrics(scores, targets)  # DEFAULT_THRESHOLD for all
    predicted = (scores >= DEFAULT_THRESHOLD).astype(np.uint8)
    assert out["exact_match"] == accuracy_score(targets, predicted)
    assert 10 / 30 <= out["exact_match"] < 1


def f1_at(score, target, threshold):
    """F1 of one class counted directly: 2 TP / (predicted + positives)."""
    predicted = score >= threshold
    return 2 * np.sum(predicted & (target == 1)) / (predicted.sum() + target.sum())


@pytest.mark.parametrize("decimals", [None, 2])
def test_tuned_thresholds_give_the_best_f1_of_every_candidate(decimals):
    scores, targets = fixed_case(images=50, seed=7, decimals=decimals)
    targets[:, 5] = 0
    tuned = tune_thresholds(scores, targets)
    assert tuned.dtype == np.float32 and tuned[5] == DEFAULT_THRESHOLD
    got = threshold_metrics(scores, targets, tuned)["f1"]
    for k in range(5):
        candidates = np.r_[np.unique(scores[:, k]), np.inf]
        best = max(f1_at(scores[:, k], targets[:, k], c) for c in candidates)
        assert got[k] == pytest.approx(best, rel=1e-12)
        assert got[k] >= f1_at(scores[:, k], targets[:, k], DEFAULT_THRESHOLD)
        # halfway between the lowest score predicted and the next lower one
        above = scores[:, k][scores[:, k] >= tuned[k]].min()
        below = scores[:, k][scores[:, k] < tuned[k]]
        if below.size:
            assert tuned[k] == pytest.approx((above + below.max()) / 2, abs=1e-7)
    assert (got[:5] > threshold_metrics(scores, targets)["f1"][:5]).any()
    assert f1_at(scores[:, 0], targets[:, 0], 0.5) == pytest.approx(f1_score(
        targets[:, 0], scores[:, 0] >= 0.5))  # the direct count is scikit-learn's F1


def test_a_tie_of_f1_takes_the_highest_cut():
    """Scores 0.9 +, 0.8 -, 0.7 -, 0.6 +, 0.1 - (2 positives): F1 = 2 TP / (predicted + 2)
    is 2/3 at the cut 0.9 (1 of 1) and at 0.6 (2 of 4), less elsewhere (1/2, 2/5, 4/7); the
    highest cut wins, its threshold halfway down to 0.8: 0.85 (not 0.35, the cut 0.6's)."""
    scores = np.array([[0.9], [0.8], [0.7], [0.6], [0.1]], np.float32)
    targets = np.array([[1], [0], [0], [1], [0]])
    assert [f1_at(scores[:, 0], targets[:, 0], c) for c in (0.9, 0.8, 0.7, 0.6, 0.1)] == \
        pytest.approx([2 / 3, 1 / 2, 2 / 5, 2 / 3, 4 / 7])
    assert tune_thresholds(scores, targets)[0] == pytest.approx(0.85, abs=1e-7)


def test_a_threshold_between_adjacent_float32_scores_is_the_higher_score():
    low = np.float32(0.5)  # the halfway point rounds to even: to 0.5, the lower score
    high = np.nextafter(low, np.float32(1))
    scores = np.array([[high], [low]], np.float32)
    assert tune_thresholds(scores, np.array([[1], [0]])).tolist() == [high]


@pytest.mark.parametrize("scores, targets, message", [
    (np.zeros((3, 2)), np.zeros((3, 3)), "must both be"),
    (np.zeros(3), np.zeros(3), "must both be"),
    (np.zeros((2, 2)), np.full((2, 2), 0.5), "multi-hot"),
    (np.full((2, 2), np.nan), np.zeros((2, 2)), "NaN"),
])
def test_bad_input_is_named(scores, targets, message):
    for metric in (average_precisions, threshold_metrics, tune_thresholds):
        with pytest.raises(ValueError, match=message):
            metric(scores, targets)


def test_thresholds_of_the_wrong_length_are_refused():
    scores, targets = fixed_case(images=4, classes=3)
    with pytest.raises(ValueError, match="expected one or 3"):
        threshold_metrics(scores, targets, np.full(4, 0.5))
