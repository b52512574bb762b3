"""Resuming a run exactly: which checkpoint (``--resume_ckpt PATH|auto``), whether it belongs to
the same recipe, agreement of all ranks, and restoring the network, optimizer and position.

The LR array comes from the config and is indexed by the optimizer's ``global_step``; the
data order is restored by building each epoch's pipeline from (seed, epoch) alone
(``epoch_seed``) and skipping the batches already trained in a partly done epoch.
"""
import logging
import os

import mindspore as ms
import numpy as np

from src.training.lr_schedule import LR_KEYS
from src.utils.checkpoint import (
    GRAD_ACCUM_PREFIX,
    METADATA_KEYS,
    OVERFLOW_COUNTER,
    TRAINING_STATE_PREFIXES,
    CheckpointError,
    checkpoint_name,
    compare,
    is_resumable,
    periodic_checkpoints,
    position_of,
    read_checkpoint,
    stored_best,
    stored_config,
    stored_step,
)
from src.utils.config import ConfigError
from src.utils.errors import UserError

LOGGER = logging.getLogger(__name__)
NOT_RESTORED = ("learning_rate",) + METADATA_KEYS  # the LR array comes from the config
# Restored when present; checkpoints written before the loss scale (the overflow counter) was
# part of the training cell lack it: the configured scale is used (the count starts at 0).
# The gradient accumulation buffers are never saved (zero between optimizer steps).
NOT_REQUIRED = NOT_RESTORED + ("scale_sense", OVERFLOW_COUNTER, GRAD_ACCUM_PREFIX)
RESUME_KEYS = ("net_name", "class_num", "batch_size", "grad_accumulation_steps",
               "device_num", "optimizer", "trainable_layers", "freeze_bn", "layer_decay",
               "head_lr_scale", "linear_probe_epochs", "stem_pool_pad_mode", "val_split",
               "class_balance") + LR_KEYS
"""Keys a resumed run must share with its checkpoint: they fix the steps per epoch, the
network (its shapes, its stem pool), the per-step LR array, and the images trained on and
how (``val_split``: which are held out; ``class_balance``: the sampler or the loss)."""


def epoch_seed(seed, epoch):
    """Seed of the data pipeline of ``epoch`` (0-based): a function of (seed, epoch) only,
    in the dataset seed's range 0..2**32 - 1 (taken modulo 2**32: the seeds below it, every
    seed up to 42948 for 90 epochs, are those of earlier versions)."""
    return (seed * 100003 + epoch) % 2 ** 32


def find_resume_checkpoint(output_dir, prefix, steps_per_epoch, param_names):
    """The newest usable training checkpoint in ``output_dir`` (``--resume_ckpt auto``).

    Unusable ones (unreadable, cut short, without optimizer state) are passed over with a
    warning naming them, and the previous one is tried.

    Args:
        output_dir (str): Folder of the run.
        prefix (str): Checkpoint name prefix (the network name).
        steps_per_epoch (int): Steps in one epoch (decodes the names).
        param_names (list[str]): Every parameter name the training cell (network and
            optimizer) expects.

    Returns:
        str or None: the path, or None when there is none.
    """
    for path in periodic_checkpoints(output_dir, prefix, steps_per_epoch):
        usable, why = is_resumable(path, param_names)
        if usable:
            return path
        LOGGER.warning("skipping checkpoint %s (%s); trying the previous one", path, why)
    return None


def check_same_recipe(path, stored, current, keys=RESUME_KEYS):
    """Refuse to resume a checkpoint written under other values of ``keys``.

    Args:
        path (str): The checkpoint, for the message.
        stored (dict or None): Its ``run_config`` (None for files without one: accepted).
        current (dict): This run's config (``device_num`` the real device count).
        keys (tuple[str]): Keys that must agree.

    Raises:
        ConfigError: Naming every differing key with both values, and the way out.
    """
    if stored is None:
        LOGGER.warning("%s stores no run config: cannot check that it was trained with the "
                       "same batch size and LR recipe", path)
        return
    differ = [f"{k} {current[k]!r} (checkpoint: {stored[k]!r})" for k in keys
              if k in stored and stored[k] != current[k]]
    if differ:
        raise ConfigError(f"cannot resume {path} with other {', '.join(differ)}: the steps per "
                          f"epoch, the network or the LR schedule would silently mean something "
                          f"else. Use the checkpoint's values, start a new run in another "
                          f"--output_dir, or pass --resume_ignore_config true if you mean it")


