"""Checkpoint files: reading and checking them, atomic saving, naming, listing and pruning.

Every ``.ckpt`` this package reads or writes goes through this module. Training checkpoints
are named ModelZoo-style ``<net_name>-<epoch>_<step>.ckpt`` (1-based epoch, step within the
epoch) and hold, besides the network: the optimizer's state, ``train_step`` (training steps
done), ``run_config`` (the run's resolved config as JSON, checked on resume), ``best_score``
(the run's best evaluation so far; also in ``NET-best.ckpt``) and ``train_data`` (the training
image count and steps per epoch, checked on resume). Checkpoints of
other code bases whose ResNets hold the same tensors under other names (MindCV's) are renamed
on loading (``SOURCE_LAYOUTS``).
"""
import glob
import json
import logging
import os
import re

import mindspore as ms
import numpy as np

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

CLASSIFIER_PREFIX = "fc."
STEP_KEY = "train_step"
CONFIG_KEY = "run_config"
BEST_KEY = "best_score"  # the run's best evaluation so far, JSON {"top1": float, "epoch": int}
DATA_KEY = "train_data"  # the data trained on, JSON {"images": int, "steps_per_epoch": int}
METADATA_KEYS = (STEP_KEY, CONFIG_KEY, BEST_KEY, DATA_KEY)
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
                           EMA_COUNTER, OVERFLOW_COUNTER, DROP_PATH_STEP) + METADATA_KEYS
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
"""Config keys that change a network's output but none of its parameters, kept on the network
as attributes of the same name (``src.models.resnet.ResNet``). Loading compares them with the
checkpoint's stored run config (or its source layout's ``network``) and warns on a difference:
the weights load, but the outputs are not those the checkpoint was trained with."""


class CheckpointError(UserError, ValueError):
    """A checkpoint file cannot be read, or does not hold what it is used for."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint's parameters do not match the network's (names or shapes)."""


RESNET_DEPTHS = {("BasicBlock", (2, 2, 2, 2)): "resnet18",
                 ("BasicBlock", (3, 4, 6, 3)): "resnet34",
                 ("Bottleneck", (3, 4, 6, 3)): "resnet50",
                 ("Bottleneck", (3, 4, 23, 3)): "resnet101",
                 ("Bottleneck", (3, 8, 36, 3)): "resnet152"}
"""(block type, blocks per stage) -> ``net_name`` (He et al. 2016, Table 1)."""


def infer_resnet(shapes):
    """The network a set of ResNet weights fits, from its block counts and classifier.

    Args:
        shapes (dict): Tensor name (ours, torchvision's or MindCV's) -> shape.

    Returns:
        tuple(str, int): (``net_name``, class count).

    Raises:
        CheckpointMismatchError: If there is no ``fc``/``classifier`` weight or the blocks
            are not those of resnet18/34/50/101/152 (names the block counts).
    """
    classifier = next((shapes[n] for n in ("fc.weight", "classifier.weight") if n in shapes),
                      None)
    if classifier is None:
        raise CheckpointMismatchError("no fc.weight: not a ResNet classifier's weights")
    blocks = tuple(len({n.split(".")[1] for n in shapes if n.startswith(f"layer{stage}.")})
                   for stage in range(1, 5))
    kind = "Bottleneck" if any(".conv3." in n for n in shapes) else "BasicBlock"
    if (kind, blocks) not in RESNET_DEPTHS:
        raise CheckpointMismatchError(
            f"weights of an unknown ResNet layout ({kind} blocks {list(blocks)}): this package "
            f"builds {', '.join(f'{v} ({k[0]} {list(k[1])})' for k, v in RESNET_DEPTHS.items())}")
    return RESNET_DEPTHS[(kind, blocks)], int(classifier[0])


