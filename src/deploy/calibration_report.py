"""The calibration report of a single-label evaluation: its ECE, adaptive ECE, NLL, Brier score
and top-1 before (T = 1, the network's own softmax) and after the temperature (fitted on these
images, or the one the model records), the reliability bins of both, the reliability diagram
(a PNG) and the printed line. Measures: ``src/utils/calibration.py``; docs/calibration.md.
"""
import numpy as np

from src.deploy.report import pyplot, save_png
from src.utils.calibration import ECE_BINS, calibration_scores

SCORE_KEYS = ("ece", "adaptive_ece", "nll", "brier", "top1")
"""The measures of each side, in the order shown."""
SCORE_NAMES = {"ece": "ECE", "adaptive_ece": "adaptive ECE", "nll": "NLL", "brier": "Brier",
               "top1": "top-1"}
DIAGRAM_FILE = "reliability_diagram.png"
"""Beside ``eval_result.json``."""


def calibration_result(logits: np.ndarray, labels: np.ndarray, temperature: float, *,
                       fitted: bool) -> tuple[dict, dict]:
    """The calibration of ``logits`` (N, K) against int ``labels`` (N,) at T = 1 and at
    ``temperature``.

    Args:
        fitted (bool): ``temperature`` was fitted on these images (else: the model records it).

    Returns:
        tuple(dict, dict): The summary (``method``, ``temperature``, ``fitted_here``,
        ``images``, ``bins``, ``before`` and ``after``: the ``SCORE_KEYS``) and the
        reliability bins (``before``, ``after``: ``reliability_bins`` of the equal-width bins).
    """
    before = calibration_scores(logits, labels, 1.0)
    after = calibration_scores(logits, labels, temperature)
    summary = {"method": "temperature", "temperature": float(temperature),
               "fitted_here": fitted, "images": int(len(labels)), "bins": ECE_BINS,
               "before": {k: before[k] for k in SCORE_KEYS},
               "after": {k: after[k] for k in SCORE_KEYS}}
    return summary, {"before": before["reliability"], "after": after["reliability"]}


def calibration_line(summary: dict) -> str:
    """The printed line: each measure before -> after."""
    how = ("fitted on these" if summary["fitted_here"] else "recorded, on these")
    scores = ", ".join(f"{SCORE_NAMES[k]} {summary['before'][k]:.4f} -> "
                       f"{summary['after'][k]:.4f}" for k in SCORE_KEYS)
    return (f"calibration (temperature {summary['temperature']:.4f}, {how} "
            f"{summary['images']} images; {summary['bins']} bins): {scores}")


def plot_reliability(reliability: dict, summary: dict, path: str) -> None:
    """Write the reliability diagram as a PNG (matplotlib), atomically: one panel per side
    (T = 1, T fitted or recorded), each bin's accuracy as a bar over its confidence range
    beside the diagonal, the gap to its mean confidence shaded, the share of images per bin
    below; ECE in the title (Guo et al. 2017, figure 1).

    Raises:
        UserError: If matplotlib is not installed (requirements-dev.txt).
        WriteError: If the file cannot be written.
    """
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(9, 6), height_ratios=(3, 1), sharex=True)
    sides = (("before", "T = 1 (uncalibrated)"),
             ("after", f"T = {summary['temperature']:.3f}"))
    for column, (side, label) in enumerate(sides):
        bins = reliability[side]
        ax, counts = axes[0, column], axes[1, column]
        lower = np.array([b["lower"] for b in bins])
        width = np.array([b["upper"] - b["lower"] for b in bins])
        filled = np.array([b["images"] > 0 for b in bins])
        accuracy = np.array([b["accuracy"] or 0.0 for b in bins])
        confidence = np.array([b["confidence"] or 0.0 for b in bins])
        ax.bar(lower[filled], accuracy[filled], width=width[filled], align="edge",
               color="tab:blue", edgecolor="black", linewidth=0.5, label="accuracy")
        ax.bar(lower[filled], (confidence - accuracy)[filled], bottom=accuracy[filled],
               width=width[filled], align="edge", color="tab:red", alpha=0.3,
               edgecolor="tab:red", linewidth=0.5, label="gap to mean confidence")
        ax.plot([0, 1], [0, 1], "--", color="grey", linewidth=1)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_ylabel("accuracy")
        ax.set_title(f"{label}: ECE {summary[side]['ece']:.4f}", fontsize=10)
        ax.legend(loc="upper left", fontsize=8)
        images = np.array([b["images"] for b in bins], np.float64)
        counts.bar(lower, images / max(images.sum(), 1.0), width=width, align="edge",
                   color="grey", edgecolor="black", linewidth=0.5)
        counts.set_xlabel("confidence (top-1 probability)")
        counts.set_ylabel("share of images")
    fig.suptitle(f"reliability, {summary['images']} images, {summary['bins']} bins")
    fig.tight_layout()
    save_png(fig, path)
