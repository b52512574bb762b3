"""Static int8 post-training quantization of an exported ONNX ResNet with ONNX Runtime.

``export.py --file_format ONNX --quantize int8 --calibration_data_path DIR`` exports the
float32 graph as usual (BatchNorms folded), then quantizes it here with ONNX Runtime's tools
(``onnxruntime.quantization``; source: the "Quantize ONNX models" guide of the ONNX Runtime
docs, performance/model-optimizations/quantization, and ``quantize_static``'s docstring):

1. ``prepare_model``: the opset raised to 13 (per-channel Q/DQ needs it; MindSpore writes 11),
   then ``quant_pre_process`` (shape inference and graph optimization, which the docs
   recommend before quantizing: the quantizer needs every tensor's shape).
2. ``quantize_static`` in the QDQ format (QuantizeLinear/DequantizeLinear pairs around each
   quantized operator: the format ONNX Runtime's CPU kernels are tuned for since 1.11; at
   session start it fuses them into QLinearConv, QLinearAdd, QGemm), per-channel ``QInt8``
   weights, ``QUInt8`` activations (asymmetric uint8 spends all 256 levels on a ReLU
   output's [0, max]). ``reduce_range`` (7-bit weights) by ``quantize_reduce_range``
   (``reduce_range_for``), following ``quantize_static``'s docstring: off on x86-64 CPUs with
   VNNI; on x86-64 without it ONNX Runtime's uint8 x int8 kernels can saturate their integer
   sums with 8-bit weights (measured on an AVX2-only AMD EPYC: mean logits cosine to fp32
   0.9715 without, 0.9909 with ``reduce_range``; docs/deployment.md). The classifier's
   output (the logits) stays float32. Ranges are calibrated with MinMax over real images:
   ONNX Runtime's Percentile and Entropy calibrators keep every activation of every
   calibration batch in memory (about 100 MB per 224 px ResNet-50 image: 25 GB for 256), and
   MinMax already meets the accuracy target (docs/deployment.md, CIFAR-10 ResNet-18: -0.06
   points top-1).

The calibration images come from class folders (the training data), taken evenly over the
classes in a fixed order, preprocessed exactly as in eval (``preprocess_images``) and fed in
batches of the export batch size (``batch_size``; the last one padded, which a fixed batch
dimension needs). A dynamic-batch float32 graph (``dynamic_batch``) gives a dynamic-batch int8
graph: the declared dimensions are kept. The result runs in
ONNX Runtime like any other ``.onnx`` (``src.deploy.inference.load_onnx``): float32 images (N, 3, H,
W) in, float32 logits (N, class_num) out.
"""
import importlib
import logging
import os
import platform
import re
import tempfile

import numpy as np

from src.data.image_check import METADATA_PREFIX, is_image_name
from src.deploy.inference import chunks, preprocess_images
from src.utils.config import ConfigError
from src.utils.errors import MissingFileError
from src.utils.progress import Progress

LOGGER = logging.getLogger(__name__)


