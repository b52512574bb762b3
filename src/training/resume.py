"""Resuming a run exactly: which checkpoint (``--resume_ckpt PATH|auto``), whether it belongs to
the same recipe, agreement of all ranks, and restoring the network, optimizer and position.

The LR array comes from the config and is indexed by the optimizer's ``global_step``; the
data order is restored by building each epoch's pipeline from (seed, epoch) alone
(``epoch_seed``) and skipping the batches already trained in a partly done epoch.
"""
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mindspore as ms
import mindspore.nn as nn
import numpy as np

from src.training.best import best_checkpoint_path, stored_score
from src.training.lr_schedule import LR_KEYS
from src.training.optimizer import HYPERPARAMETERS, OPTIMIZERS, optimizer_hyperparameters
from src.training.output_dir import records_after
from src.utils.checkpoint import (
    GRAD_ACCUM_PREFIX,
    KD_LOSS_PREFIX,
    KD_TEACHER_PREFIX,
    METADATA_KEYS,
    OVERFLOW_COUNTER,
    TRAINING_STATE_PREFIXES,
    CheckpointError,
    checkpoint_name,
    compare,
    is_resumable,
    load_leaving_some,
    periodic_checkpoints,
    position_of,
    read_checkpoint,
    stored_best,
    stored_config,
    stored_data,
    stored_epoch_loss,
    stored_step,
)
from src.utils.config import ConfigError
from src.utils.device import all_gather_int
from src.utils.errors import UserError

LOGGER = logging.getLogger(__name__)
NOT_RESTORED = ("learning_rate",) + METADATA_KEYS  # the LR array comes from the config
# Restored when present; checkpoints written before the loss scale (the overflow counter) was
# part of the training cell lack it: the configured scale is used (the count starts at 0).
# The gradient accumulation buffers are never saved (zero between optimizer steps).
NOT_REQUIRED = NOT_RESTORED + ("scale_sense", OVERFLOW_COUNTER, GRAD_ACCUM_PREFIX,
                               KD_TEACHER_PREFIX, KD_LOSS_PREFIX)  # the last two never saved
MAY_DIFFER = frozenset((
    # where things are, and the run's own controls
    "data_path", "eval_data_path", "label_file", "eval_label_file", "output_dir", "pre_trained",
    "config_path", "resume_ckpt", "resume_ignore_config", "overwrite",
    # how the work is spread and run: workers, devices, execution mode, sink settings
    "num_parallel_workers", "device_id", "run_distribute", "all_reduce_fusion_config", "mode",
    "dataset_sink_mode", "sink_size", "check_images", "max_image_pixels",
    "grad_accumulation_allreduce",
    # logging, profiling, plots, the overflow stop
    "log_interval", "profile_steps", "plot", "tensorboard", "benchmark_steps",
    "max_overflow_fraction",
    # when the run ends early (a stopped run may be extended with a larger patience)
    "early_stopping_patience", "early_stopping_min_delta",
    # checkpoint cadence and retention, eval cadence
    "save_checkpoint_epochs", "save_checkpoint_steps", "keep_checkpoint_max", "run_eval",
    "eval_interval",
    # keys of eval.py, export.py and predict.py
    "split_file", "checkpoint_path", "use_ema", "runtime", "file_name", "file_format", "fold_bn",
    "dynamic_batch", "quantize", "calibration_data_path", "calibration_images",
    "quantize_reduce_range", "image_path", "class_names_path", "top_k", "tune_thresholds"))
"""Keys a resumed run may change: paths, workers and devices, sink settings, logging,
checkpoint and eval cadence, the other entry points' keys. Every other key of the stored
run config must agree (``check_same_recipe``): it changes what is trained (network, data
and augmentation, seed, steps per epoch, LR, optimizer and its decay, loss, precision,
fine-tuning) or how the best checkpoint is chosen (eval preprocessing, ``best_on_ema``). A key
added later is checked as soon as checkpoints store it."""
RESUME_KEYS = ("net_name", "class_num", "batch_size", "grad_accumulation_steps",
               "device_num", "optimizer", "trainable_layers", "freeze_bn", "layer_decay",
               "head_lr_scale", "linear_probe_epochs", "stem_pool_pad_mode", "val_split",
               "class_balance", "aug_repeats") + LR_KEYS
"""Keys checked before any other (their message comes first): the steps per epoch, the
network, the per-step LR array and the images trained on."""


def recipe_keys(current: dict) -> list[str]:
    """The keys of ``current`` a resume checks: ``RESUME_KEYS`` first, then every other key
    not in ``MAY_DIFFER``, in the config's order."""
    return [k for k in RESUME_KEYS if k in current] + [
        k for k in current if k not in RESUME_KEYS and k not in MAY_DIFFER]


