"""serve.py's HTTP server (FastAPI on uvicorn): ``POST /predict`` answers as predict.py prints
(``image_answer``) for images sent as multipart file parts or as a raw body, read as
``preprocess_images`` reads files; ``GET /health``, ``/metadata``, ``/metrics`` (Prometheus
text) and ``/`` (a page to try it). The model is loaded and warmed up in a thread after the
port opens (``/health`` says 503 until then); requests are run in batches by
``src.deploy.batching``. Bad input is a 4xx JSON error naming it; nothing is written to disk.
See docs/serving.md.
"""
import asyncio
import base64
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.exceptions import HTTPException

from src.data.image_check import MAX_PIXELS_WORDS, ImageFolderError
from src.data.settings import EvalPreprocess
from src.data.transforms import create_transforms
from src.deploy.batching import BatchError, DynamicBatcher, Forward, bucket_sizes
from src.deploy.gradcam import GradCam, grad_cam, overlay, png_bytes, seen_images
from src.deploy.inference import preprocess_encoded
from src.deploy.outputs import batch_answers, model_outputs
from src.deploy.serve_page import page_html
from src.utils.config import ConfigError
from src.utils.model_record import ModelRecord

LOGGER = logging.getLogger(__name__)
RAW_TYPES = ("image/", "application/octet-stream")
"""Content types of a raw body taken as one image (``image/*`` by prefix)."""
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Buckets of the batch-size histogram (images per batch)."""
BUFFER_REPR = re.compile(r" ?<_io\.BytesIO object at 0x[0-9a-f]+>")
"""Pillow's name of an in-memory image in its errors, left out of ours."""
MINDSPORE_LOCK = threading.Lock()
"""Held by every MindSpore call of the server (a forward, a Grad-CAM): MindSpore 2.10 crashes
when two threads run its graphs at once."""


@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    """How the server batches and what it takes: ``max_batch_size`` images per batch,
    ``max_wait_ms`` (``DynamicBatcher``), ``inference_threads`` batches at once,
    ``decode_threads`` threads reading images, ``max_request_bytes`` per request body,
    ``max_images`` per request, ``top_k`` by default."""

    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    inference_threads: int = 1
    decode_threads: int = 2
    max_request_bytes: int = 16 << 20
    max_images: int = 64
    top_k: int = 5


@dataclass(frozen=True, kw_only=True)
class LoadedModel:
    """What ``Service``'s loader gives: the model as a ``Forward``, the batch sizes to pad
    batches to (``bucket_sizes``; None: any batch), a lock held while it runs (MindSpore: one
    call at a time), and ``cam``: float32 images (n, 3, H, W) and their classes -> a PNG of
    each image's Grad-CAM overlay (None: not for this model file)."""

    forward: Forward
    buckets: tuple[int, ...] | None = None
    lock: "threading.Lock | None" = None
    cam: Callable[[np.ndarray, Sequence[int]], list[bytes]] | None = None


class Problem(Exception):
    """A request the server refuses: HTTP ``status``, ``kind`` (the metrics' label) and a
    message naming what is wrong."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


class Metrics:
    """The Prometheus metrics of one server, in a registry of its own: requests by endpoint
    and status, errors by kind, request latency (s), images per batch, images queued."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("serve_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=self.registry)
        self.errors = Counter("serve_errors", "requests refused or failed, by kind", ["kind"],
                              registry=self.registry)
        self.latency = Histogram("serve_request_seconds", "time from request to response",
                                 ["endpoint"], registry=self.registry)
        self.batch_images = Histogram("serve_batch_images", "images per batch run",
                                      buckets=BATCH_BUCKETS, registry=self.registry)
        self.images = Counter("serve_images", "images answered", registry=self.registry)
        self.queued = Gauge("serve_queue_images", "images waiting for a batch",
                            registry=self.registry)


