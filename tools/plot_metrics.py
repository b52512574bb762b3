"""Draw training curves from metrics.jsonl files: train loss, eval top-1 and LR against epoch.

    python tools/plot_metrics.py output/r18/metrics.jsonl -o curves.png
    python tools/plot_metrics.py ours/metrics.jsonl torch/metrics.jsonl --labels ours,torch -o a.png

Reads the per-epoch JSON lines that train.py (``src/training/callbacks.py``, ``TrainMonitor``) and
``benchmarks/torch_reference_train.py`` write (keys ``epoch``, ``loss``, ``lr``, and ``top1`` on
epochs that were evaluated) and draws one PNG of three panels, one line per run, each run
labelled (default label: the name of the folder holding its metrics.jsonl). Needs matplotlib
(requirements-dev.txt); it draws without a display (Agg backend).
"""
import argparse
import json
import os
import sys

PANELS = (("loss", "train loss (epoch mean)"), ("top1", "eval top-1"), ("lr", "learning rate"))
FIGSIZE = (13, 3.8)  # inches
DPI = 90  # the PNG is FIGSIZE * DPI pixels: 1170 x 342


class MetricsError(ValueError):
    """A metrics file is missing, empty, or holds a line that is not a metrics record."""


def read_metrics(path):
    """The records of a metrics.jsonl file, in file order.

    Args:
        path (str): JSON Lines file, one object per epoch with at least ``epoch``.

    Returns:
        list[dict]: one dict per non-empty line.

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


def default_label(path):
    """Name of the folder that holds ``path`` (a run's output_dir), or the file name."""
    return os.path.basename(os.path.dirname(os.path.abspath(path))) or os.path.basename(path)


def plot_runs(runs, output, title=None, styles=None):
    """Draw runs into one PNG: train loss, eval top-1 (%) and LR against epoch.

    Args:
        runs (list[tuple(str, list[dict])]): (label, records) per run.
        output (str): PNG path (its folder is created).
        title (str, optional): Figure title.
        styles (list[dict], optional): matplotlib line keywords per run (color, linestyle...).

    Returns:
        str: ``output``.

    Raises:
        MetricsError: If ``runs`` is empty.
    """
    if not runs:
        raise MetricsError("no runs to plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=FIGSIZE)
    for index, (label, records) in enumerate(runs):
        style = dict(marker="o", markersize=3, linewidth=1.4)
        style.update((styles or [{}] * len(runs))[index])
        for ax, (key, _) in zip(axes, PANELS):
            points = [(r["epoch"], r[key]) for r in records if r.get(key) is not None]
            if key == "top1":
                points = [(e, 100.0 * v) for e, v in points]
            if points:
                ax.plot(*zip(*points), label=label, **style)
    for ax, (key, name) in zip(axes, PANELS):
        ax.set_xlabel("epoch")
        ax.set_title(name + (" (%)" if key == "top1" else ""), fontsize=10)
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    folder = os.path.dirname(os.path.abspath(output))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(output, dpi=DPI)
    plt.close(fig)
    return output


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("metrics", nargs="+", help="metrics.jsonl files, one per run")
    parser.add_argument("-o", "--output", required=True, help="PNG to write")
    parser.add_argument("--labels", default="", help="comma-separated run labels, in file order "
                        "(default: the folder of each file)")
    parser.add_argument("--title", default=None, help="figure title")
    args = parser.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [default_label(p) for p in args.metrics]
    if len(labels) != len(args.metrics):
        parser.error(f"--labels gives {len(labels)} labels for {len(args.metrics)} files")
    try:
        runs = [(label, read_metrics(path)) for label, path in zip(labels, args.metrics)]
        print(f"wrote {plot_runs(runs, args.output, args.title)}")
    except MetricsError as err:
        print(f"plot_metrics.py: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
