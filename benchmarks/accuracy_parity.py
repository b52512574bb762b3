"""Convergence parity: whole training runs of ours and of the PyTorch twin, side by side.

    python benchmarks/accuracy_parity.py --config_path configs/resnet18_cifar10.yaml \
        --data_path ../shared/data/cifar10/train --eval_data_path ../shared/data/cifar10/test \
        --epoch_size 5 --seeds 1,2 --work_dir output/parity_cifar10 \
        --plot docs/parity_cifar10.png --update_docs

For each seed S, one after the other (never two trainings at once):

1. ``work_dir/init_seedS.ckpt``: our network initialized under ``mindspore.set_seed(S)`` (as
   train.py initializes it), and ``init_seedS.pth``, the same weights converted for torch
   (``tools/convert_torch_checkpoint.py``);
2. ``work_dir/ours_seedS/``: ``train.py --seed S --pre_trained init_seedS.ckpt``;
3. ``work_dir/torch_seedS/``: ``benchmarks/torch_reference_train.py`` with the same arguments
   from ``init_seedS.pth``.

Both get the same config file, data, ``--epoch_size``, ``--run_eval true --eval_interval 1``,
and any arguments after ``--``. A run whose ``metrics.jsonl`` already holds ``epoch_size``
epochs is reused (after checking that its ``config.yaml`` has the same recipe), so an
interrupted comparison goes on where it stopped: an unfinished run of ours resumes from its
newest checkpoint (``--resume_ckpt auto``), an unfinished twin run starts over. stdout/stderr
of each run go to ``work_dir/{ours,torch}_seedS.out``.

Report (printed, and in ``work_dir/parity.md`` / ``parity.json``): the train loss of every
epoch and the final top-1/top-5 of every run; the difference ours - PyTorch averaged over
seeds; and PyTorch's own seed-to-seed spread (max - min over its seeds), the scale against
which that difference is judged. ``--plot`` draws all runs with ``tools/plot_metrics.py``;
``--update_docs`` writes the tables between the ``parity`` markers of ``docs/parity.md``.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from src.training.lr_schedule import LR_KEYS  # noqa: E402
from src.utils.config import parse_config, read_recipe  # noqa: E402
from tools.plot_metrics import MetricsError, plot_runs, read_metrics  # noqa: E402

PARITY_PAGE = os.path.join(ROOT, "docs", "parity.md")
TABLE_START, TABLE_END = "<!-- parity:start -->", "<!-- parity:end -->"
SCRIPTS = {"ours": os.path.join(ROOT, "train.py"),
           "torch": os.path.join(ROOT, "benchmarks", "torch_reference_train.py")}
NAMES = {"ours": "ours", "torch": "PyTorch"}
# ours only: an interrupted run in its folder is resumed from its newest checkpoint, or, with
# none, its files are moved aside (train.py never deletes them); the twin starts over
OURS_RESTART = ["--resume_ckpt", "auto", "--overwrite", "true"]
# config keys that must agree for a finished run to be reused
RECIPE_KEYS = ("net_name", "class_num", "batch_size", "train_image_size", "eval_image_size",
               "train_crop_scale", "eval_resize", "momentum", "weight_decay", "label_smoothing",
               "seed", "zero_init_residual") + LR_KEYS


class ParityError(RuntimeError):
    """A run failed, or a folder to reuse holds a run of another recipe."""


def parse_args(argv=None):
    """Harness options; arguments after ``--`` go to both training scripts."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config_path", default=os.path.join(ROOT, "configs",
                                                              "resnet18_cifar10.yaml"))
    parser.add_argument("--data_path", required=True, help="training class folders")
    parser.add_argument("--eval_data_path", required=True, help="eval class folders")
    parser.add_argument("--epoch_size", type=int, required=True)
    parser.add_argument("--seeds", default="1,2", help="comma-separated seeds, one run each")
    parser.add_argument("--work_dir", required=True, help="where runs and reports go")
    parser.add_argument("--plot", default="", help="PNG of all curves (default: "
                        "work_dir/parity.png)")
    parser.add_argument("--title", default="", help="plot title (default: net and epochs)")
    parser.add_argument("--update_docs", action="store_true",
                        help="replace the parity tables of docs/parity.md with this report")
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.extra = extra
    return args