class Service:
    """The state the endpoints share: the model's record and answers, the loader (run in a
    thread by ``start``), the batcher, the decode threads, the metrics.

    Args:
        record (ModelRecord): The resolved model (``resolve_model``).
        preprocess (EvalPreprocess): How images are read (``model_preprocess``).
        settings (ServeSettings): Batching and limits.
        load (callable): () -> ``LoadedModel``; raises as the model's loader does.
        info (dict): What ``/metadata`` says besides the record (model file, runtime, the
            Grad-CAM note ``cam_note`` when there is none).
    """

    def __init__(self, *, record: ModelRecord, preprocess: EvalPreprocess,
                 settings: ServeSettings, load: Callable[[], LoadedModel], info: dict) -> None:
        self.record, self.preprocess, self.settings = record, preprocess, settings
        self.names, self.thresholds = model_outputs(record)
        self.load, self.info = load, info
        self.metrics = Metrics()
        self.batcher: DynamicBatcher | None = None
        self.cam = None
        self.state = "loading"
        self.error: BaseException | None = None
        self.on_failure: Callable[[BaseException], None] = lambda err: None
        self.decoder = ThreadPoolExecutor(settings.decode_threads, thread_name_prefix="decode")
        self.cam_runner = ThreadPoolExecutor(1, thread_name_prefix="gradcam")
        self._local = threading.local()
        self.metrics.queued.set_function(
            lambda: self.batcher.queued_images if self.batcher else 0)

    def start(self) -> threading.Thread:
        """Load and warm up the model in a thread; ``state`` becomes ``ready``, or ``failed``
        with ``error`` set and ``on_failure`` called."""
        thread = threading.Thread(target=self._load, name="model-loader", daemon=True)
        thread.start()
        return thread

    def _load(self) -> None:
        try:
            started = time.monotonic()
            loaded = self.load()
            batcher = DynamicBatcher(loaded.forward, max_batch_size=self.settings.max_batch_size,
                                     max_wait_ms=self.settings.max_wait_ms,
                                     threads=self.settings.inference_threads,
                                     buckets=loaded.buckets, lock=loaded.lock,
                                     on_batch=self.metrics.batch_images.observe)
            self._warm_up(batcher, loaded)
            self.batcher, self.cam = batcher, loaded.cam
            self.state = "ready"
            LOGGER.info("ready: model loaded and warmed up in %.1f s",
                        time.monotonic() - started)
        except BaseException as err:  # noqa: BLE001  reported by serve.py, which exits
            self.state, self.error = "failed", err
            self.on_failure(err)

    def _warm_up(self, batcher: DynamicBatcher, loaded: LoadedModel) -> None:
        """One pass at each batch size the model will see (each bucket, or 1 and the largest),
        the class count checked against the record's; a Grad-CAM pass."""
        side = self.preprocess.image_size
        sizes = loaded.buckets or sorted({1, self.settings.max_batch_size})
        for size in sizes:
            logits = batcher._call(np.zeros((size, 3, side, side), np.float32))
            if logits.shape != (size, len(self.names)):
                raise ConfigError(f"{self.info.get('model_file')} outputs logits of shape "
                                  f"{tuple(logits.shape)[1:]} for {len(self.names)} classes: "
                                  f"pass --class_num {logits.shape[-1]}")
        if loaded.cam is not None:
            loaded.cam(np.zeros((1, 3, side, side), np.float32), [0])

    def stop(self, timeout: float) -> None:
        """Answer what is queued (``timeout`` seconds at most), then end the threads."""
        if self.batcher is not None:
            self.batcher.stop(timeout)
        self.decoder.shutdown(wait=False, cancel_futures=True)
        self.cam_runner.shutdown(wait=False, cancel_futures=True)

    def metadata(self) -> dict:
        """``/metadata``: the model record, model file and runtime, batching and limits,
        whether Grad-CAM overlays are given (and why not)."""
        settings = self.settings
        return {"model_record": self.record.to_dict(), **self.info,
                "state": self.state, "gradcam": self.info.get("cam_note") is None,
                "batching": {"max_batch_size": settings.max_batch_size,
                             "max_wait_ms": settings.max_wait_ms,
                             "inference_threads": settings.inference_threads},
                "limits": {"max_request_bytes": settings.max_request_bytes,
                           "max_images": settings.max_images, "top_k": settings.top_k}}

    def decode(self, data: bytes, name: str) -> np.ndarray:
        """One image's bytes -> float32 (3, S, S), as ``preprocess_images`` (in a decode
        thread, each with its own ops). Problem: undecodable (400) or too many pixels (413)."""
        ops = getattr(self._local, "ops", None)
        if ops is None:
            ops = self._local.ops = create_transforms(self.preprocess)
        try:
            return preprocess_encoded(np.frombuffer(data, np.uint8), ops, name)
        except ImageFolderError as err:
            message = BUFFER_REPR.sub("", str(err))  # Pillow names the buffer it read
            if MAX_PIXELS_WORDS in message:
                raise Problem(413, "too_many_pixels", message) from None
            raise Problem(400, "undecodable_image", f"{message} (a JPEG, PNG or BMP image is "
                                                    f"expected)") from None