def pretrained_config(source, net_name=None, eval_settings=True):
    """The config values that weights in the Hub form carry (``src.utils.hub``).

    Args:
        source (str): ``hf-hub:`` id, folder or ``.safetensors`` file.
        net_name (str, optional): The network the user asked for: checked against the
            weights'. None: not checked.
        eval_settings (bool): Also ``class_num`` and the eval preprocessing (eval, predict,
            export); False: ``net_name`` only (fine-tuning keeps its own classes).

    Returns:
        dict: ``net_name`` (``config.json``'s architecture, else the tensors' block counts),
        and with ``eval_settings`` ``class_num`` (the classifier's rows) and
        ``eval_image_size`` / ``eval_resize`` / ``eval_interpolation``
        (``pretrained_eval_settings``).

    Raises:
        HubError, MissingFileError: If the weights cannot be had.
        PretrainedMismatchError: If they are of a network this package does not build, of
            another one than ``net_name``, or ask for another normalization.
        CheckpointMismatchError: If their tensors are of no ResNet depth built here.
    """
    weights = resolve_weights(source)
    shapes = safetensors_shapes(weights)
    layout = source_layout(shapes)
    names = layout_names(shapes, layout) if layout else {n: n for n in shapes}
    inferred, classes = infer_resnet({names[n]: s for n, s in shapes.items() if n in names})
    arch = check_architecture(weights, net_name) or inferred
    if net_name is not None and inferred != net_name:
        raise PretrainedMismatchError(f"{source} holds the tensors of a {inferred} but net_name "
                                      f"is {net_name}: pass --net_name {inferred}")
    values = {"net_name": arch}
    if eval_settings:
        values["class_num"] = classes
        values.update(pretrained_eval_settings(weights))
    return values


def read_checkpoint(path):
    """Read a ``.ckpt`` file, or weights in the Hub form (``hf-hub:`` id, folder,
    ``.safetensors``: ``src.utils.hub``), into a dict of name -> Parameter (``run_config``:
    str). Safetensors floats are widened to float32 (exactly); their names are left as the
    file has them (``to_network_names`` maps them).

    Raises:
        MissingFileError: If ``path`` does not exist.
        CheckpointError: If the file cannot be read as a MindSpore checkpoint (names the file).
        HubError, PretrainedMismatchError: For Hub weights (``src.utils.hub``).
    """
    if is_pretrained_source(path):
        weights = resolve_weights(path)
        check_architecture(weights)
        return {name: ms.Parameter(ms.Tensor(array.astype(np.float32) if array.dtype.kind == "f"
                                             else array), name=name)
                for name, array in read_safetensors(weights).items()}
    if not os.path.isfile(path):
        raise MissingFileError(f"checkpoint not found: {path}")
    try:
        return ms.load_checkpoint(path)
    except (ValueError, RuntimeError, OSError) as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err}") from err


def stored_config(params):
    """The run config stored in a training checkpoint (a dict), or None for older files."""
    text = params.get(CONFIG_KEY)
    return json.loads(text) if isinstance(text, str) else None


def stored_best(params):
    """The best evaluation score stored in a training checkpoint, ``{"top1": float, "epoch":
    int}``, or None (no evaluation yet, or a file written before it was stored)."""
    text = params.get(BEST_KEY)
    return json.loads(text) if isinstance(text, str) and text else None


def stored_data(params):
    """The training data a checkpoint was trained on, ``{"images": int, "steps_per_epoch":
    int}`` (the training images of ``data_path``, after ``val_split``; optimizer steps per
    epoch per device), or None for files written before it was stored."""
    text = params.get(DATA_KEY)
    return json.loads(text) if isinstance(text, str) and text else None


def stored_step(params):
    """Training steps done, from ``train_step`` (or the optimizer's ``global_step``)."""
    value = params[STEP_KEY] if STEP_KEY in params else params["global_step"]
    return int(value.asnumpy().reshape(-1)[0])


def compare(net, params):
    """Compare checkpoint parameters with a network's.

    Returns:
        tuple(list, list, list): names missing from the checkpoint, names the network does not
        have (optimizer state and the step counter are ignored), and
        ``"name: checkpoint shape vs network shape"`` for every shape mismatch.
    """
    net_params = {p.name: p for p in net.get_parameters()}
    missing = [n for n in net_params if n not in params]
    unexpected = [n for n in params if n not in net_params and not n.startswith(
        TRAINING_STATE_PREFIXES)]
    mismatched = [f"{n}: checkpoint {tuple(params[n].shape)} vs network {tuple(p.shape)}"
                  for n, p in net_params.items()
                  if n in params and tuple(params[n].shape) != tuple(p.shape)]
    return missing, unexpected, mismatched


def ema_weights(params):
    """The weight EMA a training checkpoint holds (``ema.<name>`` entries, written when
    ``ema_decay`` > 0), under the network's names; empty if it has none.

    Args:
        params (dict): As ``read_checkpoint`` returns.

    Returns:
        dict: name -> Parameter.
    """
    return {name[len(EMA_PREFIX):]: ms.Parameter(value.value(), name=name[len(EMA_PREFIX):])
            for name, value in params.items() if name.startswith(EMA_PREFIX)}


