"""CPU speed of our ResNet against the PyTorch reference, in one run.

    python benchmarks/cpu_benchmark.py                  # ResNet-50, batch 32, 224 px, 3 rounds
    python benchmarks/cpu_benchmark.py --update_docs    # also replace the table in docs/speed.md

Each case runs in a fresh process (its own peak RSS, oneDNN settings, compile caches) that
builds its network, runs one warmup (compile) call, then ``--steps`` timed calls and reports
their median. The cases run in rounds, one process per case per round, in alternating order,
so slow drift of a shared machine touches every case alike; the table gives the median over
rounds. Cases:

- ours: the train step (``TrainStep`` as train.py builds it); the full training loop
  (``Model.train`` on the real data pipeline over ``--data_path``);
  inference from a checkpoint (graph mode), from MindIR (``nn.GraphCell``) and from ONNX
  (ONNX Runtime), each exported as export.py does (BatchNorm folded) and without folding;
- the PyTorch reference (``tests/torch_resnet.py``, torchvision's layout) in NCHW,
  channels_last, and channels_last + ``torch.compile``, same shapes and thread count;
- the data pipeline alone on real full-size JPEGs, to compare with the train step's use, also
  with TrivialAugment wide + random erasing (p 0.1) on;
- float32 GEMMs (n=4096, ``--gemm_n``; torch.mm and ONNX Runtime's MatMul) for the machine's
  fp32 limit; the
  "% of fp32 limit" column is img/s x FLOPs per image (torch's FlopCounterMode, forward x3 for
  a train step) over the faster GEMM's FLOP/s.

Our cases run with the oneDNN ISA cap of the entry points (``src/env.py``: AVX2) unless
``ONEDNN_MAX_CPU_ISA`` is set for the harness; PyTorch's cases always get oneDNN's own choice.
``ONEDNN_MAX_CPU_ISA=ALL python benchmarks/cpu_benchmark.py --cases ms_train_step,ms_infer_ckpt``
measures what the cap buys. Speed is reported as ratios ours / PyTorch measured in the same
run; absolute img/s on a shared machine are noise. Writes ``--output_dir``/``cpu_benchmark.md``
and ``cpu_benchmark.json``.
Needs requirements-dev.txt (torch for the reference, onnx for the GEMM graph).
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
from collections import namedtuple
from importlib import metadata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEED_PAGE = os.path.join(ROOT, "docs", "speed.md")
TABLE_START, TABLE_END = "<!-- cpu-benchmark:start -->", "<!-- cpu-benchmark:end -->"
GEMM_N = 4096
ISA_VAR = "ONEDNN_MAX_CPU_ISA"
# a case that times itself: seconds per timed call, units per call, seconds of the warmup call
Measured = namedtuple("Measured", "seconds units_per_call warmup_s")


def parse_args(argv=None):
    """Command line of the harness and of its worker processes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--net_name", default="resnet50")
    parser.add_argument("--batch_size", type=int, default=32, help="images per step (per device)")
    parser.add_argument("--image_size", type=int, default=224, help="pixels")
    parser.add_argument("--class_num", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="processes per case, alternating")
    parser.add_argument("--steps", type=int, default=3, help="timed calls per process")
    parser.add_argument("--loop_steps", type=int, default=4,
                        help="batches per timed call of the training loop and data cases")
    parser.add_argument("--gemm_n", type=int, default=GEMM_N,
                        help="size n of the fp32 limit's n x n x n GEMMs")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="threads for PyTorch, ONNX Runtime and the data pipeline")
    parser.add_argument("--data_path", default=os.path.join(ROOT, "..", "shared", "data",
                                                            "imagenet_sample"),
                        help="class folders of real JPEGs for the loop and data cases")
    parser.add_argument("--cases", default="all", help="comma-separated subset of: all, "
                        + ", ".join(CASES))
    parser.add_argument("--output_dir", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--update_docs", action="store_true",
                        help=f"replace the table between {TABLE_START} and {TABLE_END} in "
                             "docs/speed.md")
    parser.add_argument("--from_json", default="",
                        help="do not measure: report the runs saved in this cpu_benchmark.json")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--artifacts", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = list(CASES) if args.cases == "all" else args.cases.split(",")
    unknown = [n for n in names if n not in CASES and n != "prepare"]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; valid: {', '.join(CASES)}")
    for key in ("batch_size", "image_size", "rounds", "steps", "loop_steps", "gemm_n",
                "threads"):
        if getattr(args, key) < 1:
            parser.error(f"--{key} must be a positive integer, got {getattr(args, key)}")
    args.case_names = names
    return args


