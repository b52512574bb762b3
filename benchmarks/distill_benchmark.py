"""Step time and peak memory of knowledge distillation (``kd_teacher``) on CPU: the training
step of a student with and without a frozen teacher inside it, in one harness run.

    python benchmarks/distill_benchmark.py                          # ResNet-18 student
    python benchmarks/distill_benchmark.py --student resnet50 --teachers resnet50,resnet101

Each case runs in a fresh process that builds the training step as train.py does
(``src.utils.config.parse_config`` then ``src.recipe.training_model``; the teacher from a
``.ckpt`` of random weights written once, which costs what trained ones cost), one warmup
step (compile) and ``--steps`` timed steps on a fixed random batch; cases alternate over
``--rounds``. Reported: the median wall and CPU (``process_time``, less sensitive to a shared
machine) seconds per step, their ratios to the student alone, the peak RSS over the timed
steps (``VmHWM``).
Writes ``--output_dir``/``<student>_<size>px.md`` and ``.json``.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.accumulation_memory import (  # noqa: E402  (no MindSpore import)
    environment_info,
    reset_peak,
    vm_field,
)
from benchmarks.cpu_benchmark import median  # noqa: E402

DEFAULT_OUTPUT = os.path.join(ROOT, "benchmarks", "results", "distill_benchmark")


def parse_args(argv=None):
    """Command line of the harness and of its worker processes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--student", default="resnet18")
    parser.add_argument("--teachers", default="resnet18,resnet50,resnet101",
                        help="comma-separated teacher networks")
    parser.add_argument("--distill_type", default="logit", choices=("logit", "feature"))
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--image_size", type=int, default=112, help="pixels")
    parser.add_argument("--class_num", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per process")
    parser.add_argument("--rounds", type=int, default=1, help="processes per case")
    parser.add_argument("--output_dir", default=DEFAULT_OUTPUT)
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--teacher_file", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.teacher_list = [t for t in args.teachers.split(",") if t]
    return args


def run_worker(args):
    """One case (``--worker`` "none" or a teacher network): build, warm up, time; print JSON."""
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
    kd = ([] if args.worker == "none" else
          ["--kd_teacher", args.teacher_file, "--kd_distill_type", args.distill_type])
    cfg = parse_config(["--net_name", args.student, "--class_num", str(args.class_num),
                        "--batch_size", str(args.batch_size), "--device_target", "CPU", *kd])
    net = create_network(cfg.net_name, class_num=cfg.class_num)
    step = training_model(cfg, net, 0.1, "O0")[0].train_network
    step.set_train(True)
    rng = np.random.default_rng(0)
    shape = (args.batch_size, 3, args.image_size, args.image_size)
    images = ms.Tensor(rng.standard_normal(shape, dtype=np.float32))
    labels = ms.Tensor(rng.integers(0, args.class_num, args.batch_size, dtype=np.int32))
    step(images, labels).asnumpy()  # compile
    reset_peak()
    seconds, cpu_seconds = [], []
    for _ in range(args.steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        step(images, labels).asnumpy()
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(time.process_time() - cpu_start)
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds,
                      "steps_peak_mb": vm_field("VmHWM")}))


def write_teacher(net_name, class_num, folder):
    """A ``.ckpt`` of a randomly initialized ``net_name`` in ``folder``; its path."""
    code = ("import sys, mindspore as ms; from src.models.resnet import create_network; "
            "ms.save_checkpoint(create_network(sys.argv[1], class_num=int(sys.argv[2])), "
            "sys.argv[3])")
    path = os.path.join(folder, f"{net_name}.ckpt")
    subprocess.run([sys.executable, "-c", code, net_name, str(class_num), path], check=True,
                   cwd=ROOT, capture_output=True)
    return path


def spawn(args, case, teacher_file):
    """One worker process; its JSON, or {"error": ...}."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", case,
           "--teacher_file", teacher_file]
    for key in ("student", "distill_type", "batch_size", "image_size", "class_num", "steps"):
        cmd += [f"--{key}", str(getattr(args, key))]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)
    stdout, stderr = proc.communicate()
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: " + " | ".join(stderr.splitlines()[-3:])}
    return json.loads(lines[-1])


def main(argv=None):
    """Run every case ``--rounds`` times, alternating; write the table."""
    args = parse_args(argv)
    if args.worker:
        run_worker(args)
        return 0
    env = environment_info()
    cases = ["none"] + args.teacher_list
    results = {case: [] for case in cases}
    with tempfile.TemporaryDirectory() as folder:
        files = {t: write_teacher(t, args.class_num, folder) for t in args.teacher_list}
        for _ in range(args.rounds):
            for case in cases:
                results[case].append(spawn(args, case, files.get(case, "")))
                print(case, json.dumps(results[case][-1]), flush=True)
    summary = {}
    for case, runs in results.items():
        good = [r for r in runs if "error" not in r]
        summary[case] = ({"s_per_step": median([median(r["seconds"]) for r in good]),
                          "cpu_s_per_step": median([median(r["cpu_seconds"]) for r in good]),
                          "steps_peak_mb": max(r["steps_peak_mb"] for r in good)}
                         if good else {"error": runs[-1]["error"]})
    base = summary["none"].get("s_per_step")
    cpu_base = summary["none"].get("cpu_s_per_step")
    lines = [f"student {args.student}, {args.distill_type} distillation, batch "
             f"{args.batch_size} at {args.image_size} px, {args.class_num} classes, fp32, "
             f"graph mode; {env['cores']} cores, {env['cpu']}, MindSpore {env['mindspore']}; "
             f"median over {args.rounds} round(s) x {args.steps} steps.", "",
             "| teacher | s/step | x student alone | CPU s/step | x student alone (CPU) | "
             "peak RSS of the steps (MiB) |",
             "|---|---:|---:|---:|---:|---:|"]
    for case, row in summary.items():
        if "error" in row:
            lines.append(f"| {case} | error: {row['error']} | | | | |")
            continue
        ratio = row["s_per_step"] / base if base else float("nan")
        cpu_ratio = row["cpu_s_per_step"] / cpu_base if cpu_base else float("nan")
        lines.append(f"| {case} | {row['s_per_step']:.3f} | {ratio:.2f} | "
                     f"{row['cpu_s_per_step']:.3f} | {cpu_ratio:.2f} | "
                     f"{row['steps_peak_mb']:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(args.output_dir, exist_ok=True)
    stem = os.path.join(args.output_dir, f"{args.student}_{args.image_size}px")
    with open(stem + ".md", "w", encoding="utf-8") as f:
        f.write(text)
    with open(stem + ".json", "w", encoding="utf-8") as f:
        # the output folder relative to the repository: no machine path in the results
        recorded = dict(vars(args), output_dir=os.path.relpath(args.output_dir, ROOT))
        json.dump({"args": recorded, "env": env, "results": results, "summary": summary},
                  f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
