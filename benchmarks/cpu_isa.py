"""Benchmark: ResNet-50 training and inference on CPU with and without the oneDNN ISA cap.

MindSpore 2.10's oneDNN runs NCHW convolutions with a reference kernel on AVX-512 CPUs;
the entry points cap oneDNN at AVX2 (src/env.py). This script measures both settings, each
in a fresh process (oneDNN reads ONEDNN_MAX_CPU_ISA once, at load), and the PyTorch
reference (NCHW, fp32, same shapes and thread count) in the same run when torch is
installed. Speed is reported as ratios; absolute img/s on a shared machine are noise.

    python benchmarks/cpu_isa.py --batch_size 8 --image_size 224 --steps 3
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = {"AVX2 (default of our entry points)": "AVX2",
            "oneDNN's own choice (ONEDNN_MAX_CPU_ISA=ALL)": "ALL"}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch_size", type=int, default=8, help="images per step")
    parser.add_argument("--image_size", type=int, default=224, help="pixels")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warmup step")
    parser.add_argument("--net_name", default="resnet50")
    parser.add_argument("--json", default="", help="also write the results to this file")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    return parser.parse_args()


def time_steps(step, steps):
    """Median seconds of ``steps`` calls of ``step`` after one warmup (compile) call."""
    step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def mindspore_worker(args):
    """Measure our network in this process; print one JSON line."""
    import mindspore as ms
    import numpy as np

    sys.path.insert(0, ROOT)
    from src.loss import CrossEntropySmooth
    from src.optimizer import create_optimizer
    from src.resnet import create_network

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((args.batch_size, 3, args.image_size, args.image_size)),
                  ms.float32)
    y = ms.Tensor(rng.integers(0, 1000, args.batch_size), ms.int32)
    net = create_network(args.net_name)
    train_step = ms.nn.TrainOneStepCell(
        ms.nn.WithLossCell(net, CrossEntropySmooth(0.1, 1000)),
        create_optimizer(net, 0.1, 0.875, 3.0517578125e-05))
    train_step.set_train(True)
    train_s = time_steps(lambda: train_step(x, y).asnumpy(), args.steps)
    net.set_train(False)
    infer_s = time_steps(lambda: net(x).asnumpy(), args.steps)
    return train_s, infer_s


def torch_worker(args):
    """Measure a torch ResNet-50 v1.5 (NCHW, fp32) in this process."""
    import torch
    import torch.nn as tnn

    sys.path.insert(0, ROOT)
    from tests.torch_resnet import torch_resnet

    torch.manual_seed(0)
    net = torch_resnet(args.net_name)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    y = torch.randint(0, 1000, (args.batch_size,))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.875)
    loss_fn = tnn.CrossEntropyLoss(label_smoothing=0.1)

    def train():
        opt.zero_grad()
        loss_fn(net(x), y).backward()
        opt.step()

    net.train()
    train_s = time_steps(train, args.steps)
    net.eval()
    with torch.no_grad():
        infer_s = time_steps(lambda: net(x), args.steps)
    return train_s, infer_s


def run_worker(args, kind, isa):
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA=isa)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind,
           "--batch_size", str(args.batch_size), "--image_size", str(args.image_size),
           "--steps", str(args.steps), "--net_name", args.net_name]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr or out.stdout).strip().splitlines()[-1:]}
    return json.loads(lines[-1])


def main():
    args = parse_args()
    if args.worker:
        train_s, infer_s = (torch_worker if args.worker == "torch" else mindspore_worker)(args)
        print(json.dumps({"train_img_s": args.batch_size / train_s,
                          "infer_img_s": args.batch_size / infer_s}))
        return
    results = {name: run_worker(args, "mindspore", isa) for name, isa in SETTINGS.items()}
    if importlib.util.find_spec("torch"):  # optional reference
        results["PyTorch NCHW fp32 (reference)"] = run_worker(args, "torch", "ALL")
    reference = results.get("PyTorch NCHW fp32 (reference)")
    print(f"\n{args.net_name}, batch {args.batch_size}, {args.image_size} px, fp32, "
          f"{os.cpu_count()} CPUs, median of {args.steps} steps\n")
    print("| setting | train img/s | infer img/s | train vs PyTorch | infer vs PyTorch |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        if "error" in r:
            print(f"| {name} | failed: {r['error']} | | | |")
            continue
        ratio = ("| {:.2f}x | {:.2f}x".format(r["train_img_s"] / reference["train_img_s"],
                                             r["infer_img_s"] / reference["infer_img_s"])
                 if reference and "error" not in reference else "| - | -")
        print(f"| {name} | {r['train_img_s']:.2f} | {r['infer_img_s']:.2f} {ratio} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