def source_layout(params):
    """The name of the ``SOURCE_LAYOUTS`` entry ``params`` is in, or None (ours, or unknown).

    Args:
        params (dict): Checkpoint names -> values, as ``read_checkpoint`` returns.

    Returns:
        str or None: e.g. ``"MindCV"`` for names with ``classifier`` or ``down_sample``
        components and no ``fc`` or ``downsample`` ones.
    """
    components = {part for name in params for part in name.split(".")}
    for layout, spec in SOURCE_LAYOUTS.items():
        if components & set(spec["renames"]) and not components & set(spec["renames"].values()):
            return layout
    return None


def layout_names(names, layout):
    """Map the names of a ``SOURCE_LAYOUTS`` layout to ours, one name at a time.

    Args:
        names (iterable[str]): The source's tensor names.
        layout (str): A ``SOURCE_LAYOUTS`` key.

    Returns:
        dict: source name -> our name, for every name but the layout's ``dropped_leaves``.
    """
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


def source_names(names, layout):
    """Map our parameter names to a ``SOURCE_LAYOUTS`` layout's (``layout_names`` inverted).

    Args:
        names (iterable[str]): Our names (network parameters).
        layout (str): A ``SOURCE_LAYOUTS`` key.

    Returns:
        dict: our name -> source name.
    """
    spec = SOURCE_LAYOUTS[layout]
    back = {v: k for k, v in {**spec["renames"], **spec.get("batchnorm", {})}.items()}
    return {name: ".".join(back.get(part, part) for part in name.split(".")) for name in names}


def to_network_names(params, path=""):
    """Rename the parameters of a checkpoint of another code base (``SOURCE_LAYOUTS``) to ours
    and drop its optimizer and training-state entries; logs one line naming the mapping.
    Checkpoints in our layout are returned unchanged.

    Source: MindCV 0.3.0 ``mindcv/models/resnet.py`` (names), ``mindcv/utils/train_step.py``
    and ``mindcv/optim`` (training state saved with the network); torchvision's
    ``models/resnet.py`` state_dict names (timm's plain ResNets use the same).

    Args:
        params (dict): Checkpoint names -> values, as ``read_checkpoint`` returns.
        path (str): The file, for the log line.

    Returns:
        tuple(dict, str or None): the parameters under our names (``ema.`` weights too), and
        the layout applied (None: ours).
    """
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


def expected_network_attributes(params, layout=None):
    """The ``NETWORK_ATTRIBUTES`` a checkpoint's networks were built with: from its stored run
    config, else from its source layout (``SOURCE_LAYOUTS[layout]["network"]``); empty when
    unknown (files written before the key existed, plain ``save_checkpoint`` files).

    Args:
        params (dict): As ``read_checkpoint`` returns.
        layout (str, optional): The ``SOURCE_LAYOUTS`` entry the checkpoint is in.

    Returns:
        dict: key -> value.
    """
    source = stored_config(params) or (SOURCE_LAYOUTS[layout]["network"] if layout else {})
    return {key: source[key] for key in NETWORK_ATTRIBUTES if key in source}


def load_into_network(net, path, drop_mismatched_classifier=False, use_ema=False):
    """Load a checkpoint into ``net``, strictly (the stochastic depth counter
    ``drop_path_step``, training state, is neither loaded nor required: it stays at 0).

    A checkpoint of another code base's ResNet (``SOURCE_LAYOUTS``: MindCV's) is renamed to
    our names first (``to_network_names``, logged). When the checkpoint was trained with other
    ``NETWORK_ATTRIBUTES`` than ``net`` has (e.g. MindCV's ``stem_pool_pad_mode`` same into a
    ``pad`` network), it loads with a warning naming the key to pass.

    Args:
        net (nn.Cell): The network to fill.
        path (str): ``.ckpt`` file: ours (training or plain) or MindCV's.
        drop_mismatched_classifier (bool): For fine-tuning: when only ``fc.*`` shapes differ
            (another class count), keep the network's freshly initialized classifier and load
            everything else.
        use_ema (bool): Load the checkpoint's weight EMA instead of its live weights when it
            holds one (``ema_weights``).

    Returns:
        tuple(list[str], bool): names of the parameters that were not loaded (dropped
        classifier), and whether the EMA weights were loaded.

    Raises:
        MissingFileError: If the file does not exist.
        CheckpointMismatchError: If names or shapes do not match the network; the message
            lists the mismatched parameters (e.g. another depth or class count).
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


def is_saved(name):
    """Whether a parameter named ``name`` goes into checkpoint files: all but ``TrainStep``'s
    gradient accumulation buffers, which are zero whenever a checkpoint is saved (between
    optimizer steps)."""
    return not name.startswith(GRAD_ACCUM_PREFIX)


def atomic_save_checkpoint(net, path, append_dict=None):
    """Save ``net`` to ``path`` so that a crash or power loss never leaves a truncated file
    under the final name: written to a temporary name, flushed to disk (``fsync``), renamed,
    and the folder entry flushed too.

    Args:
        net (nn.Cell or list): Network (or training cell) whose parameters are saved (but
            the gradient accumulation buffers: ``is_saved``), or a list of ``{"name": str,
            "data": Tensor}`` as ``mindspore.save_checkpoint`` takes.
        path (str): Final ``.ckpt`` path.
        append_dict (dict, optional): Extra int/float/str entries stored in the file.

    Raises:
        OSError: If the file cannot be written (disk full, permission); the temporary file
            is removed and nothing is left under ``path``.
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


