"""serve.py's config meets the server: the serve keys checked (``check_serve_config``), the
batching and limits (``serve_settings``: a fixed-batch export's own batch), what
``/metadata`` says of the model file (``serve_info``) and the loader run after the port opens
(``serve_loader``: the model file's predictor as predict.py loads it, its batch shapes and
lock, the Grad-CAM pictures where the file has weights). See docs/serving.md.
"""
import os
from collections.abc import Callable

from src.data.settings import EvalPreprocess
from src.deploy import formats, gradcam
from src.deploy.inference import load_network
from src.deploy.serving import (
    MINDSPORE_LOCK,
    LoadedModel,
    ServeSettings,
    batch_plan,
    cam_drawer,
)
from src.utils.config import Config, ConfigError
from src.utils.errors import MissingFileError, UserError
from src.utils.hub import HUB_PREFIX

PORT_MAX = 65535
MIB = 1 << 20
POSITIVE_SERVE_KEYS = ("max_batch_size", "inference_threads", "decode_threads",
                       "max_request_mb", "max_images_per_request")
"""Serve keys whose value must be > 0 (``max_wait_ms``, ``shutdown_timeout``: >= 0)."""


def check_serve_config(cfg: Config) -> None:
    """Check the serve keys (``checkpoint_path`` given and there, counts positive, the port a
    port) before anything loads.

    Raises:
        ConfigError, MissingFileError: Naming the key and its value.
    """
    if not cfg.checkpoint_path:
        raise ConfigError("checkpoint_path is empty: give a .onnx, .mindir or .ckpt file, a "
                          "SAFETENSORS folder or an hf-hub: id")
    path = cfg.checkpoint_path
    if not path.startswith(HUB_PREFIX) and not os.path.exists(path):
        raise MissingFileError(f"checkpoint_path {path}: no such file or folder")
    for key in POSITIVE_SERVE_KEYS:
        if cfg[key] <= 0:
            raise ConfigError(f"{key} must be > 0, got {cfg[key]}")
    for key in ("max_wait_ms", "shutdown_timeout"):
        if cfg[key] < 0:
            raise ConfigError(f"{key} must be >= 0, got {cfg[key]}")
    if not 0 <= cfg.port <= PORT_MAX:
        raise ConfigError(f"port must be in 0..{PORT_MAX} (0: any free port), got {cfg.port}")
    if not cfg.host:
        raise ConfigError("host is empty: give an address to listen on, e.g. 127.0.0.1")


def exported_batch(checkpoint_path: str) -> int | None:
    """The fixed batch an exported .onnx / .mindir declares in its input; None for a
    symbolic batch, weights, or a file that does not read (its loader names it)."""
    if not checkpoint_path.endswith((".onnx", ".mindir")):
        return None
    try:
        return formats.declared_batch_dims(checkpoint_path)[0]
    except Exception:  # noqa: BLE001  onnx's and protobuf's own types; the loader says why
        return None


def serve_settings(cfg: Config) -> ServeSettings:
    """The batching and limits of ``cfg``; a fixed-batch export runs batches of its own
    batch (padded to it).

    Raises:
        ConfigError: If ``max_batch_size`` is set to another value than a fixed-batch
            export's batch (names the fixes).
    """
    declared = exported_batch(cfg.checkpoint_path)
    asked = cfg.user_value("max_batch_size")
    if declared is not None and asked not in (None, declared):
        raise ConfigError(f"max_batch_size {asked}: {cfg.checkpoint_path} was exported for a "
                          f"fixed batch of {declared}; pass --max_batch_size {declared} "
                          f"(batches padded to {declared}), or export it again with "
                          f"--dynamic_batch true to batch up to any size")
    batch, _ = batch_plan(cfg.max_batch_size, declared, False)
    return ServeSettings(max_batch_size=batch, max_wait_ms=cfg.max_wait_ms,
                         inference_threads=cfg.inference_threads,
                         decode_threads=cfg.decode_threads,
                         max_request_bytes=int(cfg.max_request_mb * MIB),
                         max_images=cfg.max_images_per_request, top_k=cfg.top_k)


def cam_note(cfg: Config) -> str | None:
    """Why the server gives no Grad-CAM overlays for ``cfg``'s model (None: it does): an
    exported graph, a 1x1 ``layer4`` map, no matplotlib."""
    if gradcam.is_exported_graph(cfg.checkpoint_path):
        return (f"{cfg.checkpoint_path} is an exported graph, without the weights Grad-CAM "
                f"differentiates; serve the .ckpt or Hub weights to see it")
    if gradcam.flat_map_note(cfg.eval_image_size):
        return gradcam.flat_map_note(cfg.eval_image_size)
    try:
        gradcam.colormap()
    except UserError as err:
        return str(err)
    return None


def serve_info(cfg: Config) -> dict:
    """What ``/metadata`` says besides the record: the model file, its runtime and, when
    there are no Grad-CAM overlays, why (``cam_note``)."""
    return {"model_file": cfg.checkpoint_path,
            "runtime": formats.model_runtime(cfg.checkpoint_path, cfg.runtime),
            "cam_note": cam_note(cfg)}


def serve_loader(cfg: Config, preprocess: EvalPreprocess,
                 settings: ServeSettings) -> Callable[[], LoadedModel]:
    """The loader of ``cfg``'s model (run in a thread once the port is open): its predictor
    (``formats.load_predictor``, as predict.py loads it) for ``settings.max_batch_size``, run
    at ``bucket_sizes`` and under ``MINDSPORE_LOCK`` in MindSpore, and its Grad-CAM
    pictures (``cam_drawer``) when ``cam_note`` finds none missing."""
    in_mindspore = formats.model_runtime(cfg.checkpoint_path, cfg.runtime) == "mindspore"
    _, buckets = batch_plan(settings.max_batch_size, exported_batch(cfg.checkpoint_path),
                            in_mindspore)
    with_cam = cam_note(cfg) is None
    network = dict(use_ema=cfg.use_ema, device_target=cfg.device_target,
                   stem_pool_pad_mode=cfg.stem_pool_pad_mode)

    def load() -> LoadedModel:
        forward = formats.load_predictor(cfg.checkpoint_path, cfg.net_name, cfg.class_num,
                                         settings.max_batch_size, runtime=cfg.runtime,
                                         tta=cfg.tta, **network)
        cam = None
        if with_cam:
            net = load_network(cfg.net_name, cfg.class_num, cfg.checkpoint_path, **network)
            cam = cam_drawer(gradcam.GradCam(net), preprocess, MINDSPORE_LOCK)
        return LoadedModel(forward=forward, buckets=buckets,
                           lock=MINDSPORE_LOCK if in_mindspore else None, cam=cam)
    return load
