"""Convert ResNet weights between torchvision (.pth state_dict) and MindSpore (.ckpt).

    python tools/convert_torch_checkpoint.py resnet50-torchvision.pth resnet50.ckpt
    python tools/convert_torch_checkpoint.py output/resnet50-90_5004.ckpt resnet50.pth

The direction follows the file suffixes (.pth/.pt -> .ckpt, or .ckpt -> .pth). A torch file may be
a bare state_dict, ``{"state_dict": ...}`` (or ``{"model": ...}``), with or without DataParallel's
``module.`` prefix. The network (depth, class count) is read from the weights and checked against
ours (``src/models/resnet.py``): every name and shape must match, else the error lists the
differences.

Names map one to one (never by position: MindSpore orders BatchNorm tensors differently):
BatchNorm ``weight/bias/running_mean/running_var`` <-> ``gamma/beta/moving_mean/moving_variance``;
convolution and ``fc`` names are the same. torch's ``num_batches_tracked`` has no MindSpore
counterpart: dropped on the way in, written back as 0 on the way out. Values are copied
bit-exactly (float32). torch is needed by this tool only, never by ``src/`` or the entry points.
"""
import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from src.models.resnet import create_network  # noqa: E402
from src.utils.checkpoint import (  # noqa: E402
    CheckpointError,
    CheckpointMismatchError,
    atomic_save_checkpoint,
    check_finite,
    compare,
    infer_resnet,
    layout_names,
    source_names,
)
from src.utils.errors import UserError  # noqa: E402


class ConversionError(UserError, ValueError):
    """The weights do not describe a torchvision ResNet that our network can hold."""


def unwrap_state_dict(obj):
    """The state_dict inside a loaded torch file: bare, ``{"state_dict": ...}`` or
    ``{"model": ...}``; DataParallel's ``module.`` prefix removed."""
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict):
        raise ConversionError(f"expected a state_dict (a dict of tensors), got "
                              f"{type(obj).__name__}")
    return {(k[len("module."):] if k.startswith("module.") else k): v for k, v in obj.items()}


def torch_to_ms_names(torch_names):
    """Map torchvision state_dict keys to our parameter names (the ``torchvision`` layout of
    ``src.utils.checkpoint``).

    Returns:
        dict: torch key -> MindSpore name, for every key except ``num_batches_tracked``.
    """
    return layout_names(torch_names, "torchvision")


def ms_to_torch_names(ms_names):
    """Map our parameter names to torchvision state_dict keys (inverse of ``torch_to_ms_names``).

    Returns:
        dict: MindSpore name -> torch key.
    """
    return source_names(ms_names, "torchvision")


def infer_network(ms_arrays):
    """(net_name, class_num) from the weights' block counts and classifier shape.

    Raises:
        ConversionError: If the layout is not one of resnet18/34/50/101/152.
    """
    try:
        return infer_resnet({name: array.shape for name, array in ms_arrays.items()})
    except CheckpointMismatchError as err:
        raise ConversionError(str(err)) from err


def network_layout(net_name, class_num):
    """Our network ``net_name`` with ``class_num`` classes for its parameter names and shapes
    only: built under ``mindspore.nn.utils.no_init_parameters``, so its weights are not
    initialized (for ResNet-152 that takes seconds) and must not be read.

    Returns:
        mindspore.nn.Cell: The network, parameters uninitialized.
    """
    from mindspore.nn.utils import no_init_parameters

    with no_init_parameters():
        return create_network(net_name, class_num=class_num)


def check_against_network(ms_arrays, source):
    """Build the matching network of ours (names and shapes, ``network_layout``) and compare
    every name and shape.

    Returns:
        tuple(str, int): (net_name, class_num).

    Raises:
        ConversionError: Listing the names that are missing, extra or mis-shaped.
    """
    net_name, class_num = infer_network(ms_arrays)
    missing, unexpected, mismatched = compare(network_layout(net_name, class_num), ms_arrays)
    if missing or unexpected or mismatched:
        raise ConversionError(f"{source}: weights do not fit {net_name} with {class_num} classes:"
                              f" missing {missing}; unmatched {unexpected}; "
                              f"shape mismatch {mismatched}")
    return net_name, class_num