# ---------------------------------------------------------------- worker side: MindSpore

def ms_setup():
    """Graph mode on CPU, as the entry points run (oneDNN capped by src.env before import)."""
    sys.path.insert(0, ROOT)
    from src.env import set_cpu_fast_path
    set_cpu_fast_path()
    import mindspore as ms
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)
    return ms


def random_batch(args):
    """A fixed float32 NCHW batch and int32 labels (numpy)."""
    import numpy as np
    rng = np.random.default_rng(0)
    images = rng.standard_normal((args.batch_size, 3, args.image_size, args.image_size))
    return images.astype(np.float32), rng.integers(0, args.class_num, args.batch_size, np.int32)


def ms_model(args):
    """``Model`` of a new network with config.yaml's training recipe (fp32, as on CPU), built
    by train.py's ``src.recipe.training_model`` (``TrainStep``: loss, momentum, weight decay
    groups)."""
    from src.models.resnet import create_network
    from src.recipe import training_model
    from src.utils.config import parse_config
    cfg = parse_config(["--net_name", args.net_name, "--class_num", str(args.class_num)])
    net = create_network(args.net_name, class_num=args.class_num)
    return training_model(cfg, net, 0.1, "O0")[0]


def ms_train_step(args):
    """One optimizer step of the network ``Model`` trains (forward, backward, momentum)."""
    ms = ms_setup()
    step = ms_model(args).train_network
    step.set_train(True)
    images, labels = (ms.Tensor(a) for a in random_batch(args))
    return lambda: step(images, labels).asnumpy() is not None and args.batch_size


