"""Checkpoint files: reading and checking them, atomic saving, naming, listing and pruning.

Every ``.ckpt`` this package reads or writes goes through this module; what a training
checkpoint holds and how other code bases' names are mapped: docs/network.md#checkpoints.
"""
import glob
import json
import logging
import os
import re
from collections.abc import Iterable
from typing import Any

import mindspore as ms
import mindspore.nn as nn
import numpy as np

from src.utils.architectures import ARCHITECTURES, architecture_of
from src.utils.errors import MissingFileError, UserError
from src.utils.hub import (
    PretrainedMismatchError,
    check_architecture,
    is_pretrained_source,
    pretrained_eval_settings,
    read_safetensors,
    resolve_weights,
    safetensors_shapes,
)
from src.utils.model_record import RECORD_KEY

CLASSIFIER_PREFIX = "fc."
STEP_KEY = "train_step"
CONFIG_KEY = "run_config"
BEST_KEY = "best_score"  # the run's best evaluation so far, JSON {"top1": float, "epoch": int}
DATA_KEY = "train_data"  # the data trained on, JSON {"images": int, "steps_per_epoch": int}
# the losses of the epoch so far (its record's mean), JSON {"sum": float, "count": int}
EPOCH_LOSS_KEY = "epoch_loss"
METADATA_KEYS = (STEP_KEY, CONFIG_KEY, BEST_KEY, DATA_KEY, EPOCH_LOSS_KEY, RECORD_KEY)
EMA_PREFIX, EMA_COUNTER = "ema.", "ema_updates"  # as src.training.train_step names them
OVERFLOW_COUNTER = "overflow_count"  # overflowed steps, counted by TrainStep on the device
# A network's count of training calls, which its stochastic depth draws hash
# (``src.models.resnet.ResNet`` with ``drop_path_rate`` > 0; advanced by TrainStep): training
# state, not a weight
DROP_PATH_STEP = "drop_path_step"
# TrainStep's gradient accumulation buffers (``grad_accum.<parameter>``, ``grad_accum_step``,
# ``grad_accum_loss``): zero at every optimizer step's end, so never saved (``is_saved``)
GRAD_ACCUM_PREFIX = "grad_accum"
GRAD_ACCUM_STEP, GRAD_ACCUM_LOSS = GRAD_ACCUM_PREFIX + "_step", GRAD_ACCUM_PREFIX + "_loss"
# Knowledge distillation (``src.training.distill``): the frozen teacher's tensors and the
# loss parts of the last step are never saved; the feature projection is saved (resume) and
# never loaded into a network (eval, export)
KD_TEACHER_PREFIX, KD_LOSS_PREFIX, KD_PROJECTION_PREFIX = "kd_teacher.", "kd_loss.", "kd_proj."
NAME = re.compile(r"-(\d+)_(\d+)\.ckpt$")
# Names Model.train's training cell adds to the network's: optimizer state and counters.
# Optimizer state: Momentum ``moments.``, AdamW ``adam_m.``/``adam_v.``, Lamb
# ``lamb_m.``/``lamb_v.``, Lars ``lars_m.``; the weight EMA (``src.training.train_step``):
# ``ema.`` and ``ema_updates``; ``TrainStep``'s count of overflowed steps: ``overflow_count``,
# and its gradient accumulation buffers; the stochastic depth call counter ``drop_path_step``.
TRAINING_STATE_PREFIXES = ("moments.", "accum.", GRAD_ACCUM_PREFIX, "adam_m.", "adam_v.",
                           "lamb_m.", "lamb_v.", "lars_m.",
                           "beta1_power", "beta2_power", "learning_rate", "global_step",
                           "momentum", "scale_sense", "current_iterator_step", "epoch_num",
                           "step_num", "last_overflow_iterator_step", EMA_PREFIX,
                           EMA_COUNTER, OVERFLOW_COUNTER, DROP_PATH_STEP,
                           KD_PROJECTION_PREFIX) + METADATA_KEYS
LOGGER = logging.getLogger(__name__)

