"""Where a CPU step spends its time: oneDNN's own per-primitive timings, ours and PyTorch's.

    python benchmarks/onednn_breakdown.py --batch_size 16                  # our train step
    python benchmarks/onednn_breakdown.py --cases ms_train_step,torch_train_channels_last \
        --net_name resnet18 --image_size 128 --batch_size 64                # where a gap lies
    python benchmarks/onednn_breakdown.py --cases ms_infer --isa_levels AVX2,AVX512_CORE

Runs one warmup (compile) step and one measured step of each case in a child process with
``ONEDNN_VERBOSE=1``, which makes oneDNN print one line per executed primitive with its kind,
implementation and milliseconds. Cases: ``ms_train_step`` (the train step of
``cpu_benchmark.py``), ``ms_infer`` (forward pass of a new network in graph mode, as eval.py
runs it), and the PyTorch reference's ``torch_train_nchw``, ``torch_train_channels_last``,
``torch_infer_nchw``, ``torch_infer_channels_last`` (PyTorch runs its convolutions, not its
BatchNorm, in oneDNN). Prints per case the time per (primitive, implementation, propagation
kind) as a share of the measured step's wall time; the remainder is the framework's own
kernels (MindSpore: ReLU, Add, their gradients, the optimizer; PyTorch: also BatchNorm) and
its runtime. With more than one run a summary compares them by part of the step.

With ``--isa_levels`` each case runs once per ``ONEDNN_MAX_CPU_ISA`` value (oneDNN's names:
AVX2, AVX512_CORE, AVX512_CORE_VNNI, AVX512_CORE_BF16, AVX512_CORE_AMX, ALL); the summary
gives the ISA oneDNN reports in force (a level above what the CPU has resolves to the CPU's
widest) and the share of the step in oneDNN's reference (``ref``) kernels. Without it our
cases get this process's ``ONEDNN_MAX_CPU_ISA`` (the entry points' AVX2 cap, ``src/env.py``,
when unset) and PyTorch's cases oneDNN's own choice, as in ``cpu_benchmark.py``.
"""
import argparse
import collections
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu_benchmark  # noqa: E402  (standard library only at import)
from cpu_benchmark import ISA_VAR  # noqa: E402

START, END = "BREAKDOWN-START", "BREAKDOWN-END"
CASES = ("ms_train_step", "ms_infer", "torch_train_nchw", "torch_train_channels_last",
         "torch_infer_nchw", "torch_infer_channels_last")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--net_name", default="resnet50")
    parser.add_argument("--batch_size", type=int, default=16, help="images per step")
    parser.add_argument("--image_size", type=int, default=224, help="pixels")
    parser.add_argument("--cases", default="ms_train_step",
                        help=f"comma-separated subset of: {', '.join(CASES)}")
    parser.add_argument("--warmup_steps", type=int, default=1,
                        help="steps before the measured ones (the first compiles)")
    parser.add_argument("--steps", type=int, default=1,
                        help="measured steps; times and calls are per step")
    parser.add_argument("--isa_levels", default="",
                        help="comma-separated ONEDNN_MAX_CPU_ISA values, one child each")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for key in ("batch_size", "image_size", "steps"):
        if getattr(args, key) < 1:
            parser.error(f"--{key} must be a positive integer, got {getattr(args, key)}")
    args.case_names = args.cases.split(",")
    unknown = [name for name in args.case_names if name not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; valid: {', '.join(CASES)}")
    return args


def infer_step(bench_args):
    """Forward pass of a new network (random weights) in graph mode, as eval.py runs it."""
    ms = cpu_benchmark.ms_setup()
    from src.models.resnet import create_network
    net = create_network(bench_args.net_name, class_num=bench_args.class_num)
    net.set_train(False)
    images = ms.Tensor(cpu_benchmark.random_batch(bench_args)[0])
    return lambda: net(images).asnumpy()


def takes_our_cap(name):
    """Whether the case runs under our entry points' oneDNN cap (cpu_benchmark's flag)."""
    return name == "ms_infer" or cpu_benchmark.CASES[name][3]


def case_builder(name):
    """The step builder of a case (cpu_benchmark's, or ``infer_step``)."""
    return infer_step if name == "ms_infer" else cpu_benchmark.CASES[name][2]


def worker(args):
    """In the child: warm up, then time one step between two marker lines."""
    import time
    bench_args = cpu_benchmark.parse_args(["--net_name", args.net_name, "--batch_size",
                                           str(args.batch_size), "--image_size",
                                           str(args.image_size)])
    step = case_builder(args.worker)(bench_args)
    for _ in range(args.warmup_steps):
        step()
    print(START, flush=True)
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    print(f"{END} {1000 * (time.perf_counter() - start) / args.steps:.1f}", flush=True)


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


def isa_in_force(lines):
    """The ISA oneDNN reports at load (its ``info,cpu,isa:`` line), or "unknown"."""
    for line in lines:
        if ",info,cpu,isa:" in line:
            return line.split("isa:", 1)[1].strip()
    return "unknown"


def measure(args, case, isa):
    """Run ``case`` in a child with ``isa`` (None: as cpu_benchmark would); (step ms,
    breakdown, calls, ISA in force) or an error string."""
    env = dict(os.environ, ONEDNN_VERBOSE="1")
    if isa:
        env[ISA_VAR] = isa
    elif not takes_our_cap(case):
        env.pop(ISA_VAR, None)  # PyTorch's oneDNN picks its own ISA
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", case]
    for key in ("net_name", "batch_size", "image_size", "warmup_steps", "steps"):
        cmd += [f"--{key}", str(getattr(args, key))]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    lines = out.stdout.splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith((START, END))]
    if out.returncode != 0 or len(marks) != 2:
        return f"the measured step did not run (exit {out.returncode}):\n{out.stderr[-2000:]}"
    total, calls = breakdown(lines[marks[0] + 1:marks[1]])
    for key in total:  # per measured step
        total[key] /= args.steps
        calls[key] //= args.steps
    return float(lines[marks[1]].split()[1]), total, calls, isa_in_force(lines)