def torch_state_to_ms_arrays(state_dict, source="state_dict"):
    """torch state_dict (tensors) -> {MindSpore name: float32 numpy array}, checked.

    Raises:
        ConversionError: If the weights do not fit one of our networks (names listed).
    """
    state_dict = unwrap_state_dict(state_dict)
    mapping = torch_to_ms_names(list(state_dict))
    arrays = {ms_name: state_dict[t_name].detach().cpu().float().numpy()
              for t_name, ms_name in mapping.items()}
    check_against_network(arrays, source)
    return arrays


def ms_arrays_to_torch_state(ms_arrays, source="checkpoint"):
    """{MindSpore name: numpy array} -> torchvision state_dict of torch tensors.

    Optimizer state in training checkpoints (``moments.*``, ``learning_rate``, ...) is left out.
    ``num_batches_tracked`` is written as 0 for every BatchNorm.
    """
    import torch

    net_name, class_num = check_against_network(ms_arrays, source)
    ours = {p.name for p in network_layout(net_name, class_num).get_parameters()}
    state = {}
    for ms_name, t_name in ms_to_torch_names(sorted(ours)).items():
        state[t_name] = torch.from_numpy(np.array(ms_arrays[ms_name], copy=True))
    for name in sorted(n for n in state if n.endswith(".running_mean")):
        state[name.replace("running_mean", "num_batches_tracked")] = torch.tensor(
            0, dtype=torch.long)
    return state


def save_ms_checkpoint(arrays, path):
    """Write ``{name: array}`` as a MindSpore checkpoint (via a temporary file + rename)."""
    import mindspore as ms

    atomic_save_checkpoint([{"name": n, "data": ms.Tensor(a)} for n, a in arrays.items()], path)


def load_ms_arrays(path):
    """Read a MindSpore checkpoint as ``{name: numpy array}`` (text entries such as the
    stored ``run_config`` of a training checkpoint are left out)."""
    import mindspore as ms

    return {name: param.asnumpy() for name, param in ms.load_checkpoint(path).items()
            if not isinstance(param, str)}


def _check_finite(arrays, source):
    try:
        check_finite(arrays, source)
    except CheckpointError as err:
        raise ConversionError(str(err)) from err


def convert(src, dst):
    """Convert ``src`` to ``dst``; the direction follows the suffixes. Returns a summary line.
    Weights are written as float32 (fp16/bf16 torch weights are widened, losslessly).

    Raises:
        FileNotFoundError: If ``src`` does not exist.
        ConversionError: If the suffixes are not .pth/.pt <-> .ckpt, the weights do not fit or
            hold NaN or inf.
    """
    import torch

    src_ext, dst_ext = os.path.splitext(src)[1], os.path.splitext(dst)[1]
    to_ms = src_ext in (".pth", ".pt") and dst_ext == ".ckpt"
    if not to_ms and not (src_ext == ".ckpt" and dst_ext in (".pth", ".pt")):
        raise ConversionError(f"convert .pth/.pt -> .ckpt or .ckpt -> .pth/.pt; got {src} -> {dst}")
    if not os.path.isfile(src):
        raise FileNotFoundError(f"input not found: {src}")
    if to_ms:
        try:
            loaded = torch.load(src, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001  (pickle, zip and torch errors alike)
            raise ConversionError(f"cannot read {src} as a torch file: "
                                  f"{str(err).splitlines()[0]}") from err
        arrays = torch_state_to_ms_arrays(loaded, src)
        _check_finite(arrays, src)
        save_ms_checkpoint(arrays, dst)
        count = len(arrays)
    else:
        try:
            arrays = load_ms_arrays(src)
        except (ValueError, RuntimeError, OSError) as err:
            raise ConversionError(f"cannot read {src} as a MindSpore checkpoint: "
                                  f"{str(err).splitlines()[0]}") from err
        _check_finite(arrays, src)
        state = ms_arrays_to_torch_state(arrays, src)
        tmp = dst + ".partial"
        torch.save(state, tmp)
        os.replace(tmp, dst)
        count = len(state)
    net_name, class_num = infer_network(arrays)
    return f"{src} -> {dst}: {net_name}, {class_num} classes, {count} tensors"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("src", help="input: torch .pth/.pt state_dict or MindSpore .ckpt")
    parser.add_argument("dst", help="output: .ckpt (from .pth) or .pth (from .ckpt)")
    args = parser.parse_args(argv)
    try:
        print(convert(args.src, args.dst))
    except (ConversionError, FileNotFoundError) as err:
        print(f"convert_torch_checkpoint.py: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
