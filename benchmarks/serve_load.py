"""Load on serve.py: images/s and p50/p99 latency of POST /predict at several concurrencies, with
and without dynamic batching, against the same ONNX model run directly in one process.

    python benchmarks/serve_load.py --models r50.onnx,r50_int8.onnx

For each model file: first the ceiling, in this process: ONNX Runtime on batches of
``--max_batch_size`` images (a) preprocessed beforehand (the model alone) and (b) decoded and
preprocessed each time as the server does (``preprocess_encoded``, one thread); then serve.py
in a process of its own on a free loopback port, once with ``--max_batch_size`` and
``--max_wait_ms`` (dynamic batching) and once with ``--max_batch_size 1`` (each request alone),
each loaded by an async httpx client in this process at each ``--concurrency``: every client
sends one JPEG per request (raw body), the next as soon as its answer comes, for ``--seconds``
(at most ``--max_requests`` requests) after a warm-up of two requests per client. The load
generator shares the machine with the server; the load average before and after each run is
recorded. Writes ``--output_dir``/serve_load.md and serve_load.json. See docs/serving.md.
"""
import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from importlib import metadata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.accumulation_memory import environment_info  # noqa: E402  (no MindSpore)

DEFAULT_OUTPUT = os.path.join(ROOT, "benchmarks", "results", "serve_load")
SHARED_IMAGES = os.path.join(os.path.dirname(ROOT), "shared", "data", "imagenet_sample")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", required=True, help="comma-separated .onnx files (224 px)")
    parser.add_argument("--images", default=SHARED_IMAGES,
                        help="a folder of JPEGs (class sub-folders read too)")
    parser.add_argument("--image_count", type=int, default=64, help="images sent in turn")
    parser.add_argument("--concurrency", default="1,4,16", help="clients at once")
    parser.add_argument("--seconds", type=float, default=15.0, help="per measurement")
    parser.add_argument("--max_requests", type=int, default=3000, help="per measurement")
    parser.add_argument("--max_batch_size", type=int, default=16)
    parser.add_argument("--max_wait_ms", type=float, default=5.0)
    parser.add_argument("--ceiling_seconds", type=float, default=15.0)
    parser.add_argument("--output_dir", default=DEFAULT_OUTPUT)
    return parser.parse_args(argv)


def load_images(folder, count):
    """The bytes of the first ``count`` images of ``folder`` (as predict.py lists them)."""
    from src.deploy.inference import list_images

    paths = list_images(folder)[:count]
    return [open(p, "rb").read() for p in paths]


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def ceiling(model, images, args):
    """images/s of ONNX Runtime on ``model`` in this process, batches of max_batch_size:
    ``model`` alone on preprocessed images, and decode + preprocess + model."""
    import numpy as np

    from src.data.settings import EvalPreprocess
    from src.data.transforms import create_transforms
    from src.deploy.inference import load_onnx, preprocess_encoded

    forward, _ = load_onnx(model)
    ops = create_transforms(EvalPreprocess())
    batch = args.max_batch_size
    data = [np.frombuffer(images[i % len(images)], np.uint8) for i in range(batch)]
    ready = np.stack([preprocess_encoded(d, ops, "image") for d in data])
    forward(ready)  # warm-up
    out = {}
    for name, step in (("model_only", lambda: forward(ready)),
                       ("decode_and_model", lambda: forward(np.stack(
                           [preprocess_encoded(d, ops, "image") for d in data])))):
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < args.ceiling_seconds:
            step()
            calls += 1
        out[name] = calls * batch / (time.perf_counter() - start)
    return out


async def load(url, images, concurrency, args):
    """``concurrency`` clients POSTing images until ``--seconds`` or ``--max_requests``:
    images/s, p50 and p99 latency (ms), requests, errors."""
    import httpx

    latencies, errors, sent = [], 0, 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120.0, limits=limits) as client:
        async def post(i):
            return await client.post(f"{url}/predict", content=images[i % len(images)],
                                     headers={"Content-Type": "image/jpeg"})

        await asyncio.gather(*(post(i) for i in range(2 * concurrency)))  # warm-up
        stop_at = time.perf_counter() + args.seconds

        async def client_loop(worker):
            nonlocal errors, sent
            i = worker
            while time.perf_counter() < stop_at and sent < args.max_requests:
                sent += 1
                started = time.perf_counter()
                response = await post(i)
                if response.status_code == 200:
                    latencies.append(time.perf_counter() - started)
                else:
                    errors += 1
                i += concurrency

        start = time.perf_counter()
        await asyncio.gather(*(client_loop(w) for w in range(concurrency)))
        elapsed = time.perf_counter() - start
    return {"images_per_s": len(latencies) / elapsed, "requests": len(latencies),
            "errors": errors, "p50_ms": 1000 * percentile(latencies, 50),
            "p99_ms": 1000 * percentile(latencies, 99)}


