"""The per-class report of an evaluation: accuracy, precision, recall and F1 per class, the
confusion matrix (also as a picture), the misclassified images (most confident first).

Definitions as scikit-learn's ``classification_report`` / ``confusion_matrix``: row = true
class, column = predicted (top-1); a class's accuracy is its recall; a ratio with a zero
denominator is 0. See docs/deployment.md#evaluation.
"""
import io
from collections.abc import Sequence
from types import ModuleType

import numpy as np

from src.deploy.outputs import probabilities
from src.utils.errors import UserError
from src.utils.files import atomic_write_bytes
from src.utils.tasks import MULTICLASS

FULL_PLOT_CLASSES = 50  # up to this many classes the picture names every row and column
TOP_CONFUSIONS = 20  # listed beside the picture beyond FULL_PLOT_CLASSES
TOP_K = 3  # the most probable classes listed with each misclassified image ("top3")


class ClassReport:
    """Accumulates an evaluation, batch by batch.

    Args:
        class_num: Number of classes K.
        names: Class names in label order (K of them).
        images: (file path, label) of each image in evaluation order (class folders:
            ``src.data.pipeline.image_folder_files``), checked against the labels
            evaluated; None: images are named by their index (the CIFAR-10 binary format).
    """

    def __init__(self, class_num: int, names: Sequence[str],
                 images: Sequence[tuple[str, int]] | None = None) -> None:
        self.class_num, self.names, self.images = class_num, list(names), images
        self.confusion = np.zeros((class_num, class_num), np.int64)
        self.mistakes = []  # (probability of the prediction, index, true, predicted, top k)
        self.seen = 0

    def update(self, logits: np.ndarray, labels: np.ndarray) -> None:
        """Add a batch: ``logits`` float (N, K), ``labels`` int (N,)."""
        logits = np.asarray(logits, np.float64)
        labels = np.asarray(labels).astype(np.int64)
        if self.images is not None:
            listed = [label for _, label in self.images[self.seen:self.seen + len(labels)]]
            if listed != labels.tolist():
                raise RuntimeError(f"images {self.seen}.. of the eval pipeline are not in the "
                                   f"order of the folder listing: cannot name them")
        predicted = logits.argmax(axis=1)
        softmax = probabilities(logits, MULTICLASS)
        probability = softmax[np.arange(len(labels)), predicted]
        np.add.at(self.confusion, (labels, predicted), 1)
        for i in np.flatnonzero(predicted != labels):
            top = np.argsort(-softmax[i], kind="stable")[:TOP_K]
            self.mistakes.append((float(probability[i]), self.seen + int(i), int(labels[i]),
                                  int(predicted[i]), [(int(k), float(softmax[i, k])) for k in top]))
        self.seen += len(labels)

    def summary(self) -> dict:
        """The report as JSON-ready data.

        Returns:
            ``per_class`` (one dict per class: ``class``, ``name``, ``images``,
            ``accuracy``, ``precision``, ``recall``, ``f1``), ``confusion_matrix`` (K lists of
            K ints, row = true class) and ``misclassified`` (``image``: the file path, or the
            index in evaluation order; ``true``, ``true_name``, ``predicted``,
            ``predicted_name``, ``probability`` of the prediction, ``top3``: the
            ``TOP_K`` most probable classes as ``class``, ``name``, ``probability``), most
            confident first.
        """
        correct = np.diag(self.confusion).astype(np.float64)
        images = self.confusion.sum(axis=1)
        predicted = self.confusion.sum(axis=0)
        recall = np.divide(correct, images, out=np.zeros_like(correct), where=images > 0)
        precision = np.divide(correct, predicted, out=np.zeros_like(correct),
                              where=predicted > 0)
        both = precision + recall
        f1 = np.divide(2 * precision * recall, both, out=np.zeros_like(correct), where=both > 0)
        per_class = [{"class": k, "name": self.names[k], "images": int(images[k]),
                      "accuracy": float(recall[k]), "precision": float(precision[k]),
                      "recall": float(recall[k]), "f1": float(f1[k])}
                     for k in range(self.class_num)]
        mistakes = sorted(self.mistakes, key=lambda m: (-m[0], m[1]))
        misclassified = [{"image": self.images[index][0] if self.images else index,
                          "true": true, "true_name": self.names[true], "predicted": pred,
                          "predicted_name": self.names[pred], "probability": round(prob, 6),
                          "top3": [{"class": k, "name": self.names[k], "probability": round(p, 6)}
                                   for k, p in top]}
                         for prob, index, true, pred, top in mistakes]
        return {"per_class": per_class, "confusion_matrix": self.confusion.tolist(),
                "misclassified": misclassified}