def restore_training_state(train_network, path, current=None):
    """Load network and optimizer state from a checkpoint written by ``CheckpointSaver``.

    Args:
        train_network (nn.Cell): The training cell (network, optimizer, loss scale), as
            ``Model.train_network``; every parameter it has must be in the file.
        path (str): The checkpoint.
        current (dict, optional): This run's config: checked against the stored one
            (``check_same_recipe``) before the parameters, so another recipe is named by its
            keys (another ``optimizer`` too, whose state has other names); None skips it
            (``--resume_ignore_config``).

    Returns:
        tuple(int, dict or None, dict or None): training steps already done, the stored run
        config, and the best evaluation score so far (``stored_best``: the evaluator resumes
        from it, so a worse evaluation does not replace the best checkpoint).

    Raises:
        MissingFileError: If the file does not exist.
        CheckpointError: If it is unreadable, lacks optimizer state, or does not fit the
            network (names the parameters).
        ConfigError: If ``current`` differs from the stored config (``check_same_recipe``).
    """
    params = read_checkpoint(path)
    if current is not None:
        check_same_recipe(path, stored_config(params), current)
    if "global_step" not in params:
        raise CheckpointError(f"{path} holds no optimizer state: not a training checkpoint "
                              f"(use --pre_trained to start from its weights)")
    missing, _, mismatched = compare(train_network, params)
    missing = [n for n in missing if not n.startswith(NOT_REQUIRED)]
    mismatched = [m for m in mismatched if not m.startswith(NOT_RESTORED)]
    if missing or mismatched:
        state_only = missing and all(n.startswith(TRAINING_STATE_PREFIXES) for n in missing)
        hint = (" (optimizer state of another optimizer, EMA or loss scaling than the "
                "checkpoint's?)" if state_only else " (cut short?)" if missing else "")
        raise CheckpointError(f"checkpoint {path} does not fit this run: missing {missing[:5]}"
                              f"{hint}, shape mismatch {mismatched[:5]}")
    steps_done, config, best = stored_step(params), stored_config(params), stored_best(params)
    for name in [n for n in params if n.startswith(NOT_RESTORED)]:
        params.pop(name)  # also the LR arrays of parameter groups (learning_rate_group_*)
    for p in train_network.get_parameters():  # never saved: a resumed run starts them at 0
        if p.name.startswith(GRAD_ACCUM_PREFIX):
            params[p.name] = ms.Parameter(ms.Tensor(np.zeros(p.shape, ms.dtype_to_nptype(
                p.dtype))), name=p.name)
    ms.load_param_into_net(train_network, params, strict_load=False)
    return steps_done, config, best


def agree_across_ranks(local_path, output_dir, prefix, steps_per_epoch, param_names, gather):
    """Make every rank resume from the same step: rank 0's choice.

    Without a shared filesystem each host resolves ``auto`` in its own ``output_dir``; a
    rank that started from scratch while the others resumed would hang the collectives.
    Rank 0's checkpoint (by position) is the decision; every rank must hold a usable file of
    that name in its own ``output_dir`` (shared, or copied there).

    Args:
        local_path (str): This rank's resolved checkpoint ("" for none).
        output_dir, prefix, steps_per_epoch: As ``find_resume_checkpoint``.
        param_names (list[str]): Parameter names a usable checkpoint must hold.
        gather (callable): ``gather(int) -> list[int]``, the value of every rank in rank
            order (an all-gather).

    Returns:
        str: the path this rank resumes from ("" when rank 0 starts from scratch).

    Raises:
        ConfigError: On every rank when any rank lacks rank 0's checkpoint; names the ranks
            and the file.
    """
    try:  # no rank may raise before the gathers: the others would wait for it forever
        position = 0
        if local_path:  # the name encodes the step; read the file only for other names
            position = (position_of(local_path, steps_per_epoch)
                        or stored_step(read_checkpoint(local_path)))
    except (UserError, KeyError):
        position = -1
    chosen = gather(position)[0]
    if chosen < 0:
        raise ConfigError(f"rank 0 cannot read its resume checkpoint (--resume_ckpt "
                          f"{local_path or 'auto'} in {output_dir}); see rank 0's log")
    path = ""
    usable = True
    if chosen:
        path = local_path if position == chosen else _path_at(output_dir, prefix, chosen,
                                                              steps_per_epoch)
        usable = bool(path) and is_resumable(path, param_names)[0]
    lacking = [rank for rank, ok in enumerate(gather(int(usable))) if not ok]
    if lacking:
        name = checkpoint_name(prefix, chosen, steps_per_epoch)
        raise ConfigError(f"rank 0 resumes from {name} (step {chosen}) but ranks {lacking} have "
                          f"no usable copy of it in their output_dir {output_dir}: without a "
                          f"shared filesystem copy it there on every host, or pass "
                          f"--resume_ckpt PATH")
    return path


def _path_at(output_dir, prefix, step, steps_per_epoch):
    path = os.path.join(output_dir, checkpoint_name(prefix, step, steps_per_epoch))
    return path if os.path.isfile(path) else ""