def problem_response(problem: Problem, metrics: Metrics) -> JSONResponse:
    """The JSON error of a refused request, counted by kind."""
    metrics.errors.labels(problem.kind).inc()
    return JSONResponse({"error": {"kind": problem.kind, "message": problem.message}},
                        status_code=problem.status)


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, at most ``limit`` bytes (held in memory). Problem 413 past it."""
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:  # before the rest is read
            raise Problem(413, "request_too_large", f"the request body is larger than the limit "
                                                    f"of {limit} bytes (max_request_mb)")
        parts.append(chunk)
    return b"".join(parts)


def multipart_files(body: bytes, content_type: str) -> list[tuple[str, bytes]]:
    """The file parts of a ``multipart/form-data`` body as (file name, bytes), parsed in
    memory (python-multipart). Problem 400: no boundary, malformed or cut short, a part
    that is no file."""
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        raise Problem(400, "bad_multipart", "multipart/form-data without a boundary "
                                            "parameter in its Content-Type")
    parts, header, state = [], {"field": b"", "value": b""}, {"end": False}

    def on_part_begin():
        parts.append({"headers": {}, "data": bytearray()})

    def on_header_field(data, start, end):
        header["field"] += data[start:end]

    def on_header_value(data, start, end):
        header["value"] += data[start:end]

    def on_header_end():
        parts[-1]["headers"][header["field"].lower()] = header["value"]
        header["field"] = header["value"] = b""

    def on_part_data(data, start, end):
        parts[-1]["data"] += data[start:end]

    def on_end():
        state["end"] = True

    parser = MultipartParser(boundary, {
        "on_part_begin": on_part_begin, "on_header_field": on_header_field,
        "on_header_value": on_header_value, "on_header_end": on_header_end,
        "on_part_data": on_part_data, "on_end": on_end})
    try:
        parser.write(body)
        parser.finalize()
    except FormParserError as err:
        raise Problem(400, "bad_multipart", f"malformed multipart/form-data body: {err}") from None
    if not state["end"]:
        raise Problem(400, "bad_multipart", "the multipart/form-data body is cut short (no "
                                            "closing boundary)")
    files = []
    for number, part in enumerate(parts, 1):
        _, disposition = parse_options_header(part["headers"].get(b"content-disposition"))
        field = disposition.get(b"name", b"").decode("utf-8", "replace")
        if b"filename" not in disposition:
            raise Problem(400, "not_a_file", f"multipart part {number} (field {field!r}) is not "
                                             f"a file: send images as file parts (curl -F "
                                             f"image=@photo.jpg)")
        files.append((disposition[b"filename"].decode("utf-8", "replace") or f"image {number}",
                      bytes(part["data"])))
    return files


async def request_images(request: Request, settings: ServeSettings) -> list[tuple[str, bytes]]:
    """The images of a ``/predict`` request as (name, bytes): a multipart body's file parts,
    or a raw body of an ``image/*`` or ``application/octet-stream`` type (named ``body``).

    Raises:
        Problem: 415 for another content type, 413 for a body or image count over the
            limits, 400 for an empty body, image or multipart without files.
    """
    content_type = request.headers.get("content-type", "")
    kind = content_type.split(";")[0].strip().lower()
    if kind != "multipart/form-data" and not kind.startswith(RAW_TYPES):
        raise Problem(415, "unsupported_content_type", f"Content-Type {kind or '(none)'!r} is "
                                                       f"not an image: send multipart/form-data "
                                                       f"file parts, or the image's bytes as "
                                                       f"image/jpeg, image/png, image/bmp or "
                                                       f"application/octet-stream")
    body = await read_body(request, settings.max_request_bytes)
    if not body:
        raise Problem(400, "empty_body", "the request body is empty: send an image")
    images = multipart_files(body, content_type) if kind == "multipart/form-data" else [
        ("body", body)]
    if not images:
        raise Problem(400, "no_image", "the multipart/form-data body holds no file part")
    if len(images) > settings.max_images:
        raise Problem(413, "too_many_images", f"{len(images)} images in one request: at most "
                                              f"{settings.max_images} (max_images_per_request)")
    empty = [name for name, data in images if not data]
    if empty:
        raise Problem(400, "empty_image", f"empty image file: {', '.join(empty)}")
    return images


def query_options(request: Request, service: Service) -> tuple[int, bool]:
    """``top_k`` (1..K, default the server's) and ``cam`` (true/false) of a ``/predict``
    request's query. Problem 400 for other values or keys."""
    query = request.query_params
    unknown = sorted(set(query) - {"top_k", "cam"})
    if unknown:
        raise Problem(400, "bad_query", f"unknown query parameter {unknown[0]!r}: /predict "
                                        f"takes top_k and cam")
    classes = len(service.names)
    top_k = query.get("top_k", str(min(service.settings.top_k, classes)))
    if not top_k.isdigit() or not 1 <= int(top_k) <= classes:
        raise Problem(400, "bad_query", f"top_k {top_k!r}: expected an integer in 1..{classes}")
    cam = query.get("cam", "false").lower()
    if cam not in ("true", "false", "1", "0"):
        raise Problem(400, "bad_query", f"cam {cam!r}: expected true or false")
    wanted = cam in ("true", "1")
    if wanted and service.info.get("cam_note"):
        raise Problem(400, "no_gradcam", f"no Grad-CAM for this model: "
                                         f"{service.info['cam_note']}")
    return int(top_k), wanted


async def predict(request: Request, service: Service) -> list[dict]:
    """The answers of a ``/predict`` request, one per image in the order sent."""
    if service.state != "ready":
        raise Problem(503, "not_ready", f"the model is {service.state}: wait for GET /health "
                                        f"to say ready")
    top_k, want_cam = query_options(request, service)
    images = await request_images(request, service.settings)
    loop = asyncio.get_running_loop()
    decoded = await asyncio.gather(*(loop.run_in_executor(service.decoder, service.decode,
                                                          data, name)
                                     for name, data in images))
    batch = np.stack(decoded).astype(np.float32)
    try:
        logits = await asyncio.wrap_future(service.batcher.submit(batch))
    except BatchError as err:
        raise Problem(500, "inference_failed", str(err)) from None
    except RuntimeError as err:  # stopped
        raise Problem(503, "stopping", f"the server is stopping: {err}") from None
    answers = [{"image": name, **answer} for (name, _), answer in zip(images, batch_answers(
        logits, service.record, service.names, service.thresholds, top_k))]
    if want_cam:
        classes = [answer["top"][0]["class"] for answer in answers]
        pictures = await loop.run_in_executor(service.cam_runner, service.cam, batch, classes)
        for answer, png in zip(answers, pictures):
            answer["cam"] = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    service.metrics.images.inc(len(answers))
    return answers


class MetricsMiddleware:
    """ASGI middleware counting each HTTP request by endpoint and status, with its latency
    (unknown paths as ``other``)."""

    def __init__(self, app, metrics: Metrics, endpoints: Sequence[str]) -> None:
        self.app, self.metrics, self.endpoints = app, metrics, set(endpoints)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        endpoint = scope["path"] if scope["path"] in self.endpoints else "other"
        status = {"code": 500}
        started = time.perf_counter()

        async def sending(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.requests.labels(endpoint, str(status["code"])).inc()
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)


def create_app(service: Service, *, stop_timeout: float = 30.0) -> FastAPI:
    """The FastAPI app of ``service``: its loader starts with the app, its batcher ends with
    it (what is queued answered first, ``stop_timeout`` seconds at most)."""

    @asynccontextmanager
    async def lifespan(app):
        del app
        service.start()
        yield
        await asyncio.get_running_loop().run_in_executor(None, service.stop, stop_timeout)

    app = FastAPI(title="ResNet serve", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    metrics = service.metrics

    @app.exception_handler(HTTPException)
    async def http_error(request, err):
        kind = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code, "http_error")
        return problem_response(Problem(err.status_code, kind,
                                        f"{request.method} {request.url.path}: {err.detail}"),
                                metrics)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, err):
        return problem_response(Problem(400, "bad_request", str(err)), metrics)

    @app.post("/predict")
    async def predict_endpoint(request: Request):
        try:
            answers = await predict(request, service)
        except Problem as problem:
            return problem_response(problem, metrics)
        return JSONResponse({"predictions": answers})

    @app.get("/health")
    async def health():
        body = {"status": service.state}
        if service.error is not None:
            body["error"] = str(service.error).splitlines()[0] if str(service.error) else \
                type(service.error).__name__
        return JSONResponse(body, status_code=200 if service.state == "ready" else 503)

    @app.get("/metadata")
    async def metadata():
        return JSONResponse(service.metadata())

    @app.get("/metrics")
    async def metrics_endpoint():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/")
    async def page():
        return HTMLResponse(page_html(service.metadata()))

    app.add_middleware(MetricsMiddleware, metrics=metrics,
                       endpoints=("/predict", "/health", "/metadata", "/metrics", "/"))
    return app


def cam_drawer(cam: GradCam, preprocess: EvalPreprocess,
               lock: "threading.Lock") -> Callable[[np.ndarray, Sequence[int]], list[bytes]]:
    """Images (n, 3, H, W) preprocessed by ``preprocess`` and a class each -> the PNG of each
    one's Grad-CAM overlay for its class (``grad_cam`` under ``lock``, one image a pass)."""
    def draw(images: np.ndarray, classes: Sequence[int]) -> list[bytes]:
        with lock:
            maps = grad_cam(cam, images, classes, 1)
        seen = seen_images(images, preprocess.mean, preprocess.std)
        return [png_bytes(overlay(image, cam_map)) for image, cam_map in zip(seen, maps)]
    return draw


def batch_plan(max_batch_size: int, declared_batch: int | None,
               compiled_per_shape: bool) -> tuple[int, tuple[int, ...] | None]:
    """(images per batch, buckets) for a model file: a fixed declared batch B runs batches of
    up to B padded to B (by its predictor); a graph MindSpore compiles per input shape runs
    at ``bucket_sizes``; ONNX Runtime at any size (None)."""
    if declared_batch is not None:
        return declared_batch, None
    return max_batch_size, bucket_sizes(max_batch_size) if compiled_per_shape else None
