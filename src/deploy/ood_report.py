"""The out-of-distribution part of an evaluation: for each score (``src.utils.ood``), how well
it separates the images evaluated (in-distribution) from a folder of unknown ones (AUROC, FPR at
95% TPR, AUPR), what a model's threshold keeps of each side, and the histogram of the scores of
both sides (a PNG, matplotlib, written atomically). See docs/ood.md.
"""
from collections.abc import Sequence

import numpy as np

from src.deploy.report import pyplot, save_png
from src.utils.ood import OOD_SCORES, separation

HISTOGRAM_FILE = "ood_histogram.png"  # in eval.py's output_dir
BINS = 40


def ood_summary(inside: np.ndarray, outside: np.ndarray | None, *, score: str | None,
                threshold: float | None) -> dict:
    """The JSON-ready OOD result.

    Args:
        inside: float (N, 3) scores of the images evaluated (``all_scores``), N >= 1.
        outside: float (M, 3) scores of the unknown images, or None (none given).
        score, threshold: The model's recorded (or just tuned) OOD score and its threshold;
            None: none.

    Returns:
        dict: ``in_distribution_images``; with ``outside`` also ``images`` and ``scores``
        (per name of ``OOD_SCORES``: ``auroc``, ``fpr_at_95_tpr``, ``aupr``); with a
        threshold ``threshold`` (``score``, ``value``, ``tpr``: the share of ``inside`` at or
        above it, with ``outside`` also ``fpr``: that of ``outside``).
    """
    result = {"in_distribution_images": len(inside)}
    if outside is not None:
        result["images"] = len(outside)
        result["scores"] = {name: separation(inside[:, k], outside[:, k])
                            for k, name in enumerate(OOD_SCORES)}
    if threshold is not None:
        k = OOD_SCORES.index(score)
        result["threshold"] = {"score": score, "value": threshold,
                               "tpr": float(np.mean(inside[:, k] >= threshold))}
        if outside is not None:
            result["threshold"]["fpr"] = float(np.mean(outside[:, k] >= threshold))
    return result


def summary_line(result: dict) -> str:
    """One printed line of ``ood_summary``'s result."""
    parts = []
    if "scores" in result:
        parts.append(f"{result['images']} unknown images against "
                     f"{result['in_distribution_images']}: " + "; ".join(
                         f"{name} AUROC {v['auroc']:.4f} FPR@95%TPR {v['fpr_at_95_tpr']:.4f} "
                         f"AUPR {v['aupr']:.4f}" for name, v in result["scores"].items()))
    if "threshold" in result:
        t = result["threshold"]
        parts.append(f"threshold {t['score']} {t['value']:.6g} keeps {t['tpr']:.4f} of the "
                     f"{result['in_distribution_images']} images evaluated" + (
                         f" and {t['fpr']:.4f} of the unknown ones" if "fpr" in t else ""))
    return "out-of-distribution: " + "; ".join(parts)


def plot_histograms(inside: np.ndarray, outside: np.ndarray, path: str, *,
                    marks: Sequence[tuple[str, float]] = ()) -> None:
    """Write one panel per score of ``OOD_SCORES``: the histograms (density, shared bins) of
    the in-distribution and unknown images' scores, the AUROC in the title, a vertical line
    at each threshold of ``marks`` ((score name, value)), as a PNG at ``path``, atomically.

    Args:
        inside, outside: float (N, 3) and (M, 3) scores (``all_scores``).

    Raises:
        UserError: If matplotlib is not installed (requirements-dev.txt).
        WriteError: If the file cannot be written.
    """
    plt = pyplot()
    fig, axes = plt.subplots(1, len(OOD_SCORES), figsize=(5 * len(OOD_SCORES), 3.6))
    for k, (name, ax) in enumerate(zip(OOD_SCORES, axes)):
        both = np.r_[inside[:, k], outside[:, k]]
        bins = np.linspace(both.min(), both.max(), BINS + 1) if np.ptp(both) > 0 else BINS
        ax.hist(inside[:, k], bins=bins, density=True, alpha=0.6,
                label=f"in-distribution ({len(inside)})")
        ax.hist(outside[:, k], bins=bins, density=True, alpha=0.6,
                label=f"unknown ({len(outside)})")
        for score, value in marks:
            if score == name:
                ax.axvline(value, color="black", linestyle="--", label=f"threshold {value:.4g}")
        auroc = separation(inside[:, k], outside[:, k])["auroc"]
        ax.set_title(f"{name}: AUROC {auroc:.3f}")
        ax.set_xlabel(f"{name} (higher = more in-distribution)")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("density")
    fig.tight_layout()
    save_png(fig, path)