# Checkpoint layouts of other code bases whose ResNets hold our tensors (same shapes, same
# order) under other names. A layout is recognised by name components only it uses (the keys
# of ``renames``) when none of ours (their values) occur; its names are then renamed component
# by component, its optimizer and training-state entries dropped (``training_state``: name
# prefixes, besides our ``TRAINING_STATE_PREFIXES``; its ``ema.`` weights are kept, for
# ``use_ema``), and ``network`` gives the network attributes its networks were built with
# (``NETWORK_ATTRIBUTES``: a network built otherwise gets a warning).
SOURCE_LAYOUTS = {
    "MindCV": {
        # mindcv/models/resnet.py: ``self.classifier = nn.Dense(...)``, ``down_sample`` in the
        # blocks; BatchNorm (``gamma``/``beta``/``moving_mean``/``moving_variance``) and
        # convolution names as ours. Its stem pool is ``nn.MaxPool2d(3, 2, pad_mode="same")``.
        "renames": {"classifier": "fc", "down_sample": "downsample"},
        # Saved with the network (``save_checkpoint(cb_params.train_network, ...)`` in
        # mindcv/utils/callbacks.py): TrainStep's EMA count ``updates``, and the state of the
        # optimizers of mindcv/optim and mindspore.nn.optim not in TRAINING_STATE_PREFIXES
        # (Adam, Lion, NAdam, Adan, RMSProp, SGD; Momentum and AdamW's are there).
        "training_state": ("updates", "moment1.", "moment2.", "moment3.", "vhat.",
                           "prev_gradient.", "lion_m.", "nadam_m.", "nadam_v.", "mu_schedule",
                           "mean_grad.", "mean_square.", "moment.", "stat."),
        "network": {"stem_pool_pad_mode": "same"},
    },
    "torchvision": {
        # torchvision/models/resnet.py and timm/models/resnet.py (its plain resnet18-152):
        # a state_dict with BatchNorm ``weight``/``bias``/``running_mean``/``running_var``,
        # convolution and ``fc`` names as ours; ``num_batches_tracked`` has no counterpart.
        # Their stem pool is ``nn.MaxPool2d(3, 2, padding=1)``. Used by the Hub weights
        # (``src.utils.hub``) and tools/convert_torch_checkpoint.py, both directions.
        "renames": {"running_mean": "moving_mean", "running_var": "moving_variance"},
        "batchnorm": {"weight": "gamma", "bias": "beta"},
        "training_state": (),
        "dropped_leaves": ("num_batches_tracked",),
        "network": {"stem_pool_pad_mode": "pad"},
    },
}
NETWORK_ATTRIBUTES = ("stem_pool_pad_mode",)
"""Config keys that change a network's output but none of its parameters, kept as attributes
of the network: loading warns when the checkpoint's differ."""


class CheckpointError(UserError, ValueError):
    """A checkpoint file cannot be read, or does not hold what it is used for."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint's parameters do not match the network's (names or shapes)."""


def infer_resnet(shapes: dict[str, tuple[int, ...]]) -> tuple[str, int]:
    """(``net_name``, class count) of ResNet weights (name -> shape; ours, torchvision's or
    MindCV's names), from their block counts and classifier.

    Raises:
        CheckpointMismatchError: If there is no ``fc``/``classifier`` weight or the blocks are
            of no ``ARCHITECTURES`` entry.
    """
    classifier = next((shapes[n] for n in ("fc.weight", "classifier.weight") if n in shapes),
                      None)
    if classifier is None:
        raise CheckpointMismatchError("no fc.weight: not a ResNet classifier's weights")
    blocks = tuple(len({n.split(".")[1] for n in shapes if n.startswith(f"layer{stage}.")})
                   for stage in range(1, 5))
    kind = "Bottleneck" if any(".conv3." in n for n in shapes) else "BasicBlock"
    net_name = architecture_of(kind, blocks)
    if net_name is None:
        built = ", ".join(f"{n} ({a.block} {list(a.layers)})" for n, a in ARCHITECTURES.items())
        raise CheckpointMismatchError(f"weights of an unknown ResNet layout ({kind} blocks "
                                      f"{list(blocks)}): this package builds {built}")
    return net_name, int(classifier[0])


