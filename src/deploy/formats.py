"""The model file formats, one registry entry each: what export.py writes (``FORMATS``, by
``file_format``) and what eval.py and predict.py read (``READERS``, by suffix, with the
``.ckpt``): suffix, writer, load-back check, dynamic batch, predictor per runtime. Everything
format-dependent derives from it; a new format: docs/deployment.md#model-file-formats.
"""
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import mindspore as ms
import numpy as np
from mindspore import nn

from src.deploy.exporting import (
    mindir_batch_dims,
    onnx_batch_dims,
    write_air,
    write_mindir,
    write_onnx,
)
from src.deploy.inference import (
    Forward,
    checkpoint_predictor,
    chunks,
    load_mindir,
    load_network,
    load_onnx,
    mindir_predictor,
    onnx_predictor,
)
from src.models.bn_fold import fold_batchnorm
from src.models.tta import TTA_MODES, with_tta
from src.utils.config import ConfigError
from src.utils.errors import WriteError
from src.utils.hub import is_pretrained_source

LOGGER = logging.getLogger(__name__)

Writer = Callable[[nn.Cell, ms.Tensor, str, bool], None]
"""``write(net, dummy, path, dynamic_batch)``, ``path`` with its suffix."""
Predictor = Callable[..., Forward]
"""``predictor(path, **load_predictor's keywords)``."""

RUNTIMES = ("mindspore", "onnxruntime")
"""Values of ``runtime``: what runs a ``.ckpt``; the first is the default."""

AIR_NOTE = ("note: AIR export is deprecated in MindSpore 2.10 (to be removed in a future "
            "version); it is kept while it works on Ascend, MINDIR is the path forward")
"""Printed (stderr) when file_format AIR is chosen; MindSpore itself logs a warning."""


@dataclass(frozen=True, kw_only=True)
class ModelFormat:
    """One model file format: its ``suffix`` (``""``: a folder), ``write`` (None: not by
    ``export_model``), load-back ``check`` (None: a non-empty file is enough),
    ``dynamic_batch`` support and ``batch_dims`` reader, ``predictors`` by runtime
    (a single one runs the file whatever ``runtime`` says), export ``devices`` (empty: any)
    and a ``note`` printed when chosen."""

    suffix: str
    write: Writer | None = None
    check: Callable[[str], object] | None = None
    dynamic_batch: bool = False
    batch_dims: Callable[[str], tuple[int | None, int | None]] | None = None
    predictors: Mapping[str, Predictor] = field(default_factory=dict)
    devices: tuple[str, ...] = ()
    note: str | None = None

    @property
    def fixed_runtime(self) -> str | None:
        """The runtime that runs the file whatever ``runtime`` says; None: ``runtime``'s."""
        return next(iter(self.predictors)) if len(self.predictors) == 1 else None


def check_onnx(path: str) -> None:
    """The ONNX checker, then an ONNX Runtime session."""
    import onnx

    onnx.checker.check_model(path)
    load_onnx(path)


def checkpoint_onnx_predictor(checkpoint_path: str, *, net_name: str, class_num: int,
                              batch_size: int, use_ema: bool, device_target: str | None,
                              stem_pool_pad_mode: str, tta: str = TTA_MODES[0]) -> Forward:
    """``runtime: onnxruntime``: the checkpoint's network, BatchNorms folded, as ``tta``
    evaluates it (``with_tta``), exported to ONNX per image shape at first use
    (``onnx_of_network``), ``batch_size`` images per run."""
    del device_target  # CPU (check_runtime); the graph gets the exportable stem pool
    net = load_network(net_name, class_num, checkpoint_path, use_ema=use_ema,
                       device_target=None, stem_pool_pad_mode=stem_pool_pad_mode)
    folded = fold_batchnorm(net)
    net = with_tta(net, tta)
    sessions = {}

    def run(images: np.ndarray) -> np.ndarray:
        shape = tuple(images.shape[1:])
        if shape not in sessions:
            sessions[shape] = onnx_of_network(net, shape)
            LOGGER.info("%s: runtime onnxruntime: exported to ONNX for input (batch, %s) with "
                        "%d BatchNorms folded, running in ONNX Runtime", checkpoint_path,
                        ", ".join(map(str, shape)), folded)
        return np.concatenate([sessions[shape](chunk) for chunk in chunks(images, batch_size)])
    return run


