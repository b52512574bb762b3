"""Peak memory and step time of gradient accumulation (``grad_accumulation_steps``) on CPU.

    python benchmarks/accumulation_memory.py                       # ResNet-18, 224 px
    python benchmarks/accumulation_memory.py --net_name resnet50 --steps 2

``TrainStep`` accumulates across calls: each call runs one micro-batch of ``batch_size`` and
adds its gradients to buffers, every k-th call steps the optimizer (as ``Model`` feeds it in
train.py). Users turn accumulation on to fit a global batch in less memory; this measures
whether it does. Every case runs in a fresh process that builds the train step as train.py
does (``src.utils.config.parse_config`` then ``src.recipe.training_model``, fp32 as on CPU),
runs one warmup optimizer step (compile) on a fixed random micro-batch and ``--steps`` timed
optimizer steps of k calls each (wall time, and the process's CPU time, less sensitive to a
shared machine). Cases, at a fixed ``--global_batch`` G images per optimizer
step:

- ``accumulate k``: ``batch_size`` G / k, ``grad_accumulation_steps`` k: k calls of G / k
  images per optimizer step, for every k of ``--accumulation`` (k = 1 is the plain step);
- ``micro-batch only``: ``batch_size`` G / k without accumulation, one call of G / k images:
  the memory the micro-batch alone needs, which accumulation approaches (its buffers add
  one copy of the gradients).

Peak memory per case: ``ru_maxrss`` of the finished child (``os.wait4``; the harness does not
import MindSpore, so no large parent peak carries over the exec), and its split into the
peak up to the end of the warmup step (build + graph compile + first run) and the peak of
the timed steps alone (``VmHWM`` after resetting it through ``/proc/self/clear_refs``; it
starts from the RSS the warmup left, as MindSpore's memory pool keeps what it allocated).
Writes ``--output_dir``/``<net>_<size>px.md`` and ``.json``.
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from importlib import metadata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.cpu_benchmark import describe_cpu, median  # noqa: E402  (no MindSpore import)

DEFAULT_OUTPUT = os.path.join(ROOT, "benchmarks", "results", "accumulation_memory")


def parse_args(argv=None):
    """Command line of the harness and of its worker processes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--net_name", default="resnet18")
    parser.add_argument("--global_batch", type=int, default=32,
                        help="images per optimizer step (per device)")
    parser.add_argument("--accumulation", default="1,2,4",
                        help="comma-separated grad_accumulation_steps values")
    parser.add_argument("--image_size", type=int, default=224, help="pixels")
    parser.add_argument("--class_num", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per process")
    parser.add_argument("--rounds", type=int, default=1, help="processes per case, alternating")
    parser.add_argument("--output_dir", default=DEFAULT_OUTPUT)
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.ks = [int(k) for k in args.accumulation.split(",")]
    for key in ("global_batch", "image_size", "class_num", "steps", "rounds"):
        if getattr(args, key) < 1:
            parser.error(f"--{key} must be a positive integer, got {getattr(args, key)}")
    bad = [k for k in args.ks if k < 1 or args.global_batch % k]
    if bad:
        parser.error(f"--accumulation values must divide --global_batch {args.global_batch}: "
                     f"{bad}")
    return args


def cases(args):
    """Case name -> (batch_size, grad_accumulation_steps, images per optimizer step)."""
    table = {f"accumulate_{k}": (args.global_batch // k, k, args.global_batch) for k in args.ks}
    for k in args.ks:
        if k > 1:
            micro = args.global_batch // k
            table[f"micro_batch_{micro}"] = (micro, 1, micro)
    return table


# ---------------------------------------------------------------- worker side

def vm_field(name):
    """A kB field of ``/proc/self/status`` (VmHWM, VmRSS) in MiB."""
    with open("/proc/self/status", encoding="utf-8") as f:
        return int(re.search(rf"{name}:\s*(\d+) kB", f.read()).group(1)) / 1024


def reset_peak():
    """Reset this process's VmHWM to its current RSS (Linux 4.0+: clear_refs value 5)."""
    with open("/proc/self/clear_refs", "w", encoding="utf-8") as f:
        f.write("5")


def run_worker(args):
    """Build the case's TrainStep as train.py does, warm up, time ``steps`` optimizer steps
    (k calls of one micro-batch each); print JSON."""
    batch_size, k, _ = cases(args)[args.worker]
    from src.env import set_cpu_fast_path
    set_cpu_fast_path()
    import mindspore as ms
    import numpy as np

    from src.models.resnet import create_network
    from src.recipe import training_model
    from src.utils.config import parse_config
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)
    cfg = parse_config(["--net_name", args.net_name, "--class_num", str(args.class_num),
                        "--batch_size", str(batch_size), "--grad_accumulation_steps", str(k),
                        "--device_target", "CPU"])
    net = create_network(cfg.net_name, class_num=cfg.class_num,
                         zero_init_residual=cfg.zero_init_residual)
    step = training_model(cfg, net, 0.1, "O0")[0].train_network
    step.set_train(True)
    rng = np.random.default_rng(0)
    images = ms.Tensor(rng.standard_normal((batch_size, 3, args.image_size, args.image_size),
                                           dtype=np.float32))
    labels = ms.Tensor(rng.integers(0, args.class_num, batch_size, dtype=np.int32))

    def optimizer_step():
        for _ in range(k):
            step(images, labels).asnumpy()

    built_mb = vm_field("VmHWM")
    start = time.perf_counter()
    optimizer_step()
    warmup_s = time.perf_counter() - start
    warmup_peak_mb = vm_field("VmHWM")
    reset_peak()
    seconds, cpu_seconds = [], []
    for _ in range(args.steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        optimizer_step()
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(time.process_time() - cpu_start)
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "warmup_s": warmup_s,
                      "built_peak_mb": built_mb,
                      "warmup_peak_mb": warmup_peak_mb, "steps_peak_mb": vm_field("VmHWM")}))


