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
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# the reader and the drawing live in src (eval.py's report page draws them too); named here
# for the callers of this tool (benchmarks/accuracy_parity.py, tests/test_parity.py)
from src.utils.curves import DPI, FIGSIZE, MetricsError, plot_runs, read_metrics  # noqa: E402,F401


def default_label(path):
    """Name of the folder that holds ``path`` (a run's output_dir), or the file name."""
    return os.path.basename(os.path.dirname(os.path.abspath(path))) or os.path.basename(path)


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