def epoch_seed(seed: int, epoch: int) -> int:
    """Seed of the data pipeline of ``epoch`` (0-based): a function of (seed, epoch) only,
    in the dataset seed's range 0..2**32 - 1 (taken modulo 2**32: the seeds below it, every
    seed up to 42948 for 90 epochs, are those of earlier versions)."""
    return (seed * 100003 + epoch) % 2 ** 32


def find_resume_checkpoint(output_dir: str, prefix: str, steps_per_epoch: int,
                           param_names: Sequence[str]) -> str | None:
    """The newest usable training checkpoint ``PREFIX-*.ckpt`` of
    ``output_dir`` (``--resume_ckpt auto``), or None; unusable ones (unreadable, cut short, no
    optimizer state, lacking a name of ``param_names``) are passed over with a warning."""
    for path in periodic_checkpoints(output_dir, prefix, steps_per_epoch):
        usable, why = is_resumable(path, param_names)
        if usable:
            return path
        LOGGER.warning("skipping checkpoint %s (%s); trying the previous one", path, why)
    return None


def effective_optimizer(config: dict) -> dict:
    """``config`` with the optimizer hyperparameters it trains with: the chosen optimizer's
    (``optimizer_hyperparameters``: a null key is its declared default), those of other
    optimizers left out; unchanged without an ``optimizer`` key. A checkpoint that stores
    ``momentum 0.875`` and a config that leaves it null (the declared default) agree."""
    if config.get("optimizer") not in OPTIMIZERS:
        return config
    taken = optimizer_hyperparameters(config["optimizer"], **{
        k: config.get(k) for k in HYPERPARAMETERS})
    return {**{k: v for k, v in config.items() if k not in HYPERPARAMETERS}, **taken}


def check_same_recipe(path: str, stored: dict | None, current: dict,
                      keys: Sequence[str] | None = None) -> None:
    """Refuse to resume ``path`` when its stored ``run_config`` (None: accepted
    with a warning) differs from ``current`` in ``keys`` (default ``recipe_keys(current)``; keys
    it does not store are not checked).

    Raises:
        ConfigError: Naming every differing key with both values, and the way out.
    """
    if stored is None:
        LOGGER.warning("%s stores no run config: cannot check that it was trained with the "
                       "same recipe", path)
        return
    keys = recipe_keys(current) if keys is None else keys
    stored, current = effective_optimizer(stored), effective_optimizer(current)
    differ = [f"{k} {current[k]!r} (checkpoint: {stored[k]!r})" for k in keys
              if k in stored and k in current
              and stored[k] != json.loads(json.dumps(current[k]))]
    if differ:
        raise ConfigError(f"cannot resume {path} with other {', '.join(differ)}: the rest of "
                          f"the run would train something else than its first part (the "
                          f"network, the data, the steps per epoch, the LR schedule or the "
                          f"optimization). Use the checkpoint's values, start a new run in "
                          f"another --output_dir, or pass --resume_ignore_config true if you "
                          f"mean it")


def check_same_data(path: str, stored: dict | None, current: dict[str, int | None],
                    data_path: str | None) -> None:
    """Refuse to resume ``path`` when its stored ``train_data`` (None: accepted)
    differs from ``current`` (``{"images", "steps_per_epoch"}``): files were added to or removed
    from ``data_path``, which would stretch the LR schedule and shift the epochs.

    Raises:
        ConfigError: Naming both counts and the way out.
    """
    if stored is None or all(stored.get(k) == v for k, v in current.items()):
        return
    raise ConfigError(f"data_path {data_path} holds {current['images']} images "
                      f"({current['steps_per_epoch']} steps per epoch) but the checkpoint {path} "
                      f"was trained on {stored.get('images')} ({stored.get('steps_per_epoch')} "
                      f"steps per epoch): files were added or removed, and resuming would "
                      f"stretch or shrink the LR schedule and put the epochs out of step with "
                      f"its checkpoints and records. Restore the data it was trained on, start "
                      f"a new run in another --output_dir, or pass --resume_ignore_config true "
                      f"to go on with this data")