def pretrained_config(source: str, net_name: str | None = None,
                      eval_settings: bool = True) -> dict[str, Any]:
    """The config values that Hub weights carry: ``net_name``, and with ``eval_settings``
    ``class_num`` and the eval preprocessing (``pretrained_eval_settings``).

    Args:
        net_name (str, optional): The configured network, checked against the weights'.
        eval_settings (bool): False for fine-tuning, which keeps its own classes.

    Raises:
        HubError, MissingFileError: If the weights cannot be had.
        PretrainedMismatchError: If they are of a network not built here or not ``net_name``,
            their config.json names another network than their tensors are, or they ask for
            another normalization.
        CheckpointMismatchError: If their tensors are of no ResNet depth built here.
    """
    weights = resolve_weights(source)
    shapes = safetensors_shapes(weights)
    layout = source_layout(shapes)
    names = layout_names(shapes, layout) if layout else {n: n for n in shapes}
    inferred, classes = infer_resnet({names[n]: s for n, s in shapes.items() if n in names})
    arch = check_architecture(weights)
    if arch is not None and arch != inferred:
        layout = ARCHITECTURES[inferred]
        raise PretrainedMismatchError(
            f"{source}: {weights.config_file} says architecture {arch} but its tensors are a "
            f"{inferred} ({layout.block} blocks {list(layout.layers)}, {classes} classes): the "
            f"config and the weights disagree; correct the architecture in "
            f"{weights.config_file} or use other weights")
    arch = check_architecture(weights, net_name) or inferred
    if net_name is not None and inferred != net_name:
        raise PretrainedMismatchError(f"{source} holds the tensors of a {inferred} but net_name "
                                      f"is {net_name}: pass --net_name {inferred}")
    values = {"net_name": arch}
    if eval_settings:
        values["class_num"] = classes
        values.update(pretrained_eval_settings(weights))
    return values


def check_finite(arrays: dict[str, Any], source: str) -> None:
    """Refuse weights holding NaN or inf: name -> numpy array or MindSpore Parameter (text
    entries skipped). See docs/reliability.md.

    Raises:
        CheckpointError: Naming ``source``, the first such tensor and its count of them.
    """
    for name, value in arrays.items():
        array = value if isinstance(value, np.ndarray) else getattr(value, "asnumpy", None)
        if callable(array):
            array = array()
        if not isinstance(array, np.ndarray) or array.dtype.kind != "f":
            continue
        bad = int(array.size - np.count_nonzero(np.isfinite(array)))
        if bad:
            raise CheckpointError(f"{source}: tensor {name} holds {bad} NaN or inf values (of "
                                  f"{array.size}); expected finite weights: a diverged run or "
                                  f"a damaged file, use other weights")


def read_checkpoint(path: str) -> dict[str, Any]:
    """Read a ``.ckpt`` file or Hub weights (``src.utils.hub``) into name -> Parameter
    (``run_config``: str); safetensors floats as float32 (``read_safetensors``), names as
    the file has them.

    Raises:
        MissingFileError: If ``path`` does not exist.
        CheckpointError: If the file cannot be read as a MindSpore checkpoint, or a tensor
            holds NaN or inf (``check_finite``; names the file and the tensor).
        HubError, PretrainedMismatchError: For Hub weights (``src.utils.hub``).
    """
    if is_pretrained_source(path):
        weights = resolve_weights(path)
        check_architecture(weights)
        arrays = read_safetensors(weights)
        check_finite(arrays, path)
        return {name: ms.Parameter(ms.Tensor(array), name=name) for name, array in arrays.items()}
    if not os.path.isfile(path):
        raise MissingFileError(f"checkpoint not found: {path}")
    try:
        params = ms.load_checkpoint(path)
    except (ValueError, RuntimeError, OSError) as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err}") from err
    check_finite(params, path)
    return params


def stored_config(params: dict[str, Any]) -> dict[str, Any] | None:
    """The run config stored in a training checkpoint (a dict), or None for older files."""
    text = params.get(CONFIG_KEY)
    return json.loads(text) if isinstance(text, str) else None


def read_stored_config(path: str) -> dict[str, Any] | None:
    """The run config stored in a ``.ckpt`` file (``stored_config``), read without its
    tensors; None for files without one.

    Raises:
        MissingFileError, CheckpointError: As ``read_checkpoint``.
    """
    return stored_config(_read_entries(path, CONFIG_KEY))


