"""Training curves of ``metrics.jsonl`` files: train loss, eval top-1 and LR against epoch.

Read by ``tools/plot_metrics.py``, ``benchmarks/accuracy_parity.py`` and eval.py's report page
(``src/deploy/report_page.py``). The records are those ``src/training/callbacks.py``
(``TrainMonitor``) and ``benchmarks/torch_reference_train.py`` write: ``epoch``, ``loss``,
``lr``, and ``top1`` on evaluated epochs. Drawn with matplotlib (Agg backend, no display).
"""
import json
import os
from typing import BinaryIO

from src.utils.tasks import DEFAULT_TASK, TASKS

PANELS = (("loss", "train loss (epoch mean)"), ("top1", "eval top-1"), ("lr", "learning rate"))
SCORES = {task.score_key: f"eval {task.score_name}" for task in TASKS.values()}
"""The eval score of the middle panel: each task's score (top-1, or mAP for multi-label runs)."""


def score_of(runs: list[tuple[str, list[dict]]]) -> str:
    """The first task's ``score_key`` (``TASKS`` order) that the records hold; ``top1`` when
    they hold none (no evaluation)."""
    records = [r for _, run in runs for r in run]
    held = [key for key in SCORES if any(key in r for r in records)]
    return held[0] if held else DEFAULT_TASK.score_key
FIGSIZE = (13, 3.8)  # inches
DPI = 90  # the PNG is FIGSIZE * DPI pixels: 1170 x 342


class MetricsError(ValueError):
    """A metrics file is missing, empty, or holds a line that is not a metrics record."""


def read_metrics(path: str) -> list[dict]:
    """The records of a metrics.jsonl file (one JSON object per epoch with at least
    ``epoch``), in file order; empty lines skipped.

    Raises:
        MetricsError: If the file is missing or empty, or a line is not a JSON object with an
            ``epoch`` (names the file and line number).
    """
    if not os.path.isfile(path):
        raise MetricsError(f"metrics file not found: {path}")
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise MetricsError(f"{path} line {number}: not JSON ({err.msg})") from None
            if not isinstance(record, dict) or "epoch" not in record:
                raise MetricsError(f"{path} line {number}: expected an object with an 'epoch' key")
            records.append(record)
    if not records:
        raise MetricsError(f"{path} holds no records")
    return records


def plot_runs(runs: list[tuple[str, list[dict]]], output: str | BinaryIO,
              title: str | None = None, styles: list[dict] | None = None) -> str | BinaryIO:
    """Draw runs into one PNG of three panels: train loss, eval top-1 (%) and LR against epoch.

    Args:
        runs: (label, records) per run, one line each.
        output: PNG path (its folder is created) or a binary file object.
        title: Figure title.
        styles: matplotlib line keywords per run (color, linestyle...).

    Returns:
        ``output``.

    Raises:
        MetricsError: If ``runs`` is empty.
        ImportError: If matplotlib is not installed (requirements-dev.txt).
    """
    if not runs:
        raise MetricsError("no runs to plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    score = score_of(runs)
    panels = [(score if key == "top1" else key, name) for key, name in PANELS]
    panels[1] = (score, SCORES[score])
    fig, axes = plt.subplots(1, len(panels), figsize=FIGSIZE)
    for index, (label, records) in enumerate(runs):
        style = dict(marker="o", markersize=3, linewidth=1.4)
        style.update((styles or [{}] * len(runs))[index])
        for ax, (key, _) in zip(axes, panels):
            points = [(r["epoch"], r[key]) for r in records if r.get(key) is not None]
            if key == score:
                points = [(e, 100.0 * v) for e, v in points]
            if points:
                ax.plot(*zip(*points), label=label, **style)
    for ax, (key, name) in zip(axes, panels):
        ax.set_xlabel("epoch")
        ax.set_title(name + (" (%)" if key == score else ""), fontsize=10)
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    if isinstance(output, str):
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    try:
        fig.savefig(output, dpi=DPI, format="png")
    finally:
        plt.close(fig)
    return output