def ms_train_loop(args):
    """``Model.train`` on the real training pipeline (decode, random crop, flip, normalize),
    as train.py runs an epoch, over 1 + steps x loop_steps batches; the first ``loop_steps``
    (compile) are the warmup, each later group of ``loop_steps`` steps one timed call. (No
    dataset sink mode case: MindSpore 2.10 has none on CPU; ``Model.train`` falls back to
    step by step.)"""
    ms_setup()
    from mindspore.train import Callback

    from src.data.pipeline import create_dataset
    from src.data.settings import TrainAugment

    class Clock(Callback):
        """Wall-clock time at the start and after every ``loop_steps`` steps."""

        def __init__(self):
            super().__init__()
            self.times, self.steps = [time.perf_counter()], 0

        def on_train_step_end(self, run_context):
            self.steps += 1
            if self.steps % args.loop_steps == 0:
                self.times.append(time.perf_counter())

    batches = (1 + args.steps) * args.loop_steps
    data = create_dataset(args.data_path, TrainAugment(image_size=args.image_size),
                          batch_size=args.batch_size, num_parallel_workers=args.threads)
    data = data.repeat(-(-batches // data.get_dataset_size())).take(batches)
    model = ms_model(args)
    clock = Clock()
    model.train(1, data, callbacks=[clock], dataset_sink_mode=False)
    times = clock.times
    return Measured([b - a for a, b in zip(times[1:], times[2:])],
                    args.loop_steps * args.batch_size, times[1] - times[0])


def ms_infer_ckpt(args):
    """Forward pass of the network loaded from a checkpoint, as eval.py runs it."""
    ms = ms_setup()
    from src.deploy.inference import load_network
    net = load_network(args.net_name, args.class_num, os.path.join(args.artifacts, "net.ckpt"))
    images = ms.Tensor(random_batch(args)[0])
    return lambda: net(images).asnumpy() is not None and args.batch_size


def ms_infer_mindir(args, name="net"):
    """Forward pass of the exported MindIR in ``nn.GraphCell``."""
    ms = ms_setup()
    from src.deploy.inference import load_mindir
    net = load_mindir(os.path.join(args.artifacts, name + ".mindir"))
    images = ms.Tensor(random_batch(args)[0])
    return lambda: net(images).asnumpy() is not None and args.batch_size


def ort_session(path, threads):
    """An ONNX Runtime CPU session (all graph optimizations, ``threads`` intra-op threads)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def ort_infer(args, name="net"):
    """Forward pass of the exported ONNX file in ONNX Runtime."""
    session = ort_session(os.path.join(args.artifacts, name + ".onnx"), args.threads)
    feed = {session.get_inputs()[0].name: random_batch(args)[0]}
    return lambda: session.run(None, feed) is not None and args.batch_size


def data_pipeline(args, augment=None):
    """The training data pipeline alone: one iterator over the repeated dataset; each call
    pulls ``loop_steps`` batches (the first call also starts the pipeline). ``augment``: extra
    ``TrainAugment`` fields."""
    ms_setup()
    from src.data.pipeline import create_dataset
    from src.data.settings import TrainAugment
    data = create_dataset(args.data_path,
                          TrainAugment(image_size=args.image_size, **(augment or {})),
                          batch_size=args.batch_size, num_parallel_workers=args.threads)
    batches = data.repeat().create_tuple_iterator(output_numpy=True)

    def run():
        for _ in range(args.loop_steps):
            next(batches)
        return args.loop_steps * args.batch_size
    return run


# the file each inference case loads (``prepare`` writes it)
LOADED_FILES = {"ms_infer_ckpt": "net.ckpt", "ms_infer_mindir": "net.mindir",
                "ms_infer_mindir_unfolded": "net_unfolded.mindir", "ort_infer": "net.onnx",
                "ort_infer_unfolded": "net_unfolded.onnx", "ort_infer_int8": "net_int8.onnx"}


def prepare(args):
    """Write the files the chosen inference cases load (random weights, BN statistics as
    initialized): net.ckpt; net.mindir / net.onnx exported as export.py does by default
    (BatchNorm folded), net_unfolded.mindir / .onnx without folding, and net_int8.onnx (from
    net.onnx). A file no chosen case loads is not written."""
    ms = ms_setup()
    from src.deploy.formats import export_model
    from src.models.bn_fold import fold_batchnorm
    from src.models.resnet import create_network
    needed = {LOADED_FILES[name] for name in args.case_names if name in LOADED_FILES}
    if "net_int8.onnx" in needed:
        needed.add("net.onnx")
    dummy = ms.Tensor(random_batch(args)[0])
    ckpt = os.path.join(args.artifacts, "net.ckpt")
    for name in ("net_unfolded", "net"):  # a fresh network each: no graph cached across
        net = create_network(args.net_name, class_num=args.class_num)
        if name == "net_unfolded":
            ms.save_checkpoint(net, ckpt)
        else:
            ms.load_checkpoint(ckpt, net)
            fold_batchnorm(net)
        net.set_train(False)
        for file_format in ("MINDIR", "ONNX"):
            if f"{name}.{file_format.lower()}" in needed:
                export_model(net, dummy, os.path.join(args.artifacts, name), file_format)
    if "net_int8.onnx" in needed:
        quantize_net(args)


class OneBatch:
    """ONNX Runtime calibration data reader (``get_next``) giving one fixed batch."""

    def __init__(self, images):
        self.batches = [{"image": images}]

    def get_next(self):
        return self.batches.pop() if self.batches else None


def quantize_net(args):
    """net_int8.onnx: net.onnx quantized as ``export.py --quantize int8`` does
    (``src.deploy.quantize.quantize_int8``), calibrated on the fixed random batch (the ranges do not
    change the speed)."""
    from src.deploy.quantize import quantize_int8
    with tempfile.TemporaryDirectory(dir=args.artifacts) as workdir:
        quantize_int8(os.path.join(args.artifacts, "net.onnx"),
                      os.path.join(args.artifacts, "net_int8.onnx"),
                      OneBatch(random_batch(args)[0]), workdir)


def ort_gemm(args):
    """A float32 n x n x n MatMul (n: ``--gemm_n``) in ONNX Runtime (MLAS, AVX-512 where the
    CPU has it)."""
    import numpy as np
    from onnx import TensorProto, helper
    shape = [args.gemm_n, args.gemm_n]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], "gemm",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "ab"],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = os.path.join(args.artifacts, "gemm.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    session = ort_session(path, args.threads)
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal(shape, dtype=np.float32) for n in "ab"}
    return lambda: session.run(None, feed) is not None and 2 * args.gemm_n ** 3


# ---------------------------------------------------------------- worker side: PyTorch

def torch_network(args, channels_last, compiled):
    """The torchvision-layout reference, its input batch and the callable to run."""
    import torch
    sys.path.insert(0, ROOT)
    from tests.torch_resnet import torch_resnet
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    net = torch_resnet(args.net_name, num_classes=args.class_num)
    images, labels = (torch.from_numpy(a) for a in random_batch(args))
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    return net, (torch.compile(net) if compiled else net), images, labels.long()


def torch_train(args, channels_last=False, compiled=False):
    """One SGD step (momentum 0.875, label smoothing 0.1) of the PyTorch reference."""
    import torch
    net, forward, images, labels = torch_network(args, channels_last, compiled)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.875)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    net.train()

    def step():
        optimizer.zero_grad()
        loss_fn(forward(images), labels).backward()
        optimizer.step()
        return args.batch_size
    return step


def torch_infer(args, channels_last=False, compiled=False):
    """Forward pass of the PyTorch reference in eval mode under ``inference_mode``."""
    import torch
    net, forward, images, _ = torch_network(args, channels_last, compiled)
    net.eval()

    def run():
        with torch.inference_mode():
            forward(images)
        return args.batch_size
    return run


def torch_gemm(args):
    """A float32 n x n x n matrix product (n: ``--gemm_n``) in torch (MKL)."""
    import torch
    torch.set_num_threads(args.threads)
    a, b = torch.randn(args.gemm_n, args.gemm_n), torch.randn(args.gemm_n, args.gemm_n)
    return lambda: torch.mm(a, b) is not None and 2 * args.gemm_n ** 3


def forward_flops(args):
    """FLOPs of one image's forward pass (convolutions and fc), by torch's FlopCounterMode."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    sys.path.insert(0, ROOT)
    from tests.torch_resnet import torch_resnet
    net = torch_resnet(args.net_name, num_classes=args.class_num).eval()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        net(torch.zeros(1, 3, args.image_size, args.image_size))
    return counter.get_total_flops()


# ---------------------------------------------------------------- the cases
AUGMENTED_PIPELINE = dict(auto_augment="trivialaugment_wide", random_erasing=0.1)
# data case -> the start of its report line
DATA_LINES = {"data_pipeline": "Data pipeline alone",
              "data_pipeline_augmented": "Data pipeline with TrivialAugment wide + random "
                                         "erasing 0.1"}
# name: (kind, label, builder, needs the oneDNN ISA cap of our entry points)
CASES = {
    "ms_train_step": ("train", "ours: train step", ms_train_step, True),
    "ms_train_loop": ("train", "ours: Model.train + data pipeline", ms_train_loop, True),
    "torch_train_nchw": ("train", "PyTorch NCHW", torch_train, False),
    "torch_train_channels_last": ("train", "PyTorch channels_last",
                                  lambda a: torch_train(a, channels_last=True), False),
    "torch_train_compile": ("train", "PyTorch channels_last + compile",
                            lambda a: torch_train(a, True, True), False),
    "ms_infer_ckpt": ("infer", "ours: checkpoint, graph mode", ms_infer_ckpt, True),
    "ms_infer_mindir": ("infer", "ours: MindIR (BN folded) in GraphCell", ms_infer_mindir,
                        True),
    "ms_infer_mindir_unfolded": ("infer", "ours: MindIR, BN not folded, in GraphCell",
                                 lambda a: ms_infer_mindir(a, "net_unfolded"), True),
    "ort_infer": ("infer", "ours: ONNX (BN folded) in ONNX Runtime", ort_infer, False),
    "ort_infer_unfolded": ("infer", "ours: ONNX, BN not folded, in ONNX Runtime",
                           lambda a: ort_infer(a, "net_unfolded"), False),
    "ort_infer_int8": ("infer", "ours: ONNX int8 (export.py --quantize int8) in ONNX Runtime",
                       lambda a: ort_infer(a, "net_int8"), False),
    "torch_infer_nchw": ("infer", "PyTorch NCHW", torch_infer, False),
    "torch_infer_channels_last": ("infer", "PyTorch channels_last",
                                  lambda a: torch_infer(a, channels_last=True), False),
    "torch_infer_compile": ("infer", "PyTorch channels_last + compile",
                            lambda a: torch_infer(a, True, True), False),
    "data_pipeline": ("data", "ours: data pipeline alone (JPEG decode + augment)",
                      data_pipeline, True),
    "data_pipeline_augmented": ("data", "ours: data pipeline alone + TrivialAugment wide + "
                                "random erasing 0.1",
                                lambda a: data_pipeline(a, AUGMENTED_PIPELINE), True),
    "gemm_torch": ("gemm", "fp32 GEMM, torch.mm", torch_gemm, False),
    "gemm_ort": ("gemm", "fp32 GEMM, ONNX Runtime MatMul", ort_gemm, False),
}
TORCH_REFERENCES = {"train": ("torch_train_nchw", "torch_train_channels_last",
                              "torch_train_compile"),
                    "infer": ("torch_infer_nchw", "torch_infer_channels_last",
                              "torch_infer_compile")}


def peak_rss_mb():
    """Peak resident memory of this process, MiB (VmHWM: unlike getrusage's maximum, it does
    not carry over the parent's peak across fork + exec)."""
    with open("/proc/self/status", encoding="utf-8") as f:
        return int(re.search(r"VmHWM:\s*(\d+) kB", f.read()).group(1)) / 1024


def run_worker(args):
    """In a worker process: build the case, warm up, time ``steps`` calls; print JSON."""
    if args.worker == "prepare":
        prepare(args)
        print(json.dumps({"prepared": args.artifacts}))
        return
    if args.worker == "flops":
        print(json.dumps({"forward_flops": forward_flops(args)}))
        return
    call = CASES[args.worker][2](args)
    if not isinstance(call, Measured):
        call = time_calls(call, args.steps)
    print(json.dumps(dict(call._asdict(), peak_rss_mb=peak_rss_mb())))


def time_calls(call, steps):
    """One warmup (compile) call of ``call``, then ``steps`` timed calls."""
    start = time.perf_counter()
    call()
    warmup_s = time.perf_counter() - start
    seconds, units = [], 0
    for _ in range(steps):
        start = time.perf_counter()
        units = call()
        seconds.append(time.perf_counter() - start)
    return Measured(seconds, units, warmup_s)


# ---------------------------------------------------------------- harness side

def spawn(args, worker, case_needs_isa_cap):
    """Run one worker process; its JSON line, or {"error": last lines of its output}."""
    env = dict(os.environ)
    if not case_needs_isa_cap:
        env.pop(ISA_VAR, None)  # PyTorch's oneDNN picks its own ISA
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", worker,
           "--artifacts", args.artifacts]
    for key in ("net_name", "batch_size", "image_size", "class_num", "steps", "loop_steps",
                "gemm_n", "threads", "data_path", "cases"):
        cmd += [f"--{key}", str(getattr(args, key))]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=ROOT)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = [line for line in (out.stderr + out.stdout).splitlines() if line.strip()][-3:]
        return {"error": f"exit {out.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1])


def median(values):
    """Median (mean of the middle two for an even count)."""
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def summarize(runs):
    """Per-case summary over rounds: median rate (units/s), min, max, peak RSS, errors."""
    rates = [r["units_per_call"] / median(r["seconds"]) for r in runs if "error" not in r]
    errors = [r["error"] for r in runs if "error" in r]
    if not rates:
        return {"error": errors[-1]}
    return {"rate": median(rates), "rate_min": min(rates), "rate_max": max(rates),
            "rounds": len(rates), "errors": errors,
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs if "error" not in r),
            "warmup_s": median([r["warmup_s"] for r in runs if "error" not in r])}