def print_breakdown(args, case, isa, result):
    """The per-primitive table of one measured step."""
    step_ms, total, calls, in_force = result
    print(f"{case}, {args.net_name}, batch {args.batch_size}, {args.image_size} px: one step "
          f"{step_ms:.0f} ms ({ISA_VAR}={isa}; oneDNN reports isa: {in_force})"
          f"\n\n| primitive | implementation | pass | calls | ms | share of the step |\n"
          f"|---|---|---|---|---|---|")
    for (kind, impl, prop), ms in total.most_common():
        print(f"| {kind} | {impl} | {prop} | {calls[(kind, impl, prop)]} | {ms:.0f} | "
              f"{100 * ms / step_ms:.1f}% |")
    rest = step_ms - sum(total.values())
    print(f"| not oneDNN: the framework's own kernels and runtime | | | | {rest:.0f} | "
          f"{100 * rest / step_ms:.1f}% |\n")


# summary columns: (header, primitive kind, propagation kind prefix)
PARTS = (("conv forward", "convolution", "forward"),
         ("conv backward data", "convolution", "backward_data"),
         ("conv backward weights", "convolution", "backward_weights"),
         ("batch norm", "batch_normalization", ""), ("reorder", "reorder", ""))


def summary_row(args, case, isa, result):
    """One line of the summary: step time, img/s, ms per part, share in reference kernels."""
    if isinstance(result, str):
        return f"| {case} | {isa} | failed |" + " |" * (len(PARTS) + 4)
    step_ms, total, _, in_force = result
    parts = [sum(ms for (kind, _, prop), ms in total.items()
                 if kind == part_kind and prop.startswith(part_prop))
             for _, part_kind, part_prop in PARTS]
    other = sum(total.values()) - sum(parts)
    ref_ms = sum(ms for (_, impl, _), ms in total.items() if "ref" in impl)
    cells = [f"{ms:.1f}" for ms in parts + [other, step_ms - sum(total.values())]]
    return (f"| {case} | {isa} ({in_force}) | {step_ms:.0f} | "
            f"{1000 * args.batch_size / step_ms:.2f} | " + " | ".join(cells)
            + f" | {100 * ref_ms / step_ms:.1f}% |")


def main():
    args = parse_args()
    if args.worker:
        worker(args)
        return 0
    levels = [level for level in args.isa_levels.split(",") if level] or [None]
    rows, failed = [], False
    for case in args.case_names:
        for level in levels:
            shown = level or (os.environ.get(ISA_VAR, "AVX2") if takes_our_cap(case)
                              else "oneDNN's own")
            result = measure(args, case, level)
            if isinstance(result, str):
                print(f"{case}, {ISA_VAR}={shown}: {result}")
                failed = True
            else:
                print_breakdown(args, case, shown, result)
            rows.append(summary_row(args, case, shown, result))
            sys.stdout.flush()
    if len(rows) > 1:
        print(f"{args.net_name}, batch {args.batch_size}, {args.image_size} px, "
              f"{cpu_benchmark.environment_info()['cpu']}, ms per step "
              f"(mean of {args.steps} after {args.warmup_steps} warmup)\n\n"
              f"| case | {ISA_VAR} (isa in force) | step | img/s | "
              + " | ".join(header for header, _, _ in PARTS)
              + " | other oneDNN | not oneDNN | in ref kernels |\n"
              + "|---" * (len(PARTS) + 7) + "|")
        print("\n".join(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