def start_server(model, max_batch_size, args, log):
    """serve.py on a free loopback port; its process and URL once /health says ready."""
    import httpx

    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "serve.py"),
                             "--checkpoint_path", model, "--port", "0",
                             "--max_batch_size", str(max_batch_size),
                             "--max_wait_ms", str(args.max_wait_ms)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline, url = time.time() + 300, None
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
        if url is None:
            found = re.search(r"http://[\d.]+:\d+", open(log.name).read())
            url = found.group(0) if found else None
        elif httpx.get(f"{url}/health").status_code == 200:
            return proc, url
    proc.kill()
    raise RuntimeError(f"serve.py did not become ready: {open(log.name).read()[-2000:]}")


def measure(args):
    images = load_images(args.images, args.image_count)
    levels = [int(c) for c in args.concurrency.split(",")]
    results = {"environment": {**environment_info(),
                               "onnxruntime": metadata.version("onnxruntime"),
                               "images": f"{len(images)} JPEGs of "
                                         f"{os.path.relpath(args.images, ROOT)}"},
               "settings": {**{k: v for k, v in vars(args).items()
                               if k not in ("output_dir", "models", "images")},
                            "models": [os.path.basename(m) for m in args.models.split(",")],
                            "images": os.path.relpath(args.images, ROOT)},
               "models": {}}
    for model in args.models.split(","):
        entry = results["models"][os.path.basename(model)] = {"bytes": os.path.getsize(model)}
        entry["load_before_ceiling"] = os.getloadavg()[0]
        entry["ceiling"] = ceiling(model, images, args)
        print(model, "ceiling", entry["ceiling"], flush=True)
        for mode, batch in (("batching", args.max_batch_size), ("one_by_one", 1)):
            with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
                proc, url = start_server(model, batch, args, log)
                try:
                    for level in levels:
                        before = os.getloadavg()[0]
                        point = asyncio.run(load(url, images, level, args))
                        point.update(load_before=before, load_after=os.getloadavg()[0])
                        entry.setdefault(mode, {})[str(level)] = point
                        print(model, mode, level, point, flush=True)
                finally:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(120)
    return results


def markdown(results):
    env = results["environment"]
    settings = results["settings"]
    lines = [f"{env['cpu']}, {env['cores']} cores (shared), ONNX Runtime "
             f"{env['onnxruntime']}, MindSpore {env['mindspore']}; {env['images']}; "
             f"{settings['seconds']:.0f} s per point, max_batch_size {settings['max_batch_size']}"
             f", max_wait_ms {settings['max_wait_ms']:g}; the load generator runs on the same "
             f"cores.", "",
             "| model | server | clients | images/s | p50 ms | p99 ms | % of ceiling (decode + "
             "model) | load avg before / after |", "|---|---|---|---|---|---|---|---|"]
    for name, entry in results["models"].items():
        top = entry["ceiling"]["decode_and_model"]
        for mode in ("batching", "one_by_one"):
            for level, p in entry[mode].items():
                lines.append(f"| {name} | {mode.replace('_', ' ')} | {level} | "
                             f"{p['images_per_s']:.1f} | {p['p50_ms']:.0f} | {p['p99_ms']:.0f} | "
                             f"{100 * p['images_per_s'] / top:.0f}% | {p['load_before']:.1f} / "
                             f"{p['load_after']:.1f} |")
        lines.append(f"| {name} | ceiling: ONNX Runtime in one process, batch "
                     f"{settings['max_batch_size']} | - | {top:.1f} (decode + model), "
                     f"{entry['ceiling']['model_only']:.1f} (model alone) | - | - | 100% | "
                     f"{entry['load_before_ceiling']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    results = measure(args)
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "serve_load.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    text = markdown(results)
    with open(os.path.join(args.output_dir, "serve_load.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