def top_confusions(confusion: np.ndarray | Sequence[Sequence[int]], names: Sequence[str],
                   top: int = TOP_CONFUSIONS) -> list[str]:
    """The ``top`` largest off-diagonal cells as ``"true -> predicted: count"`` lines."""
    off = np.array(confusion, np.int64)
    np.fill_diagonal(off, 0)
    order = np.argsort(-off, axis=None, kind="stable")[:top]
    cells = [np.unravel_index(i, off.shape) for i in order]
    return [f"{names[t]} -> {names[p]}: {off[t, p]}" for t, p in cells if off[t, p] > 0]


def plot_confusion(confusion: np.ndarray | Sequence[Sequence[int]], names: Sequence[str],
                   path: str) -> None:
    """Write the confusion matrix as a PNG (matplotlib), atomically: rows true classes,
    columns predicted, cells coloured by the share of the row; up to ``FULL_PLOT_CLASSES``
    classes every row and column is named and each cell shows its count; beyond, the picture
    has no labels and the ``TOP_CONFUSIONS`` largest confusions are listed beside it.

    Raises:
        UserError: If matplotlib is not installed (requirements-dev.txt).
        WriteError: If the file cannot be written.
    """
    plt = pyplot()
    matrix = np.array(confusion, np.float64)
    rows = matrix.sum(axis=1, keepdims=True)
    share = np.divide(matrix, rows, out=np.zeros_like(matrix), where=rows > 0)
    k = len(names)
    full = k <= FULL_PLOT_CLASSES
    side = max(6.0, 0.3 * k + 3) if full else 10.0
    fig, ax = plt.subplots(figsize=(side + (0 if full else 6), side))
    ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    if full:
        ax.set_xticks(range(k), names, rotation=90)
        ax.set_yticks(range(k), names)
        for t in range(k):
            for p in range(k):
                if matrix[t, p]:
                    ax.text(p, t, int(matrix[t, p]), ha="center", va="center", fontsize=7,
                            color="white" if share[t, p] > 0.5 else "black")
    else:
        ax.set_xticks([])
        ax.set_yticks([])
        fig.text(0.62, 0.5, "most frequent confusions\n(true -> predicted: images)\n\n"
                 + "\n".join(top_confusions(matrix.astype(np.int64), names)),
                 va="center", fontsize=9, family="monospace")
    ax.set_title(f"confusion matrix, {int(matrix.sum())} images, {k} classes")
    fig.tight_layout()
    save_png(fig, path)


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend (no display), imported on first use.

    Raises:
        UserError: If matplotlib is not installed (requirements-dev.txt).
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise UserError("plot true needs matplotlib: pip install matplotlib (in "
                        "requirements-dev.txt)") from err
    return plt


def save_png(fig: object, path: str, dpi: int = 100) -> None:
    """Write the matplotlib figure ``fig`` to ``path`` as a PNG, atomically, and close it.

    Raises:
        WriteError: If the file cannot be written.
    """
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=dpi)
        atomic_write_bytes(path, buffer.getvalue())
    finally:
        pyplot().close(fig)