FORMATS: dict[str, ModelFormat] = {
    "ONNX": ModelFormat(suffix=".onnx", write=write_onnx, check=check_onnx, dynamic_batch=True,
                        batch_dims=onnx_batch_dims,
                        predictors={"onnxruntime": onnx_predictor}),
    "MINDIR": ModelFormat(suffix=".mindir", write=write_mindir, check=load_mindir,
                          dynamic_batch=True, batch_dims=mindir_batch_dims,
                          predictors={"mindspore": mindir_predictor}),
    "AIR": ModelFormat(suffix=".air", write=write_air, devices=("Ascend",), note=AIR_NOTE),
    "SAFETENSORS": ModelFormat(suffix=""),  # a folder (export.py's publish), read as a .ckpt
}
"""The export formats by ``file_format`` (config.yaml's choices)."""

CHECKPOINT = ModelFormat(suffix=".ckpt", predictors={
    "mindspore": checkpoint_predictor, "onnxruntime": checkpoint_onnx_predictor})
"""Weights in any form (``model_suffix``); read, not exported."""

SUFFIXES = {name: f.suffix for name, f in FORMATS.items() if f.write}
"""File suffix per ``file_format`` written to a file."""

DYNAMIC_BATCH_FORMATS = tuple(name for name, f in FORMATS.items() if f.dynamic_batch)
"""Formats that ``dynamic_batch`` exports with a symbolic batch dimension."""

READERS = {f.suffix: f for f in sorted((CHECKPOINT, *FORMATS.values()), key=lambda f: f.suffix)
           if f.predictors}
"""The formats eval.py and predict.py read, by suffix (sorted)."""


def export_model(net: nn.Cell, dummy: ms.Tensor, file_name: str, file_format: str,
                 dynamic_batch: bool = False) -> None:
    """Write ``net`` (inference mode; may get the exportable stem max pool, in place) traced
    on ``dummy``, float32 (batch_size, 3, H, W), to ``file_name`` + the suffix of
    ``file_format``; ``dynamic_batch``: a symbolic batch in the input and the output.

    Raises:
        ValueError: If ``dynamic_batch`` is asked for a format without it.
        OSError, RuntimeError: As MindSpore's exporters (``check_exported`` checks the file).
    """
    fmt = FORMATS[file_format]
    if dynamic_batch and not fmt.dynamic_batch:
        raise ValueError(f"dynamic_batch is supported for {' and '.join(DYNAMIC_BATCH_FORMATS)} "
                         f"only, not {file_format}")
    fmt.write(net, dummy, file_name + fmt.suffix, dynamic_batch)


def check_exported(path: str, file_format: str, dynamic_batch: bool = False) -> None:
    """Load an exported file back (the format's ``check``); with ``dynamic_batch`` it must
    declare a symbolic batch. WriteError: why it is not usable, or which batch is fixed."""
    fmt = FORMATS[file_format]
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        raise WriteError(f"export wrote no {file_format} file (disk full, or the folder not "
                         f"writable? MindSpore's log above may say more)")
    try:
        if fmt.check is not None:
            fmt.check(path)
        declared = fmt.batch_dims(path) if dynamic_batch else (None, None)
    except Exception as err:  # onnx's, ONNX Runtime's and MindSpore's own error types
        raise WriteError(f"the exported {file_format} file does not load back: "
                         f"{str(err).splitlines()[0]}") from err
    fixed = [f"{side} {dim}" for side, dim in zip(("input", "output"), declared) if dim]
    if fixed:
        raise WriteError(f"the exported {file_format} file declares a fixed batch "
                         f"({', '.join(fixed)}) although dynamic_batch is true")


def declared_batch_dims(path: str) -> tuple[int | None, int | None]:
    """The (input, output) batch an exported file declares (its format's ``batch_dims``):
    an int, or None when symbolic. ValueError for a suffix without a reader."""
    readable = [f for f in FORMATS.values() if f.batch_dims]
    for fmt in readable:
        if path.endswith(fmt.suffix):
            return fmt.batch_dims(path)
    raise ValueError(f"{path}: expected an {' or '.join(f.suffix for f in readable)} file")