def stored_record_text(path: str) -> str | None:
    """The model record (JSON text, ``src.utils.model_record``) stored in a ``.ckpt`` file,
    read without its tensors; None for files written before it.

    Raises:
        MissingFileError, CheckpointError: As ``read_checkpoint``.
    """
    text = _read_entries(path, RECORD_KEY).get(RECORD_KEY)
    return text if isinstance(text, str) else None


def _read_entries(path, key):
    """The entry ``key`` of a ``.ckpt`` (and its first entry: MindSpore refuses a filter that
    keeps nothing)."""
    if not os.path.isfile(path):
        raise MissingFileError(f"checkpoint not found: {path}")
    seen = []

    def wanted(name):
        seen.append(name)
        return name == key or len(seen) == 1
    try:
        return ms.load_checkpoint(path, choice_func=wanted)
    except (ValueError, RuntimeError, OSError) as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err}") from err


def stored_best(params: dict[str, Any]) -> dict[str, Any] | None:
    """The best score stored in a training checkpoint, ``{"top1": float, "epoch": int}``, or
    None."""
    text = params.get(BEST_KEY)
    return json.loads(text) if isinstance(text, str) and text else None


def stored_data(params: dict[str, Any]) -> dict[str, int] | None:
    """The training data stored in a checkpoint, ``{"images": int, "steps_per_epoch": int}``
    (after ``val_split``; optimizer steps per epoch per device), or None."""
    text = params.get(DATA_KEY)
    return json.loads(text) if isinstance(text, str) and text else None


def stored_epoch_loss(params: dict[str, Any]) -> dict[str, float] | None:
    """The sum and count of the epoch's losses up to a training checkpoint's step, ``{"sum":
    float, "count": int}``, or None (older files)."""
    text = params.get(EPOCH_LOSS_KEY)
    return json.loads(text) if isinstance(text, str) and text else None


def stored_step(params: dict[str, Any]) -> int:
    """Training steps done, from ``train_step`` (or the optimizer's ``global_step``)."""
    value = params[STEP_KEY] if STEP_KEY in params else params["global_step"]
    return int(value.asnumpy().reshape(-1)[0])


def load_leaving_some(net: nn.Cell, params: dict[str, Any]) -> list[str]:
    """``ms.load_param_into_net(net, params, strict_load=False)`` without MindSpore's warning
    listing every parameter of ``net`` not in ``params`` (270 names for a distillation
    teacher); returns those names, for the caller to say what they are."""
    from mindspore import log as ms_log

    def keep(record: logging.LogRecord) -> bool:
        return "are not loaded" not in record.getMessage()

    ms_logger = ms_log._get_logger()
    ms_logger.addFilter(keep)
    try:
        not_loaded, _ = ms.load_param_into_net(net, params, strict_load=False)
    finally:
        ms_logger.removeFilter(keep)
    return list(not_loaded)


