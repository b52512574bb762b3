"""Loading checkpoints into a network with errors that name what does not fit."""
import os

import mindspore as ms

CLASSIFIER_PREFIX = "fc."


class CheckpointMismatchError(ValueError):
    """A checkpoint's parameters do not match the network's (names or shapes)."""


def read_checkpoint(path):
    """Read a ``.ckpt`` file into a dict of name -> Parameter.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If the file cannot be read as a MindSpore checkpoint (names the file).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        return ms.load_checkpoint(path)
    except (ValueError, RuntimeError, OSError) as err:
        raise ValueError(f"cannot read checkpoint {path}: {err}") from err


def compare(net, params):
    """Compare checkpoint parameters with a network's.

    Returns:
        tuple(list, list, list): names missing from the checkpoint, names the network does not
        have (optimizer state and the step counter are ignored), and
        ``"name: checkpoint shape vs network shape"`` for every shape mismatch.
    """
    net_params = {p.name: p for p in net.get_parameters()}
    missing = [n for n in net_params if n not in params]
    unexpected = [n for n in params if n not in net_params and not _is_training_state(n)]
    mismatched = [f"{n}: checkpoint {tuple(params[n].shape)} vs network {tuple(p.shape)}"
                  for n, p in net_params.items()
                  if n in params and tuple(params[n].shape) != tuple(p.shape)]
    return missing, unexpected, mismatched


def _is_training_state(name):
    # Model.train checkpoints also hold the optimizer's state and counters.
    return name.startswith(("moments.", "accum.", "learning_rate", "global_step", "momentum",
                            "scale_sense", "current_iterator_step", "epoch_num", "step_num",
                            "last_overflow_iterator_step", "train_step"))


def load_into_network(net, path, drop_mismatched_classifier=False):
    """Load a checkpoint into ``net``, strictly.

    Args:
        net (nn.Cell): The network to fill.
        path (str): ``.ckpt`` file.
        drop_mismatched_classifier (bool): For fine-tuning: when only ``fc.*`` shapes differ
            (another class count), keep the network's freshly initialized classifier and load
            everything else.

    Returns:
        list[str]: names of the parameters that were not loaded (dropped classifier).

    Raises:
        FileNotFoundError: If the file does not exist.
        CheckpointMismatchError: If names or shapes do not match the network; the message
            lists the mismatched parameters (e.g. another depth or class count).
    """
    params = read_checkpoint(path)
    missing, unexpected, mismatched = compare(net, params)
    dropped = []
    if drop_mismatched_classifier and mismatched and all(
            m.startswith(CLASSIFIER_PREFIX) for m in mismatched):
        dropped = [n for n in params if n.startswith(CLASSIFIER_PREFIX)]
        mismatched = []
    if missing or unexpected or mismatched:
        raise CheckpointMismatchError(_mismatch_message(path, missing, unexpected, mismatched))
    for name in dropped:
        del params[name]
    ms.load_param_into_net(net, params, strict_load=True)
    return dropped


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