def train_args(args, seed, init_path, output_dir):
    """The command-line arguments both training scripts get for ``seed``."""
    return ["--config_path", args.config_path, "--data_path", args.data_path,
            "--eval_data_path", args.eval_data_path, "--run_eval", "true", "--eval_interval",
            "1", "--epoch_size", str(args.epoch_size), "--seed", str(seed), "--pre_trained",
            init_path, "--output_dir", output_dir] + list(args.extra)


# ---- runs ----

def make_initial_weights(cfg, seed, ckpt_path, pth_path):
    """Our network initialized under ``mindspore.set_seed(seed)``, saved as ``ckpt_path``, and
    converted to a torch state_dict at ``pth_path``. Existing files are kept."""
    if not os.path.isfile(ckpt_path):
        import mindspore as ms

        from src.models.resnet import create_network

        ms.set_seed(seed)
        net = create_network(cfg.net_name, class_num=cfg.class_num,
                             zero_init_residual=cfg.zero_init_residual)
        ms.save_checkpoint(net, ckpt_path + ".partial.ckpt")
        os.replace(ckpt_path + ".partial.ckpt", ckpt_path)
    if not os.path.isfile(pth_path):
        from tools.convert_torch_checkpoint import convert

        convert(ckpt_path, pth_path)


def finished_records(output_dir, epoch_size, expected_cfg=None):
    """The metrics records of a finished run in ``output_dir``, or None when it is not finished.

    Raises:
        ParityError: If the run is finished but its ``config.yaml`` differs from
            ``expected_cfg`` in a recipe key (named, with both values).
    """
    path = os.path.join(output_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return None
    records = read_metrics(path)
    if [r["epoch"] for r in records] != list(range(1, epoch_size + 1)):
        return None
    config_path = os.path.join(output_dir, "config.yaml")
    if expected_cfg is not None and os.path.isfile(config_path):
        found = read_recipe(config_path)  # numbers read as train.py reads them
        differ = [f"{k}: {found.get(k)!r} there, {expected_cfg[k]!r} here" for k in RECIPE_KEYS
                  if found.get(k) != expected_cfg[k]]
        if differ:
            raise ParityError(f"{output_dir} holds a finished run of another recipe "
                              f"({'; '.join(differ)}): remove it or use another --work_dir")
    return records


def run_training(kind, arguments, log_path, threads=0):
    """Run ``train.py`` (kind ``ours``) or the twin (``torch``) with ``arguments``, output to
    ``log_path``. Returns the seconds it took.

    Args:
        threads (int): ``OMP_NUM_THREADS`` of the run (torch's CPU threads); 0: as inherited.

    Raises:
        ParityError: If it exits non-zero (the last lines of its log are included).
    """
    return _call([SCRIPTS[kind], *arguments], f"{kind} run", log_path, threads)


# The twin for each argument list (JSON, argv[2]) in turn, in one interpreter.
TWIN_SERIES = ("import json, sys\n"
               "sys.path.insert(0, sys.argv[1])\n"
               "from benchmarks.torch_reference_train import main\n"
               "for argv in json.loads(sys.argv[2]):\n"
               "    status = main(argv)\n"
               "    if status:\n"
               "        sys.exit(status)\n")


def run_twin_series(argument_lists, log_path, threads=0):
    """The twin's trainings (``torch_reference_train.main``), one per list of ``arguments``,
    one after the other in one fresh interpreter: torch is imported and started once, not
    once per run; each run still sets its own seeds (``torch.manual_seed``, per-image numpy
    generators), so its records are those of a run of its own. Output of all to
    ``log_path``. Returns the seconds they took together.

    Args:
        argument_lists (list[list[str]]): Command lines of the runs.
        log_path (str): stdout and stderr of the interpreter.
        threads (int): ``OMP_NUM_THREADS`` (torch's CPU threads); 0: as inherited.

    Raises:
        ParityError: If a run fails (exit status non-zero; the last lines of the log).
    """
    return _call(["-c", TWIN_SERIES, ROOT, json.dumps(argument_lists)], "torch runs", log_path,
                 threads)


def _call(arguments, label, log_path, threads):
    """``python arguments`` from the repository root, output to ``log_path``; seconds taken."""
    start = time.time()
    # env given explicitly: once MindSpore has run in this process it has set
    # OMP_NUM_THREADS=1 in the C environment (not in os.environ), which a child would
    # inherit by default and torch would then train on one thread.
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    with open(log_path, "w", encoding="utf-8") as log:
        status = subprocess.call([sys.executable, *arguments], cwd=ROOT, stdout=log,
                                 stderr=subprocess.STDOUT, env=env)
    if status:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            tail = "".join(f.readlines()[-15:])
        raise ParityError(f"{label} failed (exit {status}), log {log_path}:\n{tail}")
    return time.time() - start


def run_all(args, cfg, log=print):
    """Initial weights, then ours and the twin for every seed (reusing finished runs).

    Returns:
        dict: (kind, seed) -> list of metrics records.
    """
    os.makedirs(args.work_dir, exist_ok=True)
    runs = {}
    for seed in args.seeds:
        ckpt = os.path.join(args.work_dir, f"init_seed{seed}.ckpt")
        pth = os.path.join(args.work_dir, f"init_seed{seed}.pth")
        make_initial_weights(cfg, seed, ckpt, pth)
        expected = dict(cfg, seed=seed, epoch_size=args.epoch_size)
        for kind, init in (("ours", ckpt), ("torch", pth)):
            out = os.path.join(args.work_dir, f"{kind}_seed{seed}")
            records = finished_records(out, args.epoch_size, expected)
            if records is None:
                log(f"[parity] {kind} seed {seed}: training -> {out}")
                arguments = train_args(args, seed, init, out) + (
                    OURS_RESTART if kind == "ours" else [])
                seconds = run_training(kind, arguments,
                                       os.path.join(args.work_dir, f"{kind}_seed{seed}.out"))
                records = finished_records(out, args.epoch_size, expected)
                if records is None:
                    raise ParityError(f"{kind} seed {seed} exited 0 but {out}/metrics.jsonl does "
                                      f"not hold {args.epoch_size} epochs")
                log(f"[parity] {kind} seed {seed}: done in {seconds / 60:.1f} min")
            else:
                log(f"[parity] {kind} seed {seed}: reusing the finished run in {out}")
            runs[(kind, seed)] = records
    return runs


# ---- report ----

def spread(values):
    """Seed-to-seed spread: max - min (0 for a single value)."""
    return max(values) - min(values)


def compare(runs, seeds):
    """Side-by-side numbers of ``runs`` ((kind, seed) -> records).

    Returns:
        dict: ``rows``: one per compared quantity (train loss of each epoch, final top-1 and
        top-5 in %), each with ``ours``/``torch`` lists (in ``seeds`` order), ``diff`` (mean over
        seeds of ours - torch), ``torch_spread`` and ``ours_spread``, ``within`` (|diff| <=
        torch_spread); and ``seeds``.
    """
    epochs = len(runs[("ours", seeds[0])])
    rows = []

    def row(name, pick):
        ours = [pick(runs[("ours", s)]) for s in seeds]
        torch_ = [pick(runs[("torch", s)]) for s in seeds]
        diff = sum(o - t for o, t in zip(ours, torch_)) / len(seeds)
        rows.append({"name": name, "ours": ours, "torch": torch_, "diff": diff,
                     "torch_spread": spread(torch_), "ours_spread": spread(ours),
                     "within": abs(diff) <= spread(torch_)})

    for e in range(epochs):
        row(f"train loss, epoch {e + 1}", lambda r, e=e: r[e]["loss"])
    row("final top-1 (%)", lambda r: 100.0 * r[-1]["top1"])
    row("final top-5 (%)", lambda r: 100.0 * r[-1]["top5"])
    return {"seeds": list(seeds), "rows": rows}


def markdown(summary, digits=(4, 2)):
    """The comparison as a Markdown table (losses to 4 decimals, accuracies to 2)."""
    seeds = summary["seeds"]
    head = ([f"ours seed {s}" for s in seeds] + [f"PyTorch seed {s}" for s in seeds]
            + ["ours - PyTorch (mean)", "PyTorch spread", "within it", "ours spread"])
    lines = ["| | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for r in summary["rows"]:
        d = digits[0] if r["name"].startswith("train loss") else digits[1]
        cells = [f"{v:.{d}f}" for v in r["ours"] + r["torch"]]
        cells += [f"{r['diff']:+.{d}f}", f"{r['torch_spread']:.{d}f}",
                  "yes" if r["within"] else "**no**", f"{r['ours_spread']:.{d}f}"]
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs, seeds, path, title):
    """All runs in one PNG: one colour per seed, solid ours, dashed PyTorch."""
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
    labelled, styles = [], []
    for i, seed in enumerate(seeds):
        for kind, line in (("ours", "-"), ("torch", "--")):
            labelled.append((f"{NAMES[kind]} seed {seed}", runs[(kind, seed)]))
            styles.append({"color": colours[i % len(colours)], "linestyle": line})
    return plot_runs(labelled, path, title, styles)


def update_docs(table, path=PARITY_PAGE):
    """Replace the text between the parity markers of ``path`` (docs/parity.md) with ``table``.

    Raises:
        ParityError: If the page lacks the markers.
    """
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if TABLE_START not in text or TABLE_END not in text:
        raise ParityError(f"{path} lacks the markers {TABLE_START} ... {TABLE_END}")
    head, rest = text.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{head}{TABLE_START}\n{table}\n{TABLE_END}{tail}")


def main(argv=None):
    # ---- parse ----
    args = parse_args(argv)
    cfg = parse_config(["--config_path", args.config_path, "--epoch_size",
                        str(args.epoch_size)] + args.extra)
    # ---- run ----
    runs = run_all(args, cfg)
    # ---- report ----
    summary = compare(runs, args.seeds)
    table = markdown(summary)
    epochs = args.epoch_size
    note = (f"{cfg.net_name}, {epochs} epochs, batch {cfg.batch_size}, seeds "
            f"{', '.join(map(str, args.seeds))}; both frameworks from the same initial weights "
            f"per seed.")
    print(f"\n{note}\n{table}")
    with open(os.path.join(args.work_dir, "parity.md"), "w", encoding="utf-8") as f:
        f.write(f"{note}\n\n{table}\n")
    with open(os.path.join(args.work_dir, "parity.json"), "w", encoding="utf-8") as f:
        json.dump(dict(summary, net_name=cfg.net_name, epoch_size=epochs,
                       batch_size=cfg.batch_size), f, indent=1)
    title = args.title or f"{cfg.net_name}, {epochs} epochs: ours (solid) vs PyTorch (dashed)"
    print("wrote", plot(runs, args.seeds, args.plot or os.path.join(args.work_dir, "parity.png"),
                        title))
    if args.update_docs:
        update_docs(table)
        print(f"parity table updated in {os.path.relpath(PARITY_PAGE, ROOT)}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ParityError, MetricsError) as err:
        print(f"accuracy_parity.py: error: {err}", file=sys.stderr)
        sys.exit(2)
