"""Static int8 post-training quantization of an exported ONNX ResNet with ONNX Runtime's tools
(``onnxruntime.quantization``, after its "Quantize ONNX models" guide): opset 13 and
``quant_pre_process`` (``prepare_model``), then ``quantize_static`` in QDQ format, per-channel
int8 weights, uint8 activations, MinMax calibration on real images preprocessed as in eval,
the logits left float32. The choices and measurements: docs/deployment.md#int8-quantization.
"""
import importlib
import logging
import os
import platform
import re
import tempfile

import numpy as np

from src.data.image_check import METADATA_PREFIX, is_image_name
from src.data.settings import EvalPreprocess
from src.deploy.inference import chunks, preprocess_images
from src.utils.config import ConfigError
from src.utils.errors import MissingFileError
from src.utils.progress import Progress

LOGGER = logging.getLogger(__name__)


def check_quantize_config(quantize: str, file_format: str, calibration_data_path: str) -> None:
    """Check the keys of an int8 export (``quantize`` ``int8``) before any slow work.

    Raises:
        ConfigError: If ``file_format`` is not ONNX, or ``calibration_data_path`` is empty.
        MissingFileError: If ``calibration_data_path`` is not a folder.
        ImportError: If ONNX Runtime's quantization tools cannot be imported.
    """
    if quantize != "int8":
        return
    if file_format != "ONNX":
        raise ConfigError(f"quantize int8 needs file_format ONNX (got {file_format}): "
                          f"ONNX Runtime quantizes ONNX graphs only; pass --file_format ONNX")
    if not calibration_data_path:
        raise ConfigError("calibration_data_path is empty: quantize int8 needs "
                          "--calibration_data_path, class folders of real training images")
    if not os.path.isdir(calibration_data_path):
        raise MissingFileError(f"calibration_data_path {calibration_data_path!r} is not a "
                               f"folder: give class folders of real training images")
    _import_quantization()  # before the slow export: a missing package fails at once


def _class_images(root):
    """Each class folder's images under ``root`` (sorted; macOS metadata skipped), classes
    without images left out; without any, ``root``'s own images as one group (a multi-label
    image folder)."""
    def images_in(folder):
        return [os.path.join(folder, n) for n in sorted(os.listdir(folder))
                if is_image_name(n) and not n.startswith(METADATA_PREFIX)]

    folders = sorted(e.path for e in os.scandir(root) if e.is_dir())
    groups = [images for images in map(images_in, folders) if images]
    return groups or [images for images in [images_in(root)] if images]


