"""serve.py (``src/deploy/serving.py``, ``src/deploy/batching.py``): the answers of predict.py on
the same files for each model kind, concurrent clients getting their own answers out of shared
batches, each bad input refused with a 4xx JSON error while the server keeps serving, a request
failing in a batch failing alone, /health before and after the model is ready, /metrics read
by prometheus_client's parser, start-up refusals in one line, and SIGTERM with requests in
flight (a real serve.py process on a free loopback port)."""
import base64
import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import mindspore as ms
import numpy as np
import pytest
import torch
import uvicorn
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

import serve
from src.data.image_check import set_max_image_pixels
from src.data.settings import EvalPreprocess
from src.deploy.batching import BatchError, DynamicBatcher, bucket_sizes, padded_size
from src.deploy.inference import load_network, preprocess_images
from src.deploy.serving import LoadedModel, ServeSettings, Service, create_app
from src.models.resnet import create_network
from src.utils import device
from src.utils.checkpoint import RECORD_KEY
from src.utils.config import ConfigError, parse_config
from src.utils.model_record import ModelRecord
from tests.helpers import (
    CIFAR_SAMPLE,
    GREYSCALE_JPEG,
    IMAGENET_SMALL,
    ROOT,
    run_in_process,
    succeeded,
)

NAMES = tuple(sorted(os.listdir(os.path.join(CIFAR_SAMPLE, "test"))))
CLASSES = len(NAMES)
SIDE, RESIZE = 64, 72
PREPROCESS = EvalPreprocess(image_size=SIDE, resize=RESIZE)
ROUNDING = 2e-6  # 6 decimals, and float32 rounding of logits computed in another batch
TIMEOUT = 60.0  # seconds any request of these tests may take, at most


def sample_images():
    """Six real JPEGs of the shipped samples: ImageNet photos of other sizes (a greyscale one
    among them) and CIFAR-10 images."""
    cifar = os.path.join(CIFAR_SAMPLE, "test")
    return [GREYSCALE_JPEG, *sorted(
        os.path.join(IMAGENET_SMALL, c, f) for c in sorted(os.listdir(IMAGENET_SMALL))[:2]
        for f in sorted(os.listdir(os.path.join(IMAGENET_SMALL, c)))[:1]),
        *[os.path.join(cifar, c, sorted(os.listdir(os.path.join(cifar, c)))[0])
          for c in NAMES[:3]]]


def read(path):
    with open(path, "rb") as f:
        return f.read()


def saved_checkpoint(path, seed, **record):
    """A ResNet-18 of random weights (``seed``) saved at ``path`` with a model record: 10
    named classes, 64 px, and the fields ``record`` gives; returns ``path``."""
    ms.set_seed(seed)
    values = dict(net_name="resnet18", class_num=CLASSES, class_names=NAMES, tta="none",
                  task="multiclass", preprocess={"image_size": SIDE, "resize": RESIZE,
                                                 "interpolation": "bilinear"})
    ms.save_checkpoint(create_network("resnet18", class_num=CLASSES), str(path),
                       append_dict={RECORD_KEY: ModelRecord(**{**values, **record}).to_json()})
    return str(path)


def copied_images(folder, paths):
    """``paths`` copied into the new ``folder`` (one level); the copies' paths, sorted."""
    os.makedirs(folder)
    for path in paths:
        shutil.copy(path, os.path.join(folder, os.path.basename(path)))
    return sorted(os.path.join(folder, os.path.basename(p)) for p in paths)


# ---- a server in a thread of the test process ----

def fake_logits(images):
    """A stand-in model whose logits come from each image alone: its per-channel means and
    their products, float32 (N, CLASSES)."""
    means = images.reshape(len(images), 3, -1).mean(axis=2)
    columns = [means[:, i % 3] * (1 + i) - means[:, (i + 1) % 3] for i in range(CLASSES)]
    return np.stack(columns, axis=1).astype(np.float32)