def partial_files(path):
    """The temporary files of saving ``path``: ours (``NAME.partial.ckpt``, renamed to
    ``path`` when complete; ``save_checkpoint`` appends ".ckpt" to names without it, so the
    suffix stays) and the one ``mindspore.save_checkpoint`` writes it through
    (``NAME.partial.tmp``)."""
    stem = os.path.splitext(path)[0] + ".partial"
    return [stem + ".ckpt", stem + ".tmp"]


def remove_stale_partials(output_dir, prefix):
    """Delete the temporary files of ``prefix``'s checkpoints left in ``output_dir`` by a
    save that was killed (``partial_files``: 30-60 MB each). Only this run's names
    (``PREFIX-*``); other files are never touched.

    Returns:
        list[str]: The files removed.
    """
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


def checkpoint_name(prefix, global_step, steps_per_epoch):
    """ModelZoo-style ``prefix-EPOCH_STEP.ckpt`` (1-based epoch, step within the epoch)."""
    epoch, step = divmod(global_step - 1, steps_per_epoch)
    return f"{prefix}-{epoch + 1}_{step + 1}.ckpt"


def position_of(path, steps_per_epoch):
    """Global step encoded in a checkpoint name, or None."""
    match = NAME.search(os.path.basename(path))
    if not match:
        return None
    return (int(match.group(1)) - 1) * steps_per_epoch + int(match.group(2))


def periodic_checkpoints(output_dir, prefix, steps_per_epoch):
    """Training checkpoints ``prefix-E_S.ckpt`` in ``output_dir``, newest position first."""
    own_name = re.compile(re.escape(prefix) + r"-\d+_\d+\.ckpt")  # not "resnet18-run2-1_4"
    found = [(position_of(p, steps_per_epoch), p)
             for p in glob.glob(os.path.join(glob.escape(output_dir), f"{prefix}-*_*.ckpt"))
             if own_name.fullmatch(os.path.basename(p))]
    return [p for pos, p in sorted(found, reverse=True) if pos is not None]


def own_checkpoints(output_dir, prefix, steps_per_epoch, up_to_step):
    """Checkpoints of the run a resumed run continues: the periodic ones in ``output_dir`` at
    or before ``up_to_step``, oldest first."""
    return [p for p in reversed(periodic_checkpoints(output_dir, prefix, steps_per_epoch))
            if position_of(p, steps_per_epoch) <= up_to_step]


def is_resumable(path, net_param_names):
    """Whether ``path`` reads as a training checkpoint holding every parameter of the
    network and optimizer (a file cut at a record boundary parses but lacks the later ones).

    Returns:
        tuple(bool, str): whether it is usable, and why not (empty when usable).
    """
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


def prune(paths, keep):
    """Delete all but the last ``keep`` of ``paths`` (oldest first); return the ones kept.

    A file that cannot be deleted (read-only folder entry, immutable file, permission) is left
    with a warning naming it, and no longer counted: the run goes on."""
    for old in paths[:-keep] if keep else paths:
        try:
            if os.path.exists(old):
                os.remove(old)
        except OSError as err:
            LOGGER.warning("keep_checkpoint_max %d: cannot delete the old checkpoint %s (%s); "
                           "it is left in place, delete it by hand", keep, old,
                           err.strerror or err)
    return paths[-keep:] if keep else []