def restore_training_state(
        train_network: nn.Cell, path: str, current: dict | None = None,
        data: dict[str, int | None] | None = None
) -> tuple[int, dict | None, dict | None, dict | None]:
    """Load the network and optimizer state of checkpoint ``path`` into
    ``train_network`` (``Model.train_network``), after checking ``current`` (the run's config;
    None skips, ``--resume_ignore_config``) and ``data`` against the stored ones.

    Returns:
        tuple: (steps done, the stored run config, the stored best score or None, the sum and
        count of the epoch's losses so far or None).

    Raises:
        MissingFileError: If the file does not exist.
        CheckpointError: If it is unreadable, lacks optimizer state, or does not fit the
            network (names the parameters).
        ConfigError: As ``check_same_recipe`` and ``check_same_data``.
    """
    params = read_checkpoint(path)
    if current is not None:
        check_same_recipe(path, stored_config(params), current)
        if data is not None:
            check_same_data(path, stored_data(params), data, current.get("data_path"))
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
    epoch_loss = stored_epoch_loss(params)
    for name in [n for n in params if n.startswith(NOT_RESTORED)]:
        params.pop(name)  # also the LR arrays of parameter groups (learning_rate_group_*)
    for p in train_network.get_parameters():  # never saved: a resumed run starts them at 0
        if p.name.startswith(GRAD_ACCUM_PREFIX):
            params[p.name] = ms.Parameter(ms.Tensor(np.zeros(p.shape, ms.dtype_to_nptype(
                p.dtype))), name=p.name)
    not_loaded = load_leaving_some(train_network, params)
    teacher = [n for n in not_loaded if n.startswith(KD_TEACHER_PREFIX)]
    if teacher:
        LOGGER.info("the %d parameters of the distillation teacher (%s*) are not loaded from "
                    "the checkpoint: the teacher is loaded from kd_teacher", len(teacher),
                    KD_TEACHER_PREFIX)
    others = [n for n in not_loaded
              if not n.startswith((KD_TEACHER_PREFIX, KD_LOSS_PREFIX) + NOT_RESTORED)]
    if others:  # NOT_REQUIRED state an older checkpoint lacks
        LOGGER.warning("not in %s, so kept as built: %s%s", path, ", ".join(others[:10]),
                       f" and {len(others) - 10} more" if len(others) > 10 else "")
    return steps_done, config, best, epoch_loss


def agree_across_ranks(local_path: str, output_dir: str, prefix: str, *, steps_per_epoch: int,
                       param_names: Sequence[str], gather: Callable[[int], list[int]]) -> str:
    """Make every rank resume from rank 0's choice (without a shared
    filesystem each host resolves ``auto`` in its own folder; a rank starting from scratch while
    others resume would hang the collectives): every rank must hold a usable file of that name.
    ``gather(int) -> list[int]`` is an all-gather; the other arguments as
    ``find_resume_checkpoint``."""
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


def resumable_names(train_network: nn.Cell) -> list[str]:
    """The parameter names a usable checkpoint of ``train_network`` must hold."""
    return [p.name for p in train_network.get_parameters()
            if not p.name.startswith(NOT_REQUIRED)]


def newer_checkpoint(output_dir: str, prefix: str, steps_per_epoch: int,
                     param_names: Sequence[str], step: int) -> str | None:
    """The newest usable checkpoint in ``output_dir`` when it lies past ``step``, else None:
    a run resumed from ``step`` would then branch off its own later steps."""
    for path in periodic_checkpoints(output_dir, prefix, steps_per_epoch):
        if position_of(path, steps_per_epoch) <= step:
            return None
        if is_resumable(path, param_names)[0]:
            return path
    return None


def folder_best(best_path: str) -> dict | None:
    """The score stored in the run's best checkpoint (``NET-best.ckpt``): ``{"top1",
    "epoch"}``, or None (no such file, one written before it stored its score, or unreadable:
    a warning)."""
    if not os.path.isfile(best_path):
        return None
    try:
        best = stored_best(read_checkpoint(best_path))
        if best is not None:
            best = {key: float(best[key]) if key != "epoch" else int(best[key])
                    for key in best}
            stored_score(best)  # a KeyError without a score
    except (CheckpointError, ValueError, KeyError, TypeError) as err:
        LOGGER.warning("cannot read the score of %s (%s): the resumed checkpoint's best is "
                       "kept", best_path, str(err).splitlines()[0] or type(err).__name__)
        return None
    return best


def branch_files(output_dir: str, prefix: str, *, resume_path: str, step: int,
                 steps_per_epoch: int, param_names: Sequence[str],
                 overwrite: bool) -> list[str]:
    """The files to move aside for a resume from ``resume_path`` at ``step`` when
    ``output_dir`` holds a newer usable checkpoint (a branch): the later periodic checkpoints and
    a best checkpoint chosen after ``step``; [] when it is no branch.

    Raises:
        ConfigError: For a branch without ``overwrite`` (names both checkpoints and the ways out).
    """
    newer = newer_checkpoint(output_dir, prefix, steps_per_epoch, param_names, step)
    if newer is None:
        return []
    if not overwrite:
        records = len(records_after(output_dir, step))
        raise ConfigError(
            f"--resume_ckpt {resume_path} (step {step}) is older than the newest checkpoint of "
            f"the run in {output_dir}, {os.path.basename(newer)} (step "
            f"{position_of(newer, steps_per_epoch)}): resuming from it would overwrite the "
            f"later checkpoints and drop the {records} record(s) after step {step} from "
            f"metrics.jsonl. Resume the newest with --resume_ckpt auto, branch off into "
            f"another --output_dir (the same --resume_ckpt), or pass "
            f"--overwrite true to move the later checkpoints and records into a "
            f"previous_run_* folder inside it")
    later = [p for p in periodic_checkpoints(output_dir, prefix, steps_per_epoch)
             if position_of(p, steps_per_epoch) > step]
    best_path = best_checkpoint_path(output_dir, prefix)
    best = folder_best(best_path)
    if best is not None and int(best["epoch"]) * steps_per_epoch > step:
        later.append(best_path)
    return later


