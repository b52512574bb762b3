"""Serve a model over HTTP: the answers of predict.py for images sent to POST /predict, in batches.

    python serve.py --checkpoint_path resnet50_int8.onnx
    python serve.py --checkpoint_path resnet50.onnx --max_batch_size 32 --max_wait_ms 5
    python serve.py --checkpoint_path output/resnet18-8_32.ckpt --port 8080
    python serve.py --checkpoint_path hf-hub:timm/resnet50.tv2_in1k
    curl -F image=@photo.jpg http://127.0.0.1:8000/predict
    curl --data-binary @photo.jpg -H "Content-Type: image/jpeg" http://127.0.0.1:8000/predict

Any model file predict.py reads: .onnx and int8 .onnx (ONNX Runtime), .mindir, .ckpt,
SAFETENSORS folders and hf-hub: ids (MindSpore; a .ckpt in ONNX Runtime with --runtime
onnxruntime). Its model record (docs/deployment.md#the-model-record) decides how images are
read and what the answers say, as for predict.py: each image's answer is the JSON line
predict.py prints for it (``top``, a multi-label model's ``labels``). Endpoints: POST /predict
(multipart file parts or a raw image body; ?top_k=K, ?cam=true for the Grad-CAM overlay of a
.ckpt or Hub weights), GET /health (200 once the model is loaded and warmed up, 503 before),
GET /metadata (the model record), GET /metrics (Prometheus text), GET / (a page to try it).
Requests arriving within --max_wait_ms are run as one batch of up to --max_batch_size images
(a fixed-batch export: its own batch, padded). Listens on 127.0.0.1:8000 unless --host and
--port say otherwise; SIGTERM or SIGINT stops accepting, answers what is in flight, exits 0.
A bad start-up value is one line ``error: ...`` and exit status 2; a bad request a 4xx JSON
error naming it. See docs/serving.md.
"""
import src.env  # noqa: F401  first: sets the oneDNN default before MindSpore loads
import src.startup  # noqa: F401  then: a stop signal while MindSpore loads exits with a line

# isort: split

import signal
import socket

import uvicorn

from src.data import set_max_image_pixels
from src.deploy import formats
from src.deploy.serving import Service, create_app
from src.recipe import model_config, model_preprocess, resolve_model
from src.recipe.serving import check_serve_config, serve_info, serve_loader, serve_settings
from src.utils import ConfigError, device, get_logger, parse_config, run_entry_point

SECTIONS = ("network", "data", "device", "model file", "predict", "serve")
"""The config.yaml sections this entry point reads (its --help lists them)."""


def listening_socket(host, port):
    """A TCP socket bound to ``host``:``port`` (0: a free port), for uvicorn to listen on.

    Raises:
        ConfigError: If the address cannot be bound (in use, not this machine's).
    """
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as err:
        raise ConfigError(f"cannot listen on {host}:{port}: {err.strerror or err} (another "
                          f"server on that port? pass another --port)") from err
    return sock


def build(given):
    """The server of a parsed config ``given``: the model file's record resolved as predict.py
    resolves it, the batching and limits checked, the loader ready to run.

    Returns:
        tuple(Service, Config): The service (``create_app`` serves it) and the resolved config.

    Raises:
        ConfigError, RecordError, MissingFileError: For a bad value or model file.
    """
    set_max_image_pixels(given.max_image_pixels)
    check_serve_config(given)
    formats.check_runtime(given.checkpoint_path, given.runtime, given.device_target)
    model = resolve_model(given)  # the model file's record; the config for what it lacks
    cfg = model_config(given, model)
    preprocess = model_preprocess(cfg, model)
    settings = serve_settings(cfg)
    device.setup_device(cfg.mode, cfg.device_target, device_id=cfg.device_id, seed=cfg.seed)
    service = Service(record=model, preprocess=preprocess, settings=settings,
                      load=serve_loader(cfg, preprocess, settings), info=serve_info(cfg))
    return service, cfg


def main(argv=None):
    """Serve as configured by ``argv`` until SIGTERM or SIGINT; return 0."""
    given = parse_config(argv, description=__doc__.split("\n")[0], sections=SECTIONS)
    logger = get_logger("serve")
    service, cfg = build(given)
    sock = listening_socket(cfg.host, cfg.port)
    server = uvicorn.Server(uvicorn.Config(
        create_app(service, stop_timeout=cfg.shutdown_timeout), lifespan="on",
        access_log=False, timeout_graceful_shutdown=cfg.shutdown_timeout))
    service.on_failure = lambda err: setattr(server, "should_exit", True)
    host, port = sock.getsockname()[:2]
    logger.info("serve: model %s (runtime %s) on http://%s:%d/ (loading: GET /health says "
                "ready when it can answer)", cfg.checkpoint_path, service.info["runtime"],
                host if ":" not in host else f"[{host}]", port)

    def stop(signum, frame):  # before and after uvicorn's own handlers: a clean stop
        del signum, frame
        server.should_exit = True

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)
    server.run(sockets=[sock])
    if service.error is not None:
        raise service.error
    logger.info("serve: stopped")
    return 0


if __name__ == "__main__":
    run_entry_point(main)