def check_quantize_config(quantize, file_format, calibration_data_path):
    """Check the export keys of an int8 export before any slow work.

    Args:
        quantize (str): ``none`` or ``int8``.
        file_format (str): The export format (``ONNX``, ``MINDIR``, ...).
        calibration_data_path (str): Class folders of calibration images ("" if none).

    Raises:
        ConfigError: If ``quantize`` is ``int8`` with a ``file_format`` other than ONNX, or
            without a ``calibration_data_path``.
        MissingFileError: If ``calibration_data_path`` is not a folder.
        ImportError: If ONNX Runtime's quantization tools cannot be imported (names what to
            install).
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
    """Each class folder's images under ``root`` (sorted folders, sorted files; macOS
    metadata files skipped): a list of lists of paths, classes without images left out."""
    folders = sorted(e.path for e in os.scandir(root) if e.is_dir())
    listed = ([os.path.join(folder, n) for n in sorted(os.listdir(folder))
               if is_image_name(n) and not n.startswith(METADATA_PREFIX)] for folder in folders)
    return [images for images in listed if images]


def _spread(items, count):
    """``count`` of ``items`` at evenly spaced positions, in order (all of them when
    ``count >= len(items)``)."""
    if count >= len(items):
        return list(items)
    return [items[(2 * i + 1) * len(items) // (2 * count)] for i in range(count)]


def select_calibration_images(root, count):
    """The calibration images: ``count`` of the images in ``root``'s class folders, taken
    evenly over the classes in a fixed order.

    Images are taken round by round: the 1st image (sorted by name) of every class, then the
    2nd, and so on; a round that does not fit whole takes classes evenly spaced over the
    sorted class list. So every class gives ``count // classes`` images or one more (fewer
    only if it has fewer), and each batch of the result mixes the classes.

    Args:
        root (str): A folder with one sub-folder of images per class (``.jpg``, ``.png`` ...).
        count (int): Images wanted; all the images when the folders hold fewer.

    Returns:
        list[str]: Image paths, ``min(count, images in root)`` of them.

    Raises:
        MissingFileError: If ``root`` holds no class folder with images (names the key).
    """
    per_class = _class_images(root)
    if not per_class:
        raise MissingFileError(f"calibration_data_path {root!r} holds no class folders with "
                               f"images: expected one sub-folder of images per class")
    selected = []
    for rank in range(max(len(images) for images in per_class)):
        this_round = [images[rank] for images in per_class if rank < len(images)]
        selected += _spread(this_round, count - len(selected))
        if len(selected) == count:
            break
    if len(selected) < count:
        LOGGER.warning("calibration_data_path %s holds %d images, fewer than calibration_images "
                       "%d: calibrating on all of them", root, len(selected), count)
    return selected


def pad_batch(images, batch_size):
    """Fill a short last batch up to ``batch_size`` by repeating its own images (a repeated
    image leaves MinMax ranges unchanged, where zero padding would add a fake image).

    Args:
        images (numpy.ndarray): float32 (n, 3, H, W), 1 <= n <= batch_size.
        batch_size (int): The batch size of the export (its fixed batch dimension, if fixed).

    Returns:
        numpy.ndarray: float32 (batch_size, 3, H, W).
    """
    return np.resize(images, (batch_size,) + images.shape[1:]).astype(np.float32, copy=False)


class ImageCalibrationReader:
    """ONNX Runtime's ``CalibrationDataReader`` over image files: each ``get_next`` reads,
    preprocesses (as eval) and returns the next batch, so only one batch is in memory.

    Duck-typed to ``onnxruntime.quantization.CalibrationDataReader`` (whose
    ``__subclasshook__`` accepts any class with ``get_next``), so that importing this module
    does not import ONNX Runtime.

    Args:
        paths (list[str]): Calibration images.
        input_name (str): The model's input name (``image`` for this package's exports).
        batch_size (int): The model's fixed batch dimension; a short last batch is padded
            (``pad_batch``).
        preprocess (EvalPreprocess): The eval preprocessing (``preprocess_images``).
        progress (Progress, optional): Told the number of images of each batch read.
    """

    def __init__(self, paths, input_name, batch_size, preprocess, progress=None):
        self.input_name = input_name
        self.batch_size = batch_size
        self.preprocess = preprocess
        self.progress = progress
        self.batches = chunks(paths, batch_size)

    def get_next(self):
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
"""The first ONNX opset whose QuantizeLinear/DequantizeLinear take an ``axis`` (per-channel
scales). MindSpore exports opset 11, and ``quantize_static`` of ONNX Runtime 1.32 does not raise
the opset itself: at 11 it writes per-channel DequantizeLinear nodes that no runtime loads."""


def _import_quantization():
    """ONNX Runtime's quantization tools, or an ImportError naming what to install (they
    import onnx, and ``quant_pre_process`` sympy, which the onnxruntime wheel does not pull)."""
    try:
        from onnxruntime import quantization
        importlib.import_module("onnxruntime.tools.symbolic_shape_infer")  # needs sympy
    except ImportError as err:
        raise ImportError(f"quantize int8 needs ONNX Runtime's quantization tools, which need "
                          f"onnx and sympy ({err}): pip install onnx sympy") from err
    return quantization


def prepare_model(fp32_path, prepared_path):
    """Make a float32 ONNX model ready for ``quantize_static``: opset raised to
    ``PER_CHANNEL_OPSET`` if lower (``onnx.version_converter``), then ONNX Runtime's
    ``quant_pre_process`` (symbolic and ONNX shape inference, graph optimization).

    Args:
        fp32_path (str): The float32 model.
        prepared_path (str): Where to write the prepared model.
    """
    import onnx
    from onnx import version_converter

    model = onnx.load(fp32_path)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < PER_CHANNEL_OPSET:
        model = version_converter.convert_version(model, PER_CHANNEL_OPSET)
    _import_quantization().quant_pre_process(model, prepared_path)


X86_MACHINES = ("x86_64", "amd64", "i386", "i686")
VNNI_FLAGS = ("avx512_vnni", "avx_vnni")  # /proc/cpuinfo names of AVX-512 VNNI and AVX-VNNI


def reduce_range_for(setting, cpuinfo=None, machine=None):
    """Whether int8 weights use 7 bits (ONNX Runtime's ``reduce_range``) for
    ``quantize_reduce_range`` ``setting``: ``true``/``false`` as given; ``auto``: true on an
    x86-64 CPU without VNNI (AVX-512 VNNI or AVX-VNNI), whose uint8 x int8 kernels saturate
    with 8-bit weights, false with VNNI and on other architectures (ARM's kernels do not
    saturate). The CPU is the one exporting: export on the kind of CPU that will run the
    model, or set it explicitly.

    Args:
        setting (str): ``auto``, ``true`` or ``false``.
        cpuinfo (str, optional): ``/proc/cpuinfo`` text (default: read it; unreadable on
            x86-64 counts as no VNNI).
        machine (str, optional): ``platform.machine()`` (default: this one's).

    Returns:
        bool: reduce_range.
    """
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


def quantize_int8(fp32_path, int8_path, reader, workdir, reduce_range=False):
    """Statically quantize an ONNX model with ONNX Runtime: ``prepare_model``, then
    ``quantize_static`` (QDQ, per-channel ``QInt8`` weights, ``QUInt8`` activations, MinMax
    calibration over ``reader``'s batches, the Gemm's output (the logits) left in float32;
    see the module docstring for the choices); the result is loaded once in ONNX Runtime to
    check it.

    Args:
        fp32_path (str): The float32 model.
        int8_path (str): Where to write the quantized model (overwritten).
        reader (CalibrationDataReader): The calibration batches.
        workdir (str): A folder for the intermediate model.
        reduce_range (bool): 7-bit weights (``reduce_range_for``).
    """
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


def onnx_input_name(path):
    """The name of an ONNX model's first graph input (read without loading weights into a
    session)."""
    import onnx

    return onnx.load(path, load_external_data=False).graph.input[0].name


def export_int8(fp32_path, out_path, paths, batch_size, preprocess, reduce_range=False):
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