def compare(net: nn.Cell, params: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """Compare checkpoint parameters with a network's: (names missing from the checkpoint,
    names the network lacks but training state, ``"name: checkpoint shape vs network shape"``
    per shape mismatch)."""
    net_params = {p.name: p for p in net.get_parameters()}
    missing = [n for n in net_params if n not in params]
    unexpected = [n for n in params if n not in net_params and not n.startswith(
        TRAINING_STATE_PREFIXES)]
    mismatched = [f"{n}: checkpoint {tuple(params[n].shape)} vs network {tuple(p.shape)}"
                  for n, p in net_params.items()
                  if n in params and tuple(params[n].shape) != tuple(p.shape)]
    return missing, unexpected, mismatched


def ema_weights(params: dict[str, Any]) -> dict[str, ms.Parameter]:
    """The weight EMA (``ema.<name>`` entries) of ``read_checkpoint``'s ``params``, as
    network name -> Parameter; empty if it has none."""
    return {name[len(EMA_PREFIX):]: ms.Parameter(value.value(), name=name[len(EMA_PREFIX):])
            for name, value in params.items() if name.startswith(EMA_PREFIX)}


def source_layout(params: Iterable[str]) -> str | None:
    """The ``SOURCE_LAYOUTS`` entry whose names ``params`` (name -> value) use, or None (ours,
    or unknown)."""
    components = {part for name in params for part in name.split(".")}
    for layout, spec in SOURCE_LAYOUTS.items():
        if components & set(spec["renames"]) and not components & set(spec["renames"].values()):
            return layout
    return None


def layout_names(names: Iterable[str], layout: str) -> dict[str, str]:
    """Source name -> our name for the ``names`` of ``SOURCE_LAYOUTS[layout]`` (its
    ``dropped_leaves`` left out)."""
    spec = SOURCE_LAYOUTS[layout]
    names = list(names)
    batchnorms = {n.rsplit(".", 1)[0] for n in names
                  if n.endswith(".running_mean")} if spec.get("batchnorm") else set()
    mapping = {}
    for name in names:
        prefix, _, leaf = name.rpartition(".")
        if leaf in spec.get("dropped_leaves", ()):
            continue
        parts = [spec["renames"].get(part, part) for part in name.split(".")]
        if prefix in batchnorms:
            parts[-1] = spec["batchnorm"].get(leaf, parts[-1])
        mapping[name] = ".".join(parts)
    return mapping


def source_names(names: Iterable[str], layout: str) -> dict[str, str]:
    """Our name -> the name in ``SOURCE_LAYOUTS[layout]`` (``layout_names`` inverted)."""
    spec = SOURCE_LAYOUTS[layout]
    back = {v: k for k, v in {**spec["renames"], **spec.get("batchnorm", {})}.items()}
    return {name: ".".join(back.get(part, part) for part in name.split(".")) for name in names}


def to_network_names(params: dict[str, Any],
                     path: str = "") -> tuple[dict[str, Any], str | None]:
    """(``params`` under our names, the ``SOURCE_LAYOUTS`` entry renamed from or None): another
    code base's training state dropped, one line logged naming ``path``; ours unchanged."""
    layout = source_layout(params)
    if layout is None:
        return params, None
    spec = SOURCE_LAYOUTS[layout]
    state = tuple(spec["training_state"]) + TRAINING_STATE_PREFIXES
    kept = [n for n in params if not n.startswith(state) or n.startswith(EMA_PREFIX)]
    mapping = layout_names(kept, layout)
    dropped = set(params) - set(mapping)
    renamed, count = {}, 0
    for name, new in mapping.items():
        value = params[name]
        count += new != name
        if isinstance(value, ms.Parameter):
            value.name = new
        renamed[new] = value
    rules = ", ".join(f"{old} -> {new}" for old, new in {**spec["renames"],
                                                           **spec.get("batchnorm", {})}.items())
    leaves = {n for n in dropped if n.rpartition(".")[2] in spec.get("dropped_leaves", ())}
    state_entries = dropped - leaves
    LOGGER.info("%s checkpoint %s: renamed %s (%d tensors)%s%s", layout, path, rules, count,
                f"; dropped {len(state_entries)} optimizer/training-state entries "
                f"({_prefixes(state_entries)})" if state_entries else "",
                f"; dropped {len(leaves)} "
                f"{'/'.join(sorted({n.rpartition('.')[2] for n in leaves}))} entries "
                f"(no counterpart here)" if leaves else "")
    return renamed, layout


def _prefixes(names, limit=6):
    """``global_step, moments.*, ...``: the first components of ``names``, for messages."""
    heads = sorted({n.split(".")[0] + (".*" if "." in n else "") for n in names})
    return ", ".join(heads[:limit]) + (", ..." if len(heads) > limit else "")


def expected_network_attributes(params: dict[str, Any],
                                layout: str | None = None) -> dict[str, Any]:
    """The ``NETWORK_ATTRIBUTES`` (key -> value) a checkpoint's network was built with: from
    its stored run config, else its ``SOURCE_LAYOUTS[layout]["network"]``; empty if unknown."""
    source = stored_config(params) or (SOURCE_LAYOUTS[layout]["network"] if layout else {})
    return {key: source[key] for key in NETWORK_ATTRIBUTES if key in source}


def load_into_network(net: nn.Cell, path: str, drop_mismatched_classifier: bool = False,
                      use_ema: bool = False) -> tuple[list[str], bool]:
    """Load weights into ``net`` strictly, renamed from other code bases' names first
    (``to_network_names``); a backbone (``features_only``) drops the source's classifier.
    ``drop_path_step`` is neither loaded nor required. Other ``NETWORK_ATTRIBUTES`` than
    ``net``'s load with a warning naming the key to pass.

    Args:
        path (str): A ``.ckpt`` file (ours or MindCV's) or Hub weights (``read_checkpoint``).
        drop_mismatched_classifier (bool): For fine-tuning: when only ``fc.*`` shapes differ,
            keep the network's fresh classifier.
        use_ema (bool): Load the checkpoint's weight EMA (``ema_weights``) when it has one.

    Returns:
        tuple(list[str], bool): The source's tensors not loaded (a dropped classifier), and
        whether the EMA weights were loaded.

    Raises:
        MissingFileError: If the file does not exist.
        CheckpointMismatchError: If names or shapes do not match; lists the mismatches.
    """
    params, layout = to_network_names(read_checkpoint(path), path)
    _warn_other_network_attributes(net, expected_network_attributes(params, layout), path,
                                   f"{layout}'s networks" if layout else "its run config")
    averages = ema_weights(params) if use_ema else {}
    params = averages or params
    params.pop(DROP_PATH_STEP, None)  # training state: a network loaded with weights starts at 0
    missing, unexpected, mismatched = compare(net, params)
    missing = [n for n in missing if n != DROP_PATH_STEP]
    dropped = []
    if getattr(net, "features_only", False):  # a backbone: the classifier has nowhere to go
        dropped = [n for n in unexpected if n.startswith(CLASSIFIER_PREFIX)]
        unexpected = [n for n in unexpected if not n.startswith(CLASSIFIER_PREFIX)]
    if drop_mismatched_classifier and mismatched and all(
            m.startswith(CLASSIFIER_PREFIX) for m in mismatched):
        dropped = [n for n in params if n.startswith(CLASSIFIER_PREFIX)]
        mismatched = []
    if missing or unexpected or mismatched:
        raise CheckpointMismatchError(_mismatch_message(path, missing, unexpected, mismatched))
    for name in dropped + [k for k in METADATA_KEYS if k in params]:
        del params[name]
    ms.load_param_into_net(net, params, strict_load=True)
    return dropped, bool(averages)


def _warn_other_network_attributes(net, expected, path, source):
    for key, value in expected.items():
        built = getattr(net, key, value)
        if built != value:
            LOGGER.warning("%s was trained with %s %s (%s) but the network is built with %s %s: "
                           "its outputs differ from the trained network's; pass --%s %s to "
                           "match it", path, key, value, source, key, built, key, value)


def _mismatch_message(path, missing, unexpected, mismatched, limit=10):
    lines = [f"checkpoint {path} does not fit the network "
             f"(check net_name and class_num against the training run):"]
    for title, names in (("shape mismatch", mismatched), ("missing in checkpoint", missing),
                         ("not in network", unexpected)):
        if names:
            shown = "; ".join(names[:limit]) + (f"; ... ({len(names)} in all)"
                                                if len(names) > limit else "")
            lines.append(f"  {title}: {shown}")
    return "\n".join(lines)


def is_saved(name: str) -> bool:
    """Whether parameter ``name`` is saved: all but the gradient accumulation buffers (zero
    between optimizer steps) and a distillation teacher and loss parts."""
    return not name.startswith((GRAD_ACCUM_PREFIX, KD_TEACHER_PREFIX, KD_LOSS_PREFIX))


def atomic_save_checkpoint(net: nn.Cell | list[dict[str, Any]], path: str,
                           append_dict: dict[str, Any] | None = None) -> None:
    """Save ``net`` (its ``is_saved`` parameters, or ``save_checkpoint``'s list of dicts) and
    ``append_dict`` to ``path`` atomically: a temporary file, ``fsync``, rename, the folder
    entry flushed; a crash never leaves a truncated file under ``path``.

    Raises:
        OSError: If the file cannot be written; nothing is left under ``path``.
    """
    partials = partial_files(path)
    try:
        ms.save_checkpoint(net, partials[0], append_dict=append_dict, choice_func=is_saved)
        _fsync(partials[0])
        os.replace(partials[0], path)
    except BaseException:
        for partial in partials:
            if os.path.exists(partial):
                os.remove(partial)
        raise
    _fsync(os.path.dirname(os.path.abspath(path)))


def partial_files(path: str) -> list[str]:
    """The temporary files of saving ``path``: ``NAME.partial.ckpt`` (ours, renamed to
    ``path``) and ``NAME.partial.tmp`` (``mindspore.save_checkpoint``'s)."""
    stem = os.path.splitext(path)[0] + ".partial"
    return [stem + ".ckpt", stem + ".tmp"]


def remove_stale_partials(output_dir: str, prefix: str) -> list[str]:
    """Delete (and return) the ``partial_files`` of ``prefix``'s checkpoints that a killed
    save left in ``output_dir``; other files are never touched."""
    pattern = os.path.join(glob.escape(output_dir), glob.escape(prefix) + "-*.partial.")
    stale = sorted(glob.glob(pattern + "ckpt") + glob.glob(pattern + "tmp"))
    for path in stale:
        os.remove(path)
    return stale


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_name(prefix: str, global_step: int, steps_per_epoch: int) -> str:
    """ModelZoo-style ``prefix-EPOCH_STEP.ckpt`` (1-based epoch, step within the epoch)."""
    epoch, step = divmod(global_step - 1, steps_per_epoch)
    return f"{prefix}-{epoch + 1}_{step + 1}.ckpt"


def position_of(path: str, steps_per_epoch: int) -> int | None:
    """Global step encoded in a checkpoint name, or None."""
    match = NAME.search(os.path.basename(path))
    if not match:
        return None
    return (int(match.group(1)) - 1) * steps_per_epoch + int(match.group(2))


def periodic_checkpoints(output_dir: str, prefix: str, steps_per_epoch: int) -> list[str]:
    """Training checkpoints ``prefix-E_S.ckpt`` in ``output_dir``, newest position first."""
    own_name = re.compile(re.escape(prefix) + r"-\d+_\d+\.ckpt")  # not "resnet18-run2-1_4"
    found = [(position_of(p, steps_per_epoch), p)
             for p in glob.glob(os.path.join(glob.escape(output_dir), f"{prefix}-*_*.ckpt"))
             if own_name.fullmatch(os.path.basename(p))]
    return [p for pos, p in sorted(found, reverse=True) if pos is not None]


def own_checkpoints(output_dir: str, prefix: str, steps_per_epoch: int,
                    up_to_step: int) -> list[str]:
    """Checkpoints of the run a resumed run continues: the periodic ones in ``output_dir`` at
    or before ``up_to_step``, oldest first."""
    return [p for p in reversed(periodic_checkpoints(output_dir, prefix, steps_per_epoch))
            if position_of(p, steps_per_epoch) <= up_to_step]


def is_resumable(path: str, net_param_names: Iterable[str]) -> tuple[bool, str]:
    """(whether ``path`` is a training checkpoint holding every one of ``net_param_names``,
    why not): a file cut at a record boundary parses but lacks the later ones."""
    try:
        params = read_checkpoint(path)
    except CheckpointError as err:
        return False, str(err).splitlines()[0]
    if "global_step" not in params:
        return False, "no optimizer state (not a training checkpoint)"
    absent = [n for n in net_param_names if n not in params]
    if absent:
        return False, f"{len(absent)} expected parameters absent (e.g. {absent[0]}): truncated"
    return True, ""


def prune(paths: list[str], keep: int) -> list[str]:
    """Delete all but the last ``keep`` of ``paths`` (oldest first); return the ones kept. A
    file that cannot be deleted is left with a warning, and no longer counted."""
    for old in paths[:-keep] if keep else paths:
        try:
            if os.path.exists(old):
                os.remove(old)
        except OSError as err:
            LOGGER.warning("keep_checkpoint_max %d: cannot delete the old checkpoint %s (%s); "
                           "it is left in place, delete it by hand", keep, old,
                           err.strerror or err)
    return paths[-keep:] if keep else []
