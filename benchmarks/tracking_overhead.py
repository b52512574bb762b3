"""What ``tensorboard true`` costs a training run: the writer's own time per logged step, and
whole short runs with it on and off, interleaved (``--benchmark_steps`` runs no callbacks, so
real runs are timed).

    python benchmarks/tracking_overhead.py --runs 3 --epoch_size 2

Prints the writer's time per call (the scalars of one progress line, written and flushed), the
median seconds per training step of each setting over the runs (from ``metrics.jsonl``'s
``time_s``, the first epoch left out: it holds the graph compilation), and their ratio, with
the CPU. Run it on an otherwise idle machine: other load moves the step times more than the
writer does.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.cpu_benchmark import describe_cpu  # noqa: E402
from src.utils.tracking import TensorBoardLog  # noqa: E402


def writer_seconds_per_call(calls=2000):
    """Mean seconds of one ``scalars`` call with a progress line's three values."""
    with tempfile.TemporaryDirectory() as folder:
        log = TensorBoardLog(folder)
        log.scalars(0, {"train/loss": 1.0})  # opens the file
        start = time.perf_counter()
        for step in range(1, calls + 1):
            log.scalars(step, {"train/loss": 2.0, "train/lr": 0.1, "train/img_per_s": 50.0})
        seconds = (time.perf_counter() - start) / calls
        log.close()
    return seconds


def seconds_per_step(tensorboard, epoch_size, folder):
    """Median seconds per step over the epochs after the first of one quick-start run."""
    out = os.path.join(folder, f"tb_{tensorboard}")
    subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--config_path",
                    "configs/quick_start.yaml", "--epoch_size", str(epoch_size), "--run_eval",
                    "false", "--log_interval", "1", "--tensorboard", tensorboard,
                    "--output_dir", out, "--overwrite", "true"],
                   cwd=ROOT, check=True, capture_output=True)
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    steps = records[0]["step"]
    return statistics.median(r["time_s"] / steps for r in records[1:])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each setting")
    parser.add_argument("--epoch_size", type=int, default=3, help="epochs per run (>= 2)")
    args = parser.parse_args(argv)
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        print(f"CPU: {describe_cpu(f.read())}")
    per_call = writer_seconds_per_call()
    print(f"writer: {per_call * 1e6:.0f} us per logged step (3 scalars, flushed)")
    times = {"false": [], "true": []}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.runs):
            for setting in times:
                times[setting].append(seconds_per_step(setting, args.epoch_size, folder))
    off, on = statistics.median(times["false"]), statistics.median(times["true"])
    print(f"quick start (ResNet-18, 32 px, batch 32, log_interval 1), median s/step over "
          f"{args.runs} runs: off {off:.4f} {times['false']}, on {on:.4f} {times['true']}; "
          f"on / off = {on / off:.3f}; the writer's share of a step: {per_call / off:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