def fake_service(forward=fake_logits, *, load_gate=None, record=None, **settings):
    """A ``Service`` of the stand-in model (``forward``), images read as a 64 px model reads
    them; ``load_gate``: an Event the loader waits for."""
    def load():
        if load_gate is not None:
            load_gate.wait(TIMEOUT)
        return LoadedModel(forward=forward)
    record = record or ModelRecord(net_name="resnet18", class_num=CLASSES, class_names=NAMES,
                                   task="multiclass")
    return Service(record=record, preprocess=PREPROCESS, settings=ServeSettings(**settings),
                   load=load, info={"model_file": "fake", "runtime": "test",
                                    "cam_note": "a stand-in model"})


@contextlib.contextmanager
def serving(service, ready=True):
    """``service`` behind uvicorn on a free loopback port, in a thread; yields its base URL
    (after its model is ready, with ``ready``). Stopped as SIGTERM stops serve.py."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(service), log_level="warning",
                                           timeout_graceful_shutdown=TIMEOUT))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + TIMEOUT
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    while ready and service.state == "loading" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started and (not ready or service.state == "ready"), service.error
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(TIMEOUT)


def post_files(client, url, files, query=""):
    """POST ``files`` [(name, bytes)] as multipart file parts to /predict."""
    return client.post(f"{url}/predict{query}", files=[("image", f) for f in files])


def expected_fake(paths, top_k=CLASSES):
    """The stand-in model's answers for image files, each read alone as predict.py reads it
    (softmax in float64 of its logits, 6 decimals)."""
    from src.deploy.inference import preprocess_images

    logits = fake_logits(preprocess_images(paths, PREPROCESS)).astype(np.float64)
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    return [sorted(((k, round(float(p[k]), 6)) for k in range(CLASSES)),
                   key=lambda kv: -kv[1])[:top_k] for p in probs]


def pairs(answer):
    return [(e["class"], e["probability"]) for e in answer["top"]]


def assert_close(served, expected, where=""):
    """(class, probability) lists equal to ``ROUNDING``: the same classes and probabilities;
    the order may differ only between probabilities that close."""
    assert len(served) == len(expected), where
    got, want = dict(served), dict(expected)
    assert got.keys() == want.keys(), where
    for k in want:
        assert abs(got[k] - want[k]) <= ROUNDING, (where, k, got[k], want[k])
    order = [want[k] for k, _ in served]
    assert all(a >= b - 2 * ROUNDING for a, b in zip(order, order[1:])), where


# ---- the batcher ----

def test_bucket_sizes_and_padding():
    assert bucket_sizes(12) == (1, 2, 4, 8, 12)
    assert bucket_sizes(1) == (1,) and bucket_sizes(16) == (1, 2, 4, 8, 16)
    assert [padded_size(n, (1, 2, 4, 8, 12)) for n in (1, 3, 5, 12, 13)] == [1, 4, 8, 12, 13]
    assert padded_size(5, None) == 5


def test_requests_within_the_wait_share_a_batch_and_get_their_own_rows():
    calls = []

    def forward(images):
        calls.append(len(images))
        return images.reshape(len(images), -1)[:, :2] * 2

    batcher = DynamicBatcher(forward, max_batch_size=6, max_wait_ms=TIMEOUT * 1000,
                             buckets=(1, 2, 4, 8))
    inputs = [np.full((n, 3, 2, 2), i, np.float32) for i, n in enumerate((1, 2, 2, 3), 1)]
    futures = [batcher.submit(inputs[0])]
    time.sleep(0.1)  # the first request waits for the others
    futures += [batcher.submit(x) for x in inputs[1:]]
    batcher.stop(TIMEOUT)  # runs what waits at once
    for i, (x, future) in enumerate(zip(inputs, futures), 1):
        out = future.result(0)
        assert out.shape == (len(x), 2) and (out == 2 * i).all()
    # 1 + 2 + 2 = 5 images padded to 8; the 3 that do not fit in 6 come in the next batch
    assert calls == [8, 4]


def test_a_request_failing_in_a_batch_fails_alone():
    def forward(images):
        if (images == -1).any():
            raise RuntimeError("bad input for the model")
        return images.reshape(len(images), -1)[:, :1]

    batcher = DynamicBatcher(forward, max_batch_size=8, max_wait_ms=300)
    try:
        futures = [batcher.submit(np.full((1, 3, 2, 2), v, np.float32)) for v in (1, -1, 3)]
        assert futures[0].result(TIMEOUT)[0, 0] == 1 and futures[2].result(TIMEOUT)[0, 0] == 3
        with pytest.raises(BatchError, match="bad input for the model"):
            futures[1].result(TIMEOUT)
    finally:
        batcher.stop(TIMEOUT)


def test_stop_answers_what_is_queued_then_refuses():
    batcher = DynamicBatcher(lambda x: x.reshape(len(x), -1), max_batch_size=2,
                             max_wait_ms=1000)
    futures = [batcher.submit(np.full((1, 1, 1, 1), v, np.float32)) for v in range(5)]
    batcher.stop(TIMEOUT)
    assert [f.result(0)[0, 0] for f in futures] == list(range(5))
    with pytest.raises(RuntimeError, match="stopped"):
        batcher.submit(np.zeros((1, 1, 1, 1), np.float32))


# ---- HTTP, on the stand-in model ----

def test_concurrent_clients_get_their_own_answers_from_shared_batches():
    paths = sample_images()
    expected = expected_fake(paths)
    service = fake_service(max_batch_size=16, max_wait_ms=150)
    with serving(service) as url, httpx.Client(timeout=TIMEOUT) as client:
        answers = [None] * (2 * len(paths))

        def ask(i):
            path = paths[i % len(paths)]
            answers[i] = post_files(client, url, [(os.path.basename(path), read(path))],
                                    f"?top_k={CLASSES}").json()

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(answers))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT)
        metrics = client.get(f"{url}/metrics").text
    for i, answer in enumerate(answers):
        (one,) = answer["predictions"]
        assert one["image"] == os.path.basename(paths[i % len(paths)])
        assert_close(pairs(one), expected[i % len(paths)], i)
    histogram = metric_samples(metrics)["serve_batch_images"]
    runs, images = histogram["serve_batch_images_count"], histogram["serve_batch_images_sum"]
    assert images == len(answers) and runs < len(answers)  # some batches held several


def test_several_images_in_one_request_and_a_raw_body():
    paths = sample_images()[:3]
    expected = expected_fake(paths, top_k=3)
    with serving(fake_service()) as url, httpx.Client(timeout=TIMEOUT) as client:
        answer = post_files(client, url, [(os.path.basename(p), read(p)) for p in paths],
                            "?top_k=3").json()["predictions"]
        raw = client.post(f"{url}/predict", content=read(paths[1]),
                          headers={"Content-Type": "image/jpeg"}).json()["predictions"]
    assert [a["image"] for a in answer] == [os.path.basename(p) for p in paths]
    for served, want in zip(answer, expected):
        assert_close(pairs(served), want)
    assert raw[0]["image"] == "body" and len(raw[0]["top"]) == 5  # the default top_k
    assert_close(pairs(raw[0]), expected_fake(paths[1:2], top_k=5)[0])


def png_bytes(width, height):
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (90, 120, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


def multipart(parts, boundary="XyZ"):
    """A multipart/form-data body of (headers text, bytes) parts."""
    body = b"".join(f"--{boundary}\r\n{head}\r\n\r\n".encode() + data + b"\r\n"
                    for head, data in parts)
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def test_each_bad_input_is_a_4xx_json_error_naming_it_and_the_server_keeps_serving():
    good = read(sample_images()[0])
    cut, cut_type = multipart([('Content-Disposition: form-data; name="image"; '
                                'filename="a.jpg"', good)])
    field, field_type = multipart([('Content-Disposition: form-data; name="note"', b"hi")])
    service = fake_service(max_request_bytes=int(len(good) * 3.5), max_images=2)
    cases = {  # name: (request keywords, status, kind, words of the message)
        "text body": (dict(content=b"hello", headers={"Content-Type": "text/plain"}), 415,
                      "unsupported_content_type", "'text/plain' is not an image"),
        "no content type": (dict(content=good), 415, "unsupported_content_type", "(none)"),
        "empty body": (dict(content=b"", headers={"Content-Type": "image/jpeg"}), 400,
                       "empty_body", "empty"),
        "undecodable": (dict(content=b"GIF89a not really", headers={
            "Content-Type": "image/png"}), 400, "undecodable_image", "cannot decode image body"),
        "undecodable part": (dict(files=[("image", ("ok.jpg", good)),
                                         ("image", ("notes.txt", b"plain text"))]), 400,
                             "undecodable_image", "notes.txt"),
        "empty part": (dict(files=[("image", ("void.jpg", b""))]), 400, "empty_image",
                       "void.jpg"),
        "body over the limit": (dict(content=good * 4, headers={"Content-Type": "image/jpeg"}),
                                413, "request_too_large", f"{int(len(good) * 3.5)} bytes"),
        "chunked body over the limit": (dict(content=iter([good] * 4), headers={
            "Content-Type": "image/jpeg"}), 413, "request_too_large", "bytes"),
        "too many images": (dict(files=[("image", (f"{i}.jpg", good)) for i in range(3)]), 413,
                            "too_many_images", "at most 2"),
        "too many pixels": (dict(content=png_bytes(300, 200), headers={
            "Content-Type": "image/png"}), 413, "too_many_pixels", "300 x 200"),
        "multipart cut short": (dict(content=cut[:-10], headers={"Content-Type": cut_type}),
                                400, "bad_multipart", "cut short"),
        "multipart without boundary": (dict(content=cut, headers={
            "Content-Type": "multipart/form-data"}), 400, "bad_multipart", "boundary"),
        "a field that is no file": (dict(content=field, headers={"Content-Type": field_type}),
                                    400, "not_a_file", "'note'"),
        "top_k out of range": (dict(content=good, headers={"Content-Type": "image/jpeg"},
                                    params={"top_k": "11"}), 400, "bad_query", "1..10"),
        "unknown query key": (dict(content=good, headers={"Content-Type": "image/jpeg"},
                                   params={"topk": "3"}), 400, "bad_query", "'topk'"),
        "Grad-CAM of a model without it": (dict(content=good, headers={
            "Content-Type": "image/jpeg"}, params={"cam": "true"}), 400, "no_gradcam",
            "a stand-in model"),
    }
    with serving(service) as url, httpx.Client(timeout=TIMEOUT) as client:
        for name, (request, status, kind, words) in cases.items():
            limit = 50000 if name == "too many pixels" else 89478485
            set_max_image_pixels(limit)
            try:
                response = client.post(f"{url}/predict", **request)
            finally:
                set_max_image_pixels(89478485)
            assert response.status_code == status, (name, response.text)
            error = response.json()["error"]
            assert error["kind"] == kind and words in error["message"], (name, error)
            assert "Traceback" not in response.text and "BytesIO" not in response.text, name
            ok = client.post(f"{url}/predict", content=good,
                             headers={"Content-Type": "image/jpeg"})
            assert ok.status_code == 200 and ok.json()["predictions"][0]["top"], name
        missing = client.get(f"{url}/nothing")
        wrong_method = client.get(f"{url}/predict")
        metrics = metric_samples(client.get(f"{url}/metrics").text)
    assert (missing.status_code, missing.json()["error"]["kind"]) == (404, "not_found")
    assert (wrong_method.status_code, wrong_method.json()["error"]["kind"]) == (
        405, "method_not_allowed")
    errors = metrics["serve_errors"]
    for _, _, kind, _ in cases.values():
        assert errors[f"serve_errors_total{{kind={kind}}}"] >= 1, kind
    requests = metrics["serve_requests"]
    assert requests["serve_requests_total{endpoint=/predict,status=200}"] == len(cases)
    assert requests["serve_requests_total{endpoint=/predict,status=415}"] == 2


def test_a_large_multipart_upload_is_read_in_memory(monkeypatch):
    """No file per request: a part over 1 MiB (where Starlette's form parser would spool to a
    temporary file) is answered with every way to make a temporary file failing."""
    noise = np.random.default_rng(0).integers(0, 256, (700, 800, 3), np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noise).save(buffer, format="PNG")
    assert buffer.tell() > 1 << 20

    def no_file(*args, **kwargs):
        raise AssertionError("a temporary file was made for a request")

    with serving(fake_service()) as url, httpx.Client(timeout=TIMEOUT) as client:
        for name in ("TemporaryFile", "NamedTemporaryFile", "mkstemp", "mkdtemp"):
            monkeypatch.setattr(tempfile, name, no_file)
        response = post_files(client, url, [("noise.png", buffer.getvalue())])
    assert response.status_code == 200, response.text
    assert response.json()["predictions"][0]["image"] == "noise.png"


def test_a_request_the_model_fails_on_fails_alone_over_http():
    bad = png_bytes(80, 80)  # one colour: the stand-in model fails on it

    def forward(images):
        flat = images.reshape(len(images), 3, -1)  # the warm-up's zeros are not refused
        if ((np.ptp(flat, axis=2) == 0).all(axis=1) & (flat.mean(axis=(1, 2)) != 0)).any():
            raise RuntimeError("the model cannot take a flat image")
        return fake_logits(images)

    paths = sample_images()[:4]
    expected = expected_fake(paths)
    service = fake_service(forward, max_batch_size=8, max_wait_ms=300)
    results = {}
    with serving(service) as url, httpx.Client(timeout=TIMEOUT) as client:
        def ask(name, data):
            results[name] = post_files(client, url, [(name, data)], f"?top_k={CLASSES}")

        threads = [threading.Thread(target=ask, args=(os.path.basename(p), read(p)))
                   for p in paths] + [threading.Thread(target=ask, args=("flat.png", bad))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT)
        batches = metric_samples(client.get(f"{url}/metrics").text)["serve_batch_images"]
    failed = results.pop("flat.png")
    assert failed.status_code == 500 and failed.json()["error"]["kind"] == "inference_failed"
    assert "cannot take a flat image" in failed.json()["error"]["message"]
    for path, want in zip(paths, expected):
        response = results[os.path.basename(path)]
        assert response.status_code == 200, response.text
        assert_close(pairs(response.json()["predictions"][0]), want)
    # the five met in one batch, which failed, then ran one by one
    assert batches["serve_batch_images_count"] < 2 * 5


def metric_samples(text):
    """Prometheus text read by prometheus_client's own parser: family name -> {sample name
    with its labels (values only) -> value}."""
    families = {}
    for family in text_string_to_metric_families(text):
        families[family.name] = {
            (f"{s.name}{{{','.join(f'{k}={v}' for k, v in sorted(s.labels.items()))}}}"
             if s.labels else s.name): s.value for s in family.samples}
    return families


def test_health_says_ready_only_once_the_model_is_loaded_and_metrics_parse():
    gate = threading.Event()
    service = fake_service(load_gate=gate)
    with serving(service, ready=False) as url, httpx.Client(timeout=TIMEOUT) as client:
        loading = client.get(f"{url}/health")
        refused = client.post(f"{url}/predict", content=read(sample_images()[0]),
                              headers={"Content-Type": "image/jpeg"})
        gate.set()
        deadline = time.monotonic() + TIMEOUT
        while client.get(f"{url}/health").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        ready = client.get(f"{url}/health")
        meta = client.get(f"{url}/metadata").json()
        metrics = metric_samples(client.get(f"{url}/metrics").text)
    assert (loading.status_code, loading.json()) == (503, {"status": "loading"})
    assert refused.status_code == 503 and refused.json()["error"]["kind"] == "not_ready"
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    assert meta["model_record"]["class_names"] == list(NAMES)
    assert meta["gradcam"] is False and meta["cam_note"] == "a stand-in model"
    for family in ("serve_requests", "serve_errors", "serve_request_seconds",
                   "serve_batch_images", "serve_queue_images", "serve_images"):
        assert family in metrics, family
    assert metrics["serve_queue_images"]["serve_queue_images"] == 0
    assert metrics["serve_requests"]["serve_requests_total{endpoint=/health,status=503}"] >= 1


def test_a_model_that_fails_to_load_says_so_on_health():
    def broken():
        raise RuntimeError("weights unreadable")

    service = fake_service()
    service.load = broken
    with serving(service, ready=False) as url, httpx.Client(timeout=TIMEOUT) as client:
        deadline = time.monotonic() + TIMEOUT
        while service.state == "loading" and time.monotonic() < deadline:
            time.sleep(0.02)
        health = client.get(f"{url}/health")
    assert health.status_code == 503
    assert health.json() == {"status": "failed", "error": "weights unreadable"}


def test_the_page_escapes_the_models_names_and_says_why_there_is_no_grad_cam():
    from src.deploy.serve_page import page_html

    record = ModelRecord(net_name="resnet18", class_num=2,
                         class_names=("<b>cat</b>", "dog</script><script>x()</script>"))
    page = page_html({"model_record": record.to_dict(), "model_file": "m<1>.onnx",
                      "runtime": "onnxruntime", "cam_note": "m.onnx is an <exported> graph"})
    assert "<b>cat</b>" not in page and "</script><script>x()" not in page
    assert "m&lt;1&gt;.onnx" in page
    assert 'id="cam" type="checkbox" disabled' in page
    assert "not for this model file: m.onnx is an &lt;exported&gt; graph" in page
    embedded = page.split('id="metadata">')[1].split("</script>")[0]
    assert json.loads(embedded)["model_record"]["class_names"][1] == \
        "dog</script><script>x()</script>"
    with_cam = page_html({"model_record": record.to_dict(), "cam_note": None})
    assert 'id="cam" type="checkbox" >' in with_cam


# ---- start-up refusals: one line, exit 2 ----

@pytest.mark.slow
def test_bad_start_up_values_are_one_line_and_exit_2(tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx file")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    cases = {  # arguments: words of the line
        (): "checkpoint_path is empty",
        ("--checkpoint_path", tmp_path / "none.onnx"): "no such file or folder",
        ("--checkpoint_path", broken, "--max_batch_size", "0"): "max_batch_size must be > 0",
        ("--checkpoint_path", broken, "--port", "70000"): "port must be in 0..65535",
        ("--checkpoint_path", broken, "--port", taken.getsockname()[1]): "cannot listen on",
        # the port opens, then the loader fails: the server stops with the loader's line
        ("--checkpoint_path", broken, "--port", "0"): "cannot load ONNX file",
    }
    try:
        for args, words in cases.items():
            result = run_in_process("serve.py", *args)
            lines = result.stderr.strip().splitlines()
            assert result.returncode == 2, (args, result.stderr[-2000:])
            assert lines[-1].startswith("serve.py: error: ") and words in lines[-1], (args, lines)
            assert "Traceback" not in result.stderr, args
    finally:
        taken.close()


# ---- real models: the answers of predict.py ----

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A ResNet-18 checkpoint (random weights, 10 named classes, 64 px, a calibration
    temperature of 1.5 in its record) and its exports: dynamic-batch ONNX, int8 ONNX and
    MINDIR, a fixed batch-2 ONNX (a SAFETENSORS folder runs as the .ckpt: left out for time);
    the sample images in a folder."""
    folder = tmp_path_factory.mktemp("serve_models")
    paths = copied_images(str(folder / "images"), sample_images())
    # a rejection threshold too: energy at the median of these images' own (torch's logsumexp
    # of the network's logits), so some answers are "unknown" and some are not
    ckpt = saved_checkpoint(folder / "r18.ckpt", 7, temperature=1.5)
    logits = load_network("resnet18", CLASSES, ckpt)(ms.Tensor(preprocess_images(
        paths, PREPROCESS))).asnumpy()
    energy = torch.logsumexp(torch.from_numpy(logits.astype(np.float64)), 1).numpy()
    ckpt = saved_checkpoint(folder / "r18.ckpt", 7, temperature=1.5, ood_score="energy",
                            ood_threshold=float(np.median(energy)))
    files = {"ckpt": ckpt}
    exports = {"onnx": ("ONNX", "--dynamic_batch", "true"),
               "int8": ("ONNX", "--dynamic_batch", "true", "--quantize", "int8",
                        "--calibration_data_path", os.path.join(CIFAR_SAMPLE, "train"),
                        "--calibration_images", "8"),
               "mindir": ("MINDIR", "--dynamic_batch", "true"),
               "fixed": ("ONNX", "--batch_size", "2")}
    for name, (file_format, *extra) in exports.items():
        stem = str(folder / name)
        succeeded(run_in_process("export.py", "--checkpoint_path", ckpt, "--file_format",
                                 file_format, *extra, "--file_name", stem))
        files[name] = stem + {"ONNX": ".onnx", "MINDIR": ".mindir"}[file_format]
    return {"files": files, "images": os.path.dirname(paths[0]), "paths": paths}