def _spread(items, count):
    """``count`` of ``items`` at evenly spaced positions, in order (all if fewer)."""
    if count >= len(items):
        return list(items)
    return [items[(2 * i + 1) * len(items) // (2 * count)] for i in range(count)]


def select_calibration_images(root: str, count: int) -> list[str]:
    """``count`` images (all, if fewer) of ``root``'s class folders, taken round by round
    (the 1st of every class, then the 2nd, ...; a partial round spread evenly over the
    classes): every class gives ``count // classes`` or one more, each batch mixes them. One
    class folder, or a folder of images without any (multi-label data): evenly spaced ones.

    Raises:
        MissingFileError: If ``root`` holds no image, in class folders or itself.
    """
    per_class = _class_images(root)
    if not per_class:
        raise MissingFileError(f"calibration_data_path {root!r} holds no images: expected one "
                               f"sub-folder of images per class, or the images themselves")
    selected = []
    if len(per_class) == 1:  # one class, or a folder of images: no rounds to take
        selected = _spread(per_class[0], count)
    for rank in range(max(map(len, per_class)) if len(per_class) > 1 else 0):
        this_round = [images[rank] for images in per_class if rank < len(images)]
        selected += _spread(this_round, count - len(selected))
        if len(selected) == count:
            break
    if len(selected) < count:
        LOGGER.warning("calibration_data_path %s holds %d images, fewer than calibration_images "
                       "%d: calibrating on all of them", root, len(selected), count)
    return selected


def pad_batch(images: np.ndarray, batch_size: int) -> np.ndarray:
    """Fill a short batch float32 (n, 3, H, W) up to ``batch_size`` by repeating its own
    images (MinMax ranges unchanged, where zeros would add a fake image)."""
    return np.resize(images, (batch_size,) + images.shape[1:]).astype(np.float32, copy=False)


class ImageCalibrationReader:
    """ONNX Runtime's ``CalibrationDataReader`` (duck-typed: importing this module does not
    import ONNX Runtime) over image files, one batch read and preprocessed (as eval) at a time.

    Args:
        paths (list[str]): Calibration images.
        input_name (str): The model's input name (``image`` for this package's exports).
        batch_size (int): The model's fixed batch dimension; a short last batch is padded
            (``pad_batch``).
        preprocess (EvalPreprocess): The eval preprocessing (``preprocess_images``).
        progress (Progress, optional): Told the number of images of each batch read.
    """

    def __init__(self, paths: list[str], input_name: str, batch_size: int,
                 preprocess: EvalPreprocess, progress: Progress | None = None):
        self.input_name = input_name
        self.batch_size = batch_size
        self.preprocess = preprocess
        self.progress = progress
        self.batches = chunks(paths, batch_size)

    def get_next(self) -> dict[str, np.ndarray] | None:
        """The next batch as ``{input_name: float32 (batch_size, 3, size, size)}``; None at
        the end."""
        paths = next(self.batches, None)
        if paths is None:
            return None
        images = preprocess_images(paths, self.preprocess)
        if self.progress is not None:
            self.progress.update(len(paths))
        return {self.input_name: pad_batch(images, self.batch_size)}


PER_CHANNEL_OPSET = 13
"""The first ONNX opset with per-channel Q/DQ (MindSpore writes 11; ``quantize_static`` does
not raise it)."""


def _import_quantization():
    """ONNX Runtime's quantization tools, or an ImportError naming what to install (onnx,
    sympy)."""
    try:
        from onnxruntime import quantization
        importlib.import_module("onnxruntime.tools.symbolic_shape_infer")  # needs sympy
    except ImportError as err:
        raise ImportError(f"quantize int8 needs ONNX Runtime's quantization tools, which need "
                          f"onnx and sympy ({err}): pip install onnx sympy") from err
    return quantization


def prepare_model(fp32_path: str, prepared_path: str) -> None:
    """Write ``fp32_path`` ready for ``quantize_static`` to ``prepared_path``: opset raised to
    ``PER_CHANNEL_OPSET``, then ``quant_pre_process`` (shape inference, optimization)."""
    import onnx
    from onnx import version_converter

    model = onnx.load(fp32_path)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < PER_CHANNEL_OPSET:
        model = version_converter.convert_version(model, PER_CHANNEL_OPSET)
    _import_quantization().quant_pre_process(model, prepared_path)


X86_MACHINES = ("x86_64", "amd64", "i386", "i686")
VNNI_FLAGS = ("avx512_vnni", "avx_vnni")  # /proc/cpuinfo names of AVX-512 VNNI and AVX-VNNI


def reduce_range_for(setting: str, cpuinfo: str | None = None,
                     machine: str | None = None) -> bool:
    """Whether int8 weights use 7 bits (``reduce_range``) for ``quantize_reduce_range``
    ``setting``: ``true``/``false`` as given; ``auto``: true on an x86-64 CPU without VNNI
    (this one's, or ``cpuinfo`` text / ``machine`` given), whose kernels saturate with 8-bit
    weights (docs/deployment.md#int8-quantization)."""
    if setting != "auto":
        return setting == "true"
    if (machine or platform.machine()).lower() not in X86_MACHINES:
        return False
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                cpuinfo = f.read()
        except OSError:
            return True
    match = re.search(r"^flags\s*:(.*)$", cpuinfo, re.M)
    flags = set(match.group(1).split()) if match else set()
    return not flags.intersection(VNNI_FLAGS)


def quantize_int8(fp32_path: str, int8_path: str, reader: ImageCalibrationReader, workdir: str,
                  reduce_range: bool = False) -> None:
    """Quantize ``fp32_path`` to ``int8_path`` (``prepare_model`` in ``workdir``, then
    ``quantize_static`` as in the module docstring, calibrated on ``reader``'s batches) and
    load the result once in ONNX Runtime to check it."""
    quantization = _import_quantization()
    prepared = os.path.join(workdir, "prepared.onnx")
    prepare_model(fp32_path, prepared)
    quantization.quantize_static(
        prepared, int8_path, reader, quant_format=quantization.QuantFormat.QDQ,
        per_channel=True, reduce_range=reduce_range,
        activation_type=quantization.QuantType.QUInt8,
        weight_type=quantization.QuantType.QInt8,
        calibrate_method=quantization.CalibrationMethod.MinMax,
        extra_options={"OpTypesToExcludeOutputQuantization": ["Gemm"]})
    import onnxruntime

    onnxruntime.InferenceSession(int8_path, providers=["CPUExecutionProvider"])


def onnx_input_name(path: str) -> str:
    """The name of an ONNX model's first graph input."""
    import onnx

    return onnx.load(path, load_external_data=False).graph.input[0].name


def export_int8(fp32_path: str, out_path: str, paths: list[str], batch_size: int,
                preprocess: EvalPreprocess, *, reduce_range: bool = False) -> None:
    """Quantize an exported float32 ONNX model to ``out_path``, calibrated on ``paths``, with
    progress (``src.utils.progress``); the file appears whole or not at all (written in a temporary
    folder beside it, then renamed).

    Args:
        fp32_path (str): The float32 model, input float32 (batch_size, 3, image_size,
            image_size).
        out_path (str): The int8 model's file (``.onnx``); replaced if it exists.
        paths (list[str]): Calibration images (``select_calibration_images``).
        batch_size (int): The batch size of the export (its fixed batch dimension, if fixed).
        preprocess (EvalPreprocess): The calibration images' preprocessing (eval's).
        reduce_range (bool): 7-bit weights (``reduce_range_for``).
    """
    folder = os.path.dirname(os.path.abspath(out_path))
    with tempfile.TemporaryDirectory(prefix=".quantize.", dir=folder) as workdir, \
            Progress(len(paths), "calibration") as progress:
        reader = ImageCalibrationReader(paths, onnx_input_name(fp32_path), batch_size,
                                        preprocess, progress)
        partial = os.path.join(workdir, "int8.onnx")
        quantize_int8(fp32_path, partial, reader, workdir, reduce_range)
        os.replace(partial, out_path)
