"""The report of a multi-label evaluation: mAP, exact match, macro and micro precision / recall
/ F1, per class AP / precision / recall / F1 at the decision thresholds (tables in CSV and
Markdown), precision-recall curves per class (a PNG), the images of largest error.

Metric definitions: ``src/utils/multilabel_metrics.py``, docs/multilabel.md#metrics.
"""
import csv
import io
import math
import os
from collections.abc import Sequence

import numpy as np

from src.deploy.report import pyplot, save_png
from src.utils.files import atomic_write_text
from src.utils.multilabel_metrics import (
    DEFAULT_THRESHOLD,
    average_precisions,
    decisions,
    mean_of_known,
    precision_recall_points,
    threshold_metrics,
)

LARGEST_ERRORS = 50  # images listed in the summary, largest error first
PANEL_INCHES = 3.0  # side of one class's precision-recall panel ...
FIGURE_INCHES = 30.0  # ... shrunk so that the picture's side stays within this
DPI = 100
TABLE_COLUMNS = ("class", "name", "ap", "precision", "recall", "f1", "positives", "threshold")


class MultiLabelReport:
    """Accumulates the sigmoid probabilities and targets of an evaluation, batch by batch.

    Args:
        class_names: The K class names in label order.
        files: The image of each row in evaluation order (the label file's rows); None:
            images are named by their index.
        thresholds: Decision thresholds, one for all classes or (K,);
            None: ``DEFAULT_THRESHOLD``.

    Raises:
        ValueError: If ``thresholds`` is neither one value nor K.
    """

    def __init__(self, class_names: Sequence[str], files: Sequence[str] | None = None,
                 thresholds: np.ndarray | float | None = None) -> None:
        self.class_names = list(class_names)
        self.files = None if files is None else list(files)
        k = len(self.class_names)
        given = np.asarray(DEFAULT_THRESHOLD if thresholds is None else thresholds, np.float32)
        if given.ndim > 1 or given.size not in (1, k):
            raise ValueError(f"thresholds {given.shape}: expected one or {k} (the classes)")
        self.thresholds = np.broadcast_to(given.reshape(-1), (k,)).copy()
        self.batches = []  # (probabilities, targets) float32 (n, K)
        self.seen = 0

    def update(self, probabilities: np.ndarray, targets: np.ndarray) -> None:
        """Add a batch: sigmoid ``probabilities`` and multi-hot ``targets``, both (n, K).

        Raises:
            ValueError: If a shape is not (n, K).
            RuntimeError: If there are more images than ``files``.
        """
        probabilities = np.array(probabilities, np.float32)
        targets = np.array(targets, np.float32)
        k = len(self.class_names)
        if probabilities.ndim != 2 or probabilities.shape[1] != k or (
                targets.shape != probabilities.shape):
            raise ValueError(f"probabilities {probabilities.shape} and targets "
                             f"{targets.shape} must both be (images, {k})")
        if self.files is not None and self.seen + len(targets) > len(self.files):
            raise RuntimeError(f"more images evaluated than the {len(self.files)} files listed")
        self.batches.append((probabilities, targets))
        self.seen += len(targets)

    @property
    def scores(self) -> np.ndarray:
        """The probabilities so far, float32 (N, K) in evaluation order."""
        return self.collected(0)

    @property
    def targets(self) -> np.ndarray:
        """The targets so far, float32 (N, K) in evaluation order."""
        return self.collected(1)

    def collected(self, column: int) -> np.ndarray:
        if not self.batches:
            return np.zeros((0, len(self.class_names)), np.float32)
        return np.concatenate([batch[column] for batch in self.batches])

    def summary(self) -> dict:
        """The report as JSON-ready data (no NaN: a missing value is None).

        Returns:
            ``images``, ``mAP`` (None without any positive), ``exact_match``,
            ``macro_precision``, ``macro_recall``, ``macro_f1``, ``micro_*`` likewise,
            ``per_class`` (per class: ``class``, ``name``, ``ap`` (None for a class with no
            positive), ``precision``, ``recall``, ``f1``, ``positives``, ``threshold``) and
            ``largest_errors``: up to ``LARGEST_ERRORS`` images, largest ``max_error`` (max
            over classes of |probability - target|) first, each with ``image`` (file, or
            index in evaluation order), ``true``, ``predicted`` (the classes at or above their
            threshold), ``false_positives``, ``false_negatives`` (names in class order),
            ``probabilities`` (of those classes) and ``max_error``.
        """
        scores, targets = self.scores, self.targets
        ap = average_precisions(scores, targets)
        metrics = threshold_metrics(scores, targets, self.thresholds)
        mean = mean_of_known(ap)
        out = {"images": len(scores), "mAP": None if math.isnan(mean) else mean,
               "exact_match": metrics["exact_match"]}
        out.update({f"{mean}_{name}": metrics[f"{mean}_{name}"] for mean in ("macro", "micro")
                    for name in ("precision", "recall", "f1")})
        out["per_class"] = [
            {"class": k, "name": name, "ap": None if np.isnan(ap[k]) else float(ap[k]),
             "precision": float(metrics["precision"][k]), "recall": float(metrics["recall"][k]),
             "f1": float(metrics["f1"][k]), "positives": int(metrics["support"][k]),
             "threshold": float(str(self.thresholds[k]))}  # 0.4, not 0.4000000059604645
            for k, name in enumerate(self.class_names)]
        out["largest_errors"] = self.largest_errors(scores, targets)
        return out

    def largest_errors(self, scores: np.ndarray, targets: np.ndarray) -> list[dict]:
        errors = np.abs(scores - targets).max(axis=1, initial=0.0)
        predicted = decisions(scores, self.thresholds)
        entries = []
        for i in np.argsort(-errors, kind="stable")[:LARGEST_ERRORS]:
            true, guess = targets[i] == 1, predicted[i]
            names = self.names_of
            entries.append({
                "image": self.files[i] if self.files is not None else int(i),
                "true": names(true), "predicted": names(guess),
                "false_positives": names(guess & ~true), "false_negatives": names(true & ~guess),
                "probabilities": {self.class_names[k]: round(float(scores[i, k]), 6)
                                  for k in np.flatnonzero(true | guess)},
                "max_error": round(float(errors[i]), 6)})
        return entries

    def names_of(self, mask: np.ndarray) -> list[str]:
        """The names of the classes where ``mask`` (K,) is True, in class order."""
        return [self.class_names[k] for k in np.flatnonzero(mask)]

    def write_tables(self, output_dir: str) -> list[str]:
        """Write ``per_class.csv`` (every number as Python prints it, so it reads back the
        same; an empty ``ap`` for a class with no positive) and ``per_class.md`` (4 decimals,
        ``n/a``), atomically; returns their paths.

        Raises:
            WriteError: If a file cannot be written.
        """
        summary = self.summary()
        rows = summary["per_class"]
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(TABLE_COLUMNS)
        writer.writerows([["" if row[c] is None else row[c] for c in TABLE_COLUMNS]
                          for row in rows])
        csv_path = os.path.join(output_dir, "per_class.csv")
        atomic_write_text(csv_path, buffer.getvalue())

        def cell(value):
            if value is None:
                return "n/a"
            if isinstance(value, float):
                return f"{value:.4f}"
            return str(value).replace("|", "\\|")
        mean = "n/a" if summary["mAP"] is None else f"{summary['mAP']:.4f}"
        lines = [f"{summary['images']} images, {len(rows)} classes: mAP {mean} (over the "
                 f"{sum(r['ap'] is not None for r in rows)} classes with a positive), exact "
                 f"match {summary['exact_match']:.4f}, macro F1 {summary['macro_f1']:.4f}, "
                 f"micro F1 {summary['micro_f1']:.4f} at the thresholds below.", "",
                 "| " + " | ".join(TABLE_COLUMNS) + " |",
                 "|" + "---|" * len(TABLE_COLUMNS)]
        lines += ["| " + " | ".join(cell(row[c]) for c in TABLE_COLUMNS) + " |" for row in rows]
        md_path = os.path.join(output_dir, "per_class.md")
        atomic_write_text(md_path, "\n".join(lines) + "\n")
        return [csv_path, md_path]

    def plot_pr_curves(self, path: str) -> None:
        """Write the precision-recall curve of each class as a PNG (matplotlib), atomically:
        one panel per class, classes in label order row by row on a grid of
        ceil(sqrt(K)) columns; each with its AP step curve, the point of its threshold and
        the share of positives (the precision of a random ranking).

        Raises:
            UserError: If matplotlib is not installed (requirements-dev.txt).
            WriteError: If the file cannot be written.
        """
        plt = pyplot()
        scores, targets = self.scores, self.targets == 1
        ap = average_precisions(scores, targets)
        metrics = threshold_metrics(scores, targets, self.thresholds)
        columns, rows = panel_grid(len(self.class_names))
        side = min(PANEL_INCHES, FIGURE_INCHES / max(columns, rows))
        fig, axes = plt.subplots(rows, columns, figsize=(columns * side, rows * side),
                                 squeeze=False)
        for ax in axes.flat[len(self.class_names):]:
            ax.axis("off")
        for k, (name, ax) in enumerate(zip(self.class_names, axes.flat)):
            ax.set_xlim(0, 1.02)
            ax.set_ylim(0, 1.02)
            ax.tick_params(labelsize=7)
            if np.isnan(ap[k]):
                ax.set_title(f"{name}\nno positive", fontsize=8)
                continue
            recall, precision = precision_recall_points(scores[:, k], targets[:, k])
            ax.step(np.r_[0.0, recall], np.r_[precision[0], precision], where="pre")
            ax.axhline(targets[:, k].mean(), color="grey", linestyle="--", linewidth=0.8)
            ax.plot(metrics["recall"][k], metrics["precision"][k], "o", color="tab:red",
                    markersize=4)
            ax.set_title(f"{name}\nAP {ap[k]:.3f}, {int(targets[:, k].sum())} positives",
                         fontsize=8)
        for ax in axes.flat[max(0, len(self.class_names) - columns):len(self.class_names)]:
            ax.set_xlabel("recall", fontsize=8)  # the lowest panel of each column
        for ax in axes[:, 0]:
            ax.set_ylabel("precision", fontsize=8)
        fig.tight_layout()
        save_png(fig, path, dpi=DPI)


def panel_grid(classes: int) -> tuple[int, int]:
    """(columns, rows) of the precision-recall picture: ceil(sqrt(K)) columns."""
    columns = max(1, math.ceil(math.sqrt(classes)))
    return columns, max(1, math.ceil(classes / columns))