def onnx_of_network(net: nn.Cell, image_shape: tuple[int, int, int]) -> Forward:
    """``net`` in ONNX Runtime for images (n, 3, H, W) of ``image_shape`` (3, H, W), any n:
    exported with a symbolic batch to a temporary folder, removed once loaded. WriteError if
    no file could be written."""
    with tempfile.TemporaryDirectory(prefix="resnet-onnx-") as folder:
        path = os.path.join(folder, "model")
        export_model(net, ms.Tensor(np.zeros((2, *image_shape), np.float32)), path, "ONNX",
                     dynamic_batch=True)
        path += FORMATS["ONNX"].suffix
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            raise WriteError(f"runtime onnxruntime: could not write the temporary ONNX file in "
                             f"{tempfile.gettempdir()} (disk full? MindSpore's log above may "
                             f"say more)")
        forward, _ = load_onnx(path)
    return forward


def model_suffix(checkpoint_path: str) -> str:
    """A model file's suffix; ``.ckpt`` for weights in any form (``src.utils.hub``)."""
    if is_pretrained_source(checkpoint_path):
        return CHECKPOINT.suffix
    return os.path.splitext(checkpoint_path)[1]


def model_runtime(checkpoint_path: str, runtime: str = RUNTIMES[0]) -> str:
    """The runtime that runs a model file: its format's own, else ``runtime`` (a ``.ckpt``)."""
    fmt = READERS.get(model_suffix(checkpoint_path))
    return (fmt and fmt.fixed_runtime) or runtime


def check_runtime(checkpoint_path: str, runtime: str, device_target: str | None = None) -> None:
    """Check ``runtime`` against the model file and ``device_target`` (None: not checked).

    Raises:
        ConfigError: If ``runtime`` is not in ``RUNTIMES``, or is ``onnxruntime`` off the CPU
            or with a file it cannot run (a ``.mindir``).
    """
    if runtime not in RUNTIMES:
        raise ConfigError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    if runtime != "onnxruntime":
        return
    if device_target not in (None, "CPU"):
        raise ConfigError(f"runtime onnxruntime runs on the CPU (the onnxruntime package of "
                          f"requirements.txt is ONNX Runtime's CPU build) but device_target is "
                          f"{device_target}: pass --device_target CPU, or --runtime mindspore")
    fmt = READERS.get(os.path.splitext(checkpoint_path)[1])
    if fmt is not None and runtime not in fmt.predictors:
        raise ConfigError(f"runtime onnxruntime cannot run checkpoint_path {checkpoint_path!r}: "
                          f"a {fmt.suffix} runs in MindSpore only; pass --runtime mindspore, or "
                          f"the .ckpt (exported to ONNX on the fly) or an .onnx export")


def load_predictor(checkpoint_path: str, net_name: str, class_num: int, batch_size: int, *,
                   use_ema: bool = True, device_target: str | None = None,
                   stem_pool_pad_mode: str = "pad", runtime: str = RUNTIMES[0],
                   tta: str = TTA_MODES[0]) -> Forward:
    """A model file of ``READERS`` as a ``Forward`` over images preprocessed as in eval: its
    format's predictor for ``runtime``. ``batch_size``: images per pass, at most (a
    fixed-batch export needs its own); the network keys and ``tta`` (``with_tta``) apply to
    a ``.ckpt`` only (an exported graph runs as exported: its model record's ``tta``).

    Raises:
        ConfigError: For another suffix, or a ``runtime`` that does not fit (``check_runtime``).
    """
    fmt = READERS.get(model_suffix(checkpoint_path))
    if fmt is None:
        raise ConfigError(f"checkpoint_path {checkpoint_path!r}: expected a "
                          f"{', '.join(READERS)} file")
    check_runtime(checkpoint_path, runtime, device_target)
    load = fmt.predictors[fmt.fixed_runtime or runtime]
    return load(checkpoint_path, net_name=net_name, class_num=class_num, batch_size=batch_size,
                use_ema=use_ema, device_target=device_target,
                stem_pool_pad_mode=stem_pool_pad_mode, tta=tta)