def fp32_limits(results, flops):
    """img/s the fastest GEMM allows for inference and for a train step (3x forward FLOPs).
    A limit takes each GEMM's best round (interference only ever slows a round down)."""
    rates = {n: r["rate_max"] for n, r in results.items()
             if CASES[n][0] == "gemm" and "rate" in r}
    if not rates or not flops:
        return None
    best = max(rates, key=rates.get)
    return {"gemm_gflops": {n: r / 1e9 for n, r in rates.items()}, "gemm": best,
            "forward_gflop_per_image": flops / 1e9,
            "infer": rates[best] / flops, "train": rates[best] / (3 * flops)}


def markdown(args, results, limits, environment):
    """The result table (Markdown) and the data-pipeline line."""
    ref_names = ["NCHW", "channels_last", "channels_last + compile"]
    lines = [f"{args.net_name}, batch {args.batch_size}, {args.image_size} px, fp32, "
             f"{args.threads} threads, {environment['cpu']}, ours with ONEDNN_MAX_CPU_ISA="
             f"{environment.get('mindspore_onednn_isa', 'AVX2')}; median over {args.rounds} "
             f"rounds "
             f"x {args.steps} timed calls; MindSpore {environment['mindspore']}, PyTorch "
             f"{environment['torch']}, ONNX Runtime {environment['onnxruntime']}.", "",
             "| | case | img/s | range over rounds | " + " | ".join(
                 f"ours / PyTorch {n}" for n in ref_names)
             + " | % of fp32 limit | peak RSS (MiB) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, result in results.items():
        kind, label = CASES[name][0], CASES[name][1]
        if kind not in ("train", "infer"):
            continue
        if "error" in result:
            lines.append(f"| {kind} | {label} | failed: {result['error'][:200]} |||||||")
            continue
        ratios = []
        ours = name.startswith(("ms_", "ort_"))
        for ref in TORCH_REFERENCES[kind]:
            ref_rate = results.get(ref, {}).get("rate")
            ratios.append(f"{result['rate'] / ref_rate:.2f}x" if ours and ref_rate else "")
        fp32 = "int8" not in name  # an fp32 limit says nothing of int8 kernels
        limit = f"{100 * result['rate'] / limits[kind]:.0f}%" if limits and fp32 else ""
        lines.append(f"| {kind} | {label} | {result['rate']:.2f} | {result['rate_min']:.2f}"
                     f"-{result['rate_max']:.2f} | " + " | ".join(ratios)
                     + f" | {limit} | {result['peak_rss_mb']:.0f} |")
    lines.append("")
    if limits:
        gemms = ", ".join(f"{CASES[n][1].split(', ')[1]} {g:.0f}"
                          for n, g in limits["gemm_gflops"].items())
        lines.append(f"fp32 limit: the fastest GEMM (n={args.gemm_n}, best round, GFLOP/s: "
                     f"{gemms}); "
                     f"{limits['forward_gflop_per_image']:.2f} GFLOP per image forward -> "
                     f"{limits['infer']:.1f} img/s inference, {limits['train']:.1f} img/s "
                     f"training (3x forward).")
    step = results.get("ms_train_step", {})
    for name, title in DATA_LINES.items():
        data = results.get(name, {})
        if "rate" in data and "rate" in step:
            lines.append(f"{title}: {data['rate']:.1f} img/s of real JPEGs with {args.threads} "
                         f"workers = {data['rate'] / step['rate']:.1f}x what the train step "
                         f"consumes ({step['rate']:.2f} img/s).")
    return "\n".join(lines) + "\n"


# widest first: (flags that must all be present, name)
ISA_LEVELS = ((("amx_tile",), "AMX"), (("avx512f", "avx512_vnni", "avx512_bf16"),
                                       "AVX-512 with VNNI and BF16"),
              (("avx512f", "avx512_vnni"), "AVX-512 with VNNI"), (("avx512f",), "AVX-512"),
              (("avx2",), "AVX2"))


def describe_cpu(cpuinfo):
    """Model name, family/model numbers and widest vector ISA from ``/proc/cpuinfo`` text.

    Returns:
        str: e.g. "AMD EPYC (family 26, model 2; widest ISA AVX-512 with VNNI and BF16)";
        the fields that are missing are left out.
    """
    def field(name):
        match = re.search(rf"^{name}\s*:\s*(.*)$", cpuinfo, re.M)
        return match.group(1).strip() if match else None
    flags = set((field("flags") or "").split())
    widest = next((name for needed, name in ISA_LEVELS if flags.issuperset(needed)),
                  "below AVX2")
    ids = (f"family {field('cpu family')}, model {field('model')}; "
           if field("cpu family") and field("model") else "")
    return f"{field('model name') or platform.machine()} ({ids}widest ISA {widest})"


def environment_info():
    """Versions and CPU (model, family/model numbers, widest ISA) for the table's heading."""
    def version(package):
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "not installed"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = describe_cpu(f.read())
    except OSError:
        cpu = platform.processor() or platform.machine()
    return {"cpu": cpu, "python": platform.python_version(),
            "mindspore_onednn_isa": os.environ.get(ISA_VAR, "AVX2"),
            "mindspore": version("mindspore"), "torch": version("torch"),
            "onnxruntime": version("onnxruntime")}


def update_docs(table, path=SPEED_PAGE):
    """Replace the text between the benchmark markers of ``path`` with ``table``.

    Raises:
        ValueError: If the file lacks the markers (names the file).
    """
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if TABLE_START not in text or TABLE_END not in text:
        raise ValueError(f"{path} has no {TABLE_START} ... {TABLE_END} block")
    head, rest = text.split(TABLE_START, 1)
    tail = rest.split(TABLE_END, 1)[1]
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{head}{TABLE_START}\n{table}{TABLE_END}{tail}")


def measure(args):
    """Run every case ``rounds`` times in alternating order.

    Returns:
        tuple(dict, float): the worker results per case (one per round), and the forward
        FLOPs of one image (None without torch).
    """
    with tempfile.TemporaryDirectory() as artifacts:
        args.artifacts = artifacts
        if any(CASES[n][0] == "infer" for n in args.case_names):
            prepared = spawn(args, "prepare", True)
            if "error" in prepared:
                raise RuntimeError(f"preparing the inference files failed: {prepared['error']}")
        runs = {name: [] for name in args.case_names}
        for round_index in range(args.rounds):
            order = args.case_names if round_index % 2 == 0 else args.case_names[::-1]
            for name in order:
                result = spawn(args, name, CASES[name][3])
                runs[name].append(result)
                shown = (f"{result['units_per_call'] / median(result['seconds']):.4g}/s"
                         if "error" not in result else result["error"][:300])
                print(f"round {round_index + 1}/{args.rounds} {name}: {shown}", flush=True)
        return runs, spawn(args, "flops", False).get("forward_flops")


def main():
    args = parse_args()
    if args.worker:
        run_worker(args)
        return 0
    if args.from_json:  # report a saved run again (e.g. after a change of the report)
        with open(args.from_json, encoding="utf-8") as f:
            saved = json.load(f)
        for key, value in saved["args"].items():
            if key not in ("data_path", "output_dir"):  # this invocation's own
                setattr(args, key, value)
        runs, environment = saved["runs"], saved["environment"]
        flops = (saved["fp32_limit"] or {}).get("forward_gflop_per_image", 0) * 1e9
        command = saved["command"]
    else:
        environment = environment_info()
        runs, flops = measure(args)
        command = " ".join(["python"] + sys.argv)
    results = {name: summarize(r) for name, r in runs.items()}
    limits = fp32_limits(results, flops)
    table = markdown(args, results, limits, environment)
    print("\n" + table)
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "cpu_benchmark.md"), "w", encoding="utf-8") as f:
        f.write(table)
    recorded = {k: v for k, v in vars(args).items()
                if k not in ("worker", "artifacts", "from_json", "update_docs")}
    for key in ("data_path", "output_dir"):  # relative to the repository, as in the docs
        recorded[key] = os.path.relpath(os.path.abspath(recorded[key]), ROOT)
    record = {"args": recorded,
              "environment": environment, "fp32_limit": limits, "results": results,
              "runs": runs, "command": command}
    with open(os.path.join(args.output_dir, "cpu_benchmark.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    if args.update_docs:
        update_docs(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
