"""Where our CPU train step spends its time: oneDNN's own per-primitive timings.

    python benchmarks/onednn_breakdown.py --batch_size 16

Runs one warmup (compile) step and one measured step of ours (the train step of
``cpu_benchmark.py``) in a child process with ``ONEDNN_VERBOSE=1``, which makes oneDNN print
one line per executed primitive with its kind, implementation and milliseconds. Prints the
time per (primitive, implementation, propagation kind) as a share of the measured step's
wall time; the remainder is MindSpore's own kernels (ReLU, Add, their gradients, the
optimizer) and the runtime.
"""
import argparse
import collections
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
START, END = "BREAKDOWN-START", "BREAKDOWN-END"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--net_name", default="resnet50")
    parser.add_argument("--batch_size", type=int, default=16, help="images per step")
    parser.add_argument("--image_size", type=int, default=224, help="pixels")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def worker(args):
    """In the child: warm up, then time one step between two marker lines."""
    import time
    sys.path.insert(0, HERE)
    import cpu_benchmark
    bench_args = cpu_benchmark.parse_args(["--net_name", args.net_name, "--batch_size",
                                           str(args.batch_size), "--image_size",
                                           str(args.image_size)])
    step = cpu_benchmark.ms_train_step(bench_args)
    step()
    print(START, flush=True)
    start = time.perf_counter()
    step()
    print(f"{END} {1000 * (time.perf_counter() - start):.1f}", flush=True)


def breakdown(lines):
    """(ms per (primitive, impl, prop_kind), calls per key) of oneDNN exec lines."""
    total, calls = collections.Counter(), collections.Counter()
    for line in lines:
        fields = line.strip().split(",")
        if not line.startswith("onednn_verbose") or "exec" not in fields:
            continue
        i = fields.index("exec")
        try:
            milliseconds = float(fields[-1])
        except ValueError:
            continue
        key = tuple(fields[i + 2:i + 5])
        total[key] += milliseconds
        calls[key] += 1
    return total, calls


def main():
    args = parse_args()
    if args.worker:
        worker(args)
        return 0
    env = dict(os.environ, ONEDNN_VERBOSE="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--net_name", args.net_name,
           "--batch_size", str(args.batch_size), "--image_size", str(args.image_size)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    lines = out.stdout.splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith((START, END))]
    if out.returncode != 0 or len(marks) != 2:
        print(f"the measured step did not run (exit {out.returncode}):\n{out.stderr[-2000:]}")
        return 1
    step_ms = float(lines[marks[1]].split()[1])
    total, calls = breakdown(lines[marks[0] + 1:marks[1]])
    print(f"{args.net_name}, batch {args.batch_size}, {args.image_size} px: one train step "
          f"{step_ms:.0f} ms (ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', 'AVX2')})"
          f"\n\n| primitive | implementation | pass | calls | ms | share of the step |\n"
          f"|---|---|---|---|---|---|")
    for (kind, impl, prop), ms in total.most_common():
        print(f"| {kind} | {impl} | {prop} | {calls[(kind, impl, prop)]} | {ms:.0f} | "
              f"{100 * ms / step_ms:.1f}% |")
    rest = step_ms - sum(total.values())
    print(f"| MindSpore's own kernels and runtime | | | | {rest:.0f} | "
          f"{100 * rest / step_ms:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