# ---------------------------------------------------------------- harness side

def spawn(args, name):
    """Run one worker; its JSON result plus ``ru_maxrss_mb`` (the child's own peak RSS by
    ``os.wait4``), or {"error": last lines of its output}."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name]
    for key in ("net_name", "global_batch", "accumulation", "image_size", "class_num",
                "steps"):
        cmd += [f"--{key}", str(getattr(args, key))]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = [line for line in (stderr + stdout).splitlines() if line.strip()][-3:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    return dict(json.loads(lines[-1]), ru_maxrss_mb=usage.ru_maxrss / 1024)  # Linux: KiB


def environment_info():
    """CPU (model, family/model numbers, widest ISA), versions and thread budget."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = describe_cpu(f.read())
    except OSError:
        cpu = platform.processor() or platform.machine()
    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)),
            "mindspore": metadata.version("mindspore"), "python": platform.python_version(),
            "onednn_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "AVX2")}


def summarize(runs):
    """Per case over rounds: median s/step, worst peaks (MiB), median warmup; or the error."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return {"error": runs[-1]["error"]}
    return {"s_per_step": median([median(r["seconds"]) for r in good]),
            "cpu_s_per_step": median([median(r["cpu_seconds"]) for r in good]),
            "warmup_s": median([r["warmup_s"] for r in good]),
            **{key: max(r[key] for r in good)
               for key in ("ru_maxrss_mb", "built_peak_mb", "warmup_peak_mb", "steps_peak_mb")}}


def markdown(args, table, results, env):
    """The result table and the conclusion lines (Markdown)."""
    lines = [f"{args.net_name}, {args.image_size} px, fp32, graph mode, global batch "
             f"{args.global_batch} images per optimizer step, {env['cores']} cores, "
             f"{env['cpu']}, ONEDNN_MAX_CPU_ISA={env['onednn_isa']}; MindSpore "
             f"{env['mindspore']}; median over {args.rounds} round(s) x {args.steps} timed "
             f"steps, peaks the worst round.", "",
             "| case | batch_size x grad_accumulation_steps | images / optimizer step "
             "| peak RSS (MiB, ru_maxrss) | peak to end of warmup (MiB) "
             "| peak of the timed steps (MiB) | after build (MiB) | s / step | CPU s / step "
             "| img/s | warmup (compile + 1 optimizer step) s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, (batch_size, k, fed) in table.items():
        r = results[name]
        if "error" in r:
            lines.append(f"| {name} | {batch_size} x {k} | {fed} | failed: {r['error'][:200]} "
                         "|||||||")
            continue
        lines.append(f"| {name} | {batch_size} x {k} | {fed} | {r['ru_maxrss_mb']:.0f} "
                     f"| {r['warmup_peak_mb']:.0f} | {r['steps_peak_mb']:.0f} "
                     f"| {r['built_peak_mb']:.0f} | {r['s_per_step']:.2f} "
                     f"| {r['cpu_s_per_step']:.2f} | {fed / r['s_per_step']:.1f} "
                     f"| {r['warmup_s']:.0f} |")
    lines += [""] + conclusion(args, table, results)
    return "\n".join(lines) + "\n"


def conclusion(args, table, results):
    """One line per k > 1: the peak of the timed steps against k = 1 and the micro-batch."""
    base = results.get("accumulate_1", {})
    out = []
    for k in args.ks:
        acc = results.get(f"accumulate_{k}", {})
        micro = results.get(f"micro_batch_{args.global_batch // k}", {})
        if k == 1 or "error" in acc or "error" in base:
            continue
        change = 100 * (acc["steps_peak_mb"] / base["steps_peak_mb"] - 1)
        line = (f"- k = {k}: peak of the timed steps {acc['steps_peak_mb']:.0f} MiB vs "
                f"{base['steps_peak_mb']:.0f} MiB without accumulation ({change:+.0f}%)")
        if micro and "error" not in micro:
            line += (f"; the micro-batch of {args.global_batch // k} alone needs "
                     f"{micro['steps_peak_mb']:.0f} MiB")
        slow = acc["s_per_step"] / base["s_per_step"]
        cpu = acc["cpu_s_per_step"] / base["cpu_s_per_step"]
        line += f"; step time x{slow:.2f} (CPU time x{cpu:.2f})"
        if micro and "error" not in micro:
            line += (f", {k} micro-batch steps alone would take "
                     f"{k * micro['s_per_step']:.2f} s ({k * micro['cpu_s_per_step']:.2f} CPU s)")
        out.append(line + ".")
    return out


def main(argv=None):
    """Run every case ``rounds`` times, write the Markdown and JSON results; return 0."""
    args = parse_args(argv)
    if args.worker:
        run_worker(args)
        return 0
    table = cases(args)
    env = environment_info()
    runs = {name: [] for name in table}
    for round_index in range(args.rounds):
        order = list(table) if round_index % 2 == 0 else list(table)[::-1]
        for name in order:
            result = spawn(args, name)
            runs[name].append(result)
            shown = (f"{median(result['seconds']):.2f} s/step, peak {result['ru_maxrss_mb']:.0f}"
                     f" MiB (timed steps {result['steps_peak_mb']:.0f} MiB)"
                     if "error" not in result else result["error"][:300])
            print(f"round {round_index + 1}/{args.rounds} {name}: {shown}", flush=True)
    results = {name: summarize(r) for name, r in runs.items()}
    report = markdown(args, table, results, env)
    os.makedirs(args.output_dir, exist_ok=True)
    stem = os.path.join(args.output_dir, f"{args.net_name}_{args.image_size}px")
    with open(stem + ".md", "w", encoding="utf-8") as f:
        f.write(report)
    with open(stem + ".json", "w", encoding="utf-8") as f:
        json.dump({"args": {k: v for k, v in vars(args).items()
                            if k not in ("worker", "output_dir")},  # no machine paths
                   "environment": env, "cases": {n: list(c) for n, c in table.items()},
                   "runs": runs, "summary": results}, f, indent=1)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