def printed(models, kind):
    """predict.py's lines for the sample images (every class in ``top``), by file name."""
    args = ("--batch_size", "2") if kind == "fixed" else ()
    result = succeeded(run_in_process("predict.py", "--checkpoint_path", models["files"][kind],
                                      "--image_path", models["images"], "--top_k",
                                      str(CLASSES), *args))
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return {os.path.basename(line["image"]): line for line in lines}


def built(*args):
    """serve.py's service for ``args`` (its ``build``), the MindSpore context as it is."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(device, "setup_device", lambda *a, **k: None)
        service, _ = serve.build(parse_config([str(a) for a in args], sections=serve.SECTIONS))
    return service


def ask_concurrently(url, paths, query=""):
    """Each image of ``paths`` POSTed as its own request, all at once; the answers by name."""
    answers = {}
    with httpx.Client(timeout=TIMEOUT) as client:
        def ask(path):
            response = post_files(client, url, [(os.path.basename(path), read(path))], query)
            assert response.status_code == 200, response.text
            answers[os.path.basename(path)] = response.json()["predictions"][0]

        threads = [threading.Thread(target=ask, args=(p,)) for p in paths]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT)
    return answers


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["onnx", "int8", "mindir", "ckpt", "fixed"])
def test_answers_are_predict_pys_for_every_model_kind(models, kind):
    expected = printed(models, kind)
    batch = () if kind == "fixed" else ("--max_batch_size", "4")
    service = built("--checkpoint_path", models["files"][kind], *batch, "--max_wait_ms", "100")
    with serving(service) as url:
        answers = ask_concurrently(url, models["paths"], f"?top_k={CLASSES}")
        meta = httpx.get(f"{url}/metadata", timeout=TIMEOUT).json()
        batches = metric_samples(httpx.get(f"{url}/metrics", timeout=TIMEOUT).text)
        with_cam = httpx.post(f"{url}/predict?cam=true", content=read(models["paths"][0]),
                              headers={"Content-Type": "image/jpeg"}, timeout=TIMEOUT)
    assert answers.keys() == expected.keys()
    for name, line in expected.items():
        assert answers[name]["image"] == name
        assert_close(pairs(answers[name]), pairs(line), f"{kind} {name}")
        assert answers[name]["unknown"] == line["unknown"], f"{kind} {name}"
    if kind != "int8":  # its own logits: its energies need not split these images alike
        assert {line["unknown"] for line in expected.values()} == {True, False}
    assert meta["model_record"]["temperature"] == 1.5 and meta["model_file"] == \
        models["files"][kind]
    assert meta["batching"]["max_batch_size"] == (2 if kind == "fixed" else 4)
    histogram = batches["serve_batch_images"]
    assert histogram["serve_batch_images_sum"] == len(models["paths"])
    assert histogram["serve_batch_images_count"] < len(models["paths"])  # batched
    if meta["gradcam"]:  # the network's weights: a .ckpt
        picture = with_cam.json()["predictions"][0]["cam"]
        assert picture.startswith("data:image/png;base64,")
        image = Image.open(io.BytesIO(base64.b64decode(picture.split(",", 1)[1])))
        assert image.size == (SIDE, SIDE) and image.mode == "RGB"
    else:
        assert with_cam.status_code == 400 and "exported graph" in meta["cam_note"]
    assert meta["gradcam"] == (kind == "ckpt")


@pytest.mark.slow
def test_a_fixed_batch_export_refuses_another_max_batch_size(models):
    with pytest.raises(ConfigError) as refused:  # before any port opens (exit 2: above)
        built("--checkpoint_path", models["files"]["fixed"], "--max_batch_size", "8")
    line = str(refused.value)
    assert "fixed batch of 2" in line and "--max_batch_size 2" in line and \
        "--dynamic_batch true" in line, line


@pytest.mark.slow
def test_multi_label_answers_list_the_labels_above_the_records_thresholds(tmp_path):
    ckpt = saved_checkpoint(tmp_path / "ml.ckpt", 11, task="multilabel",
                            thresholds=tuple(round(0.3 + 0.04 * k, 2) for k in range(CLASSES)))
    paths = copied_images(str(tmp_path / "images"), sample_images())
    result = succeeded(run_in_process("predict.py", "--checkpoint_path", ckpt, "--image_path",
                                      os.path.dirname(paths[0]), "--top_k", "3"))
    expected = {os.path.basename(json.loads(line)["image"]): json.loads(line)
                for line in result.stdout.splitlines()}
    service = built("--checkpoint_path", ckpt, "--max_batch_size", "2", "--top_k", "3")
    with serving(service) as url:
        answers = ask_concurrently(url, paths)
    assert any(line["labels"] for line in expected.values())  # some image has labels
    for name, line in expected.items():
        assert [e["class"] for e in answers[name]["labels"]] == \
            [e["class"] for e in line["labels"]], name
        assert_close(pairs(answers[name]), pairs(line), name)


# ---- SIGTERM with requests in flight: a real serve.py process ----

@pytest.mark.slow
def test_sigterm_answers_the_requests_in_flight_then_exits_0(models, tmp_path):
    expected = printed(models, "onnx")
    out = open(tmp_path / "out.txt", "w+")
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "serve.py"),
                             "--checkpoint_path", models["files"]["onnx"], "--port", "0",
                             "--max_batch_size", "16", "--max_wait_ms", "1500",
                             "--top_k", str(CLASSES)], cwd=ROOT, stdout=out,
                            stderr=subprocess.STDOUT, text=True)
    try:
        url, deadline = None, time.monotonic() + 120
        while url is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
            found = [w for w in open(out.name).read().split() if w.startswith("http://")]
            url = found[0].rstrip("/") if found else None
        assert url and url.startswith("http://127.0.0.1:"), open(out.name).read()  # default
        with httpx.Client(timeout=TIMEOUT) as client:
            while client.get(f"{url}/health").status_code != 200 and \
                    time.monotonic() < deadline:
                time.sleep(0.1)
            answers, threads = {}, []
            for path in models["paths"][:3]:
                def ask(path=path):
                    try:
                        answers[path] = post_files(httpx.Client(timeout=TIMEOUT), url, [
                            (os.path.basename(path), read(path))])
                    except httpx.HTTPError as err:
                        answers[path] = err
                threads.append(threading.Thread(target=ask))
                threads[-1].start()
            queued = 0
            while queued < 3 and time.monotonic() < deadline:  # all three wait for a batch
                queued = metric_samples(client.get(f"{url}/metrics").text)[
                    "serve_queue_images"]["serve_queue_images"]
        proc.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(TIMEOUT)
        status = proc.wait(TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = open(out.name).read()
    assert queued == 3, log
    assert status == 0, log
    for path in models["paths"][:3]:
        response = answers[path]
        assert isinstance(response, httpx.Response) and response.status_code == 200, response
        (answer,) = response.json()["predictions"]
        assert_close(pairs(answer), pairs(expected[os.path.basename(path)]))
    with pytest.raises(httpx.ConnectError):  # no longer accepting
        httpx.get(f"{url}/health", timeout=5)
    assert "serve: stopped" in log and "Traceback" not in log