@dataclass
class ResumedRun:
    """Where a run starts (``resume_run``): the checkpoint resumed ("" = fresh), the
    steps done, the stored best score and, for a run continuing its folder, ``NET-best.ckpt``'s
    (``BestCheckpoint.restore`` takes the higher), the config and data stored in the checkpoints,
    whether the checkpoint lies in ``output_dir``, and a branch's later files to move aside."""

    resume_path: str
    start_step: int
    best: dict | None
    folder_best: dict | None
    config: dict
    data: dict
    continues_here: bool
    later_files: list[str]
    epoch_loss: dict | None = None  # the resumed epoch's losses so far (TrainMonitor)


def resume_run(train_network: nn.Cell, *, resume_ckpt: str, output_dir: str, prefix: str,
               run_config: dict, check_recipe: bool, overwrite: bool, epoch_size: int,
               steps_per_epoch: int, total_steps: int, device_num: int,
               log: logging.Logger, train_images: int | None = None) -> ResumedRun:
    """Restore the training state of ``resume_ckpt`` (a path, "auto" or "") into
    ``train_network``: ``run_config`` (the config with ``device_num``) and the data are checked
    against the checkpoint's when ``check_recipe``; ``train_images`` None skips the data check.

    Raises:
        ConfigError: Another recipe or data (with ``check_recipe``), every step of
            ``total_steps`` already trained (the message names ``epoch_size``), or a branch
            without ``overwrite``.
    """
    data = {"images": train_images, "steps_per_epoch": steps_per_epoch}
    start_step, best, folder_score, later, epoch_loss = 0, None, None, [], None
    resume_path = resume_checkpoint_path(
        train_network, resume_ckpt=resume_ckpt, output_dir=output_dir, prefix=prefix,
        steps_per_epoch=steps_per_epoch, device_num=device_num, log=log)
    if resume_path:
        start_step, _, best, epoch_loss = restore_training_state(
            train_network, resume_path, run_config if check_recipe else None,
            None if train_images is None else data)
        if start_step >= total_steps:
            raise ConfigError(f"{resume_path} has already trained all {total_steps} steps of "
                              f"epoch_size {epoch_size}")
    continues_here = bool(resume_path) and in_folder(resume_path, output_dir)
    if continues_here:
        if resume_ckpt != "auto":  # auto takes the newest usable one: never a branch
            later = branch_files(output_dir, prefix, resume_path=resume_path, step=start_step,
                                 steps_per_epoch=steps_per_epoch,
                                 param_names=resumable_names(train_network), overwrite=overwrite)
        best_path = best_checkpoint_path(output_dir, prefix)
        if best_path not in later:  # a best chosen after a crash, e.g. (auto falls back)
            folder_score = folder_best(best_path)
    return ResumedRun(resume_path=resume_path, start_step=start_step, best=best,
                      folder_best=folder_score, config=run_config, data=data,
                      continues_here=continues_here, later_files=later, epoch_loss=epoch_loss)


def resume_checkpoint_path(train_network: nn.Cell, *, resume_ckpt: str, output_dir: str,
                           prefix: str, steps_per_epoch: int, device_num: int,
                           log: logging.Logger) -> str:
    """``resume_ckpt`` resolved to a path ("" to start from scratch): as given, or for
    "auto" the newest usable checkpoint in ``output_dir``; in data parallel, rank 0's
    choice, which every rank must hold (``agree_across_ranks``)."""
    names = resumable_names(train_network)
    path = resume_ckpt
    if path == "auto":
        path = find_resume_checkpoint(output_dir, prefix, steps_per_epoch, names) or ""
    if device_num > 1:
        path = agree_across_ranks(path, output_dir, prefix, steps_per_epoch=steps_per_epoch,
                                  param_names=names, gather=all_gather_int)
    if resume_ckpt == "auto" and not path:
        log.info("resume_ckpt auto: no checkpoint in %s, starting from scratch", output_dir)
    return path


def in_folder(path: str, folder: str) -> bool:
    """Whether ``path`` lies directly in ``folder``."""
    return os.path.isdir(folder) and os.path.samefile(os.path.dirname(os.path.abspath(path)),
                                                      folder)
