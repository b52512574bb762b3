"""The checks of a training config: values that cannot work are refused naming the key
(``check_train_config``), the optimizer's keys (``check_optimizer_keys``), keys set that their
entry point would ignore (``check_unused_keys``), ``task``'s defaults and score key, the dataset
sink size (``resolve_sink_size``); and the sections of train.py's ``--help``.
"""
import logging
from collections.abc import Callable
from typing import NamedTuple

from src.models.resnet import last_feature_map_side
from src.recipe.splits import held_out
from src.training.lr_schedule import TO_LR_END
from src.training.optimizer import HYPERPARAMETERS, OPTIMIZERS
from src.training.profiler import parse_profile_steps
from src.utils.config import Config, ConfigError
from src.utils.tasks import get_task

TRAIN_SECTIONS = ("network", "data", "training data", "optimization", "fine-tuning",
                  "knowledge distillation", "device",
                  "precision, distribution", "outputs", "performance", "training checkpoints")
"""The sections of train.py's ``--help``, in order."""


def check_train_config(cfg: Config) -> None:
    """Reject training values that cannot work, naming the key (ranges: ``check_values``).

    Raises:
        ConfigError: Empty ``data_path``, ``run_eval`` without eval data, early stopping
            without ``run_eval``, a hyperparameter the optimizer does not take, a key set
            that training would ignore (``check_unused_keys``), a bad split, balance or
            ``profile_steps``, a linear probe as long as the run, or a last-stage BatchNorm
            seeing one value per channel.
    """
    if not cfg.data_path:
        raise ConfigError("data_path is empty: give --data_path, the training data folder")
    if cfg.run_eval and not (cfg.eval_data_path or cfg.val_split):
        raise ConfigError("run_eval is true but eval_data_path is empty (and val_split is 0: "
                          "no part of data_path is held out)")
    if cfg.early_stopping_patience and not cfg.run_eval:
        raise ConfigError(f"early_stopping_patience {cfg.early_stopping_patience} needs an "
                          f"evaluation during training: set run_eval true (with "
                          f"eval_data_path or val_split), or early_stopping_patience 0")
    check_optimizer_keys(cfg)
    check_unused_keys(cfg, "train")
    check_split_and_balance(cfg)
    check_task(cfg)
    parse_profile_steps(cfg.profile_steps)
    if cfg.linear_probe_epochs >= cfg.epoch_size:
        raise ConfigError(f"linear_probe_epochs {cfg.linear_probe_epochs} leaves no epoch to "
                          f"fine-tune in epoch_size {cfg.epoch_size}: use fewer, or "
                          f"trainable_layers 0 for a linear probe alone")
    side = last_feature_map_side(cfg.train_image_size)
    batch_statistics = not cfg.freeze_bn and cfg.trainable_layers >= 1
    if batch_statistics and cfg.batch_size * side * side < 2:
        raise ConfigError(f"batch_size {cfg.batch_size} at train_image_size "
                          f"{cfg.train_image_size}: the last stage's feature map is {side}x{side}"
                          f", so its BatchNorm layers would see one value per channel (variance "
                          f"undefined, the running statistics become NaN); use batch_size 2 or "
                          f"more, a train_image_size above 32, or freeze_bn true")


def check_optimizer_keys(cfg: Config) -> None:
    """The optimizer hyperparameters set (not null, as config.yaml leaves them) are ones the
    chosen ``optimizer`` takes (``OPTIMIZERS``).

    Raises:
        ConfigError: Naming the key, the optimizer, the keys it takes and those taking the key.
    """
    takes = OPTIMIZERS[cfg.optimizer].hyperparameters
    for key in HYPERPARAMETERS:
        if key not in takes and cfg[key] is not None:
            others = [name for name, info in OPTIMIZERS.items() if key in info.hyperparameters]
            raise ConfigError(f"{key} {cfg[key]} is set but optimizer {cfg.optimizer} does not "
                              f"take it (it takes {', '.join(takes)}): leave {key} unset "
                              f"(null), or use optimizer {' or '.join(others)}")


class UnusedKey(NamedTuple):
    """A row of ``UNUSED_KEYS``: ``key`` is read by entry point ``reader`` only where ``used``
    holds, a setting of key ``needed`` (``needs`` in words); ``warn``: one warning line
    instead of a refusal."""

    key: str
    needed: str
    needs: str
    used: Callable[[Config], bool]
    reader: str = "train"
    warn: bool = False


UNUSED_KEYS = (
    UnusedKey("lr_end", "lr_schedule", "lr_schedule cosine, linear or poly",
              lambda cfg: cfg.lr_schedule in TO_LR_END),
    UnusedKey("lr_poly_power", "lr_schedule", "lr_schedule poly",
              lambda cfg: cfg.lr_schedule == "poly"),
    UnusedKey("lr_decay_epochs", "lr_schedule", "lr_schedule step",
              lambda cfg: cfg.lr_schedule == "step"),
    UnusedKey("lr_decay_factor", "lr_schedule", "lr_schedule step",
              lambda cfg: cfg.lr_schedule == "step"),
    *(UnusedKey(key, "kd_teacher", "a kd_teacher", lambda cfg: bool(cfg.kd_teacher))
      for key in ("kd_net_name", "kd_distill_type", "kd_temperature", "distill_loss_weight",
                  "task_loss_weight")),
    UnusedKey("kd_temperature", "kd_distill_type", "kd_distill_type logit",
              lambda cfg: cfg.kd_distill_type == "logit"),
    # a warning: resuming with --early_stopping_patience 0 turns early stopping off
    # (docs/training.md#early-stopping), the run's min_delta often still given
    UnusedKey("early_stopping_min_delta", "early_stopping_patience",
              "early_stopping_patience above 0", lambda cfg: cfg.early_stopping_patience > 0,
              warn=True),
    UnusedKey("cam_class", "cam_dir", "a cam_dir", lambda cfg: bool(cfg.cam_dir),
              reader="predict"),
    *(UnusedKey(key, "tune_ood", "tune_ood true", lambda cfg: cfg.tune_ood, reader="eval")
      for key in ("ood_score", "ood_tpr")),
)
"""Keys read only with another key's setting: set otherwise than config.yaml's default
(``Config.set_otherwise``) while it is off, they would be ignored without a word."""
LOGGER = logging.getLogger(__name__)


def check_unused_keys(cfg: Config, reader: str) -> None:
    """Refuse the keys of ``UNUSED_KEYS`` that entry point ``reader`` ("train", "eval", "predict")
    reads, set otherwise than their default where their setting is off (a ``warn`` row: one
    warning line).

    Raises:
        ConfigError: Naming the key, its value, the key it needs and that key's value.
    """
    for row in UNUSED_KEYS:
        if row.reader != reader or not cfg.set_otherwise(row.key) or row.used(cfg):
            continue
        found = (f"{row.key} {_shown(cfg[row.key])} is only read with {row.needs} "
                 f"({row.needed} is {_shown(cfg[row.needed])})")
        if row.warn:
            LOGGER.warning("%s: it is ignored", found)
            continue
        raise ConfigError(f"{found}: use {row.needs}, or leave {row.key} at its default "
                          f"{_shown(cfg.defaults.get(row.key))}")


def _shown(value):
    """A config value in a message: "empty" for an empty string."""
    return "empty" if value == "" else value


def check_split_and_balance(cfg: Config) -> None:
    """Raises:
        ConfigError: For a ``split_file`` (eval.py's key), or ``val_split`` / ``class_balance``
            with the cifar10 binaries.
    """
    if cfg.split_file:
        raise ConfigError(f"split_file {cfg.split_file} is read by eval.py only: train.py holds "
                          f"out part of data_path with val_split")
    for key, value, off in (("val_split", held_out(cfg), 0.0),
                            ("class_balance", cfg.class_balance, "none")):
        if cfg.dataset == "cifar10" and value != off:
            raise ConfigError(f"{key} {value} needs dataset imagefolder: the cifar10 binary "
                              f"release comes split (test_batch.bin, for eval_data_path) and "
                              f"balanced (5000 training images per class)")


def check_task(cfg: Config) -> None:
    """The keys of ``task``: a loss of another task is refused; multiclass refuses the
    multi-label keys; multilabel takes its ``defaults`` for the keys not set (logged) and
    refuses what it cannot train.

    Raises:
        ConfigError: Naming the key and value.
    """
    task = get_task(cfg.task)
    cfg = task_defaults(cfg, log=False)  # checked as it will train
    if not task.label_file:
        for key in ("label_file", "eval_label_file"):
            if cfg[key]:
                raise ConfigError(f"{key} {cfg[key]} is read with task multilabel only (task is "
                                  f"{cfg.task}): set --task multilabel, or leave {key} empty")
    if cfg.loss not in task.losses:
        raise ConfigError(f"loss {cfg.loss} is not a loss of task {task}: it takes "
                          f"{' or '.join(task.losses)}"
                          + (" (asl, the asymmetric loss, is for multi-label training)"
                             if cfg.loss == "asl" else " (a softmax loss)"))
    if not task.multi_hot:
        return
    refusals = (
        (not cfg.label_file, "label_file is empty: give the CSV of data_path's images and their "
                             "labels (docs/multilabel.md)"),
        (cfg.dataset != "imagefolder", f"dataset {cfg.dataset} has one label per image: use "
                                       f"dataset imagefolder with label_file"),
        (cfg.label_smoothing != 0, f"label_smoothing {cfg.label_smoothing}: task multilabel "
                                   f"takes no label smoothing (set 0)"),
        (cfg.class_balance == "sampler", "class_balance sampler draws by class, which a "
                                         "multi-label image does not have: use class_balance "
                                         "loss (pos_weight) or none"),
        (bool(cfg.kd_teacher), f"kd_teacher {cfg.kd_teacher}: knowledge distillation (a softmax "
                               f"KL divergence) is for task multiclass"),
        (bool(cfg.run_eval and cfg.eval_data_path and not cfg.eval_label_file),
         f"eval_data_path {cfg.eval_data_path} needs eval_label_file with task multilabel"),
    )
    for refused, message in refusals:
        if refused:
            raise ConfigError(f"task multilabel: {message}")


def task_defaults(cfg: Config, log: bool = True) -> Config:
    """A new config: ``cfg`` with its task's ``defaults`` for the keys the user did not set
    (multilabel: ``loss bce``, ``label_smoothing 0``), in one log line unless ``log`` is
    false; ``cfg`` itself is unchanged."""
    task = get_task(cfg.task)
    return cfg.with_unset(dict(task.defaults), f"task {task}" if log else None)


def score_key(cfg: Config) -> str:
    """The score the best checkpoint and early stopping follow: the task's ``score_key``
    (top-1, or mAP for ``task multilabel``)."""
    return get_task(cfg.task).score_key


def resolve_sink_size(cfg: Config, steps_per_epoch: int) -> int:
    """Steps per dataset-sink call, 0 for step-by-step training (``dataset_sink_mode`` auto: sink
    mode on GPU/Ascend in graph mode; ``sink_size`` 0: one epoch).

    Raises:
        ConfigError: For ``dataset_sink_mode true`` on CPU (MindSpore has no sink mode there) or
            in PyNative mode, or a ``sink_size`` above an epoch or not dividing it (epochs end
            on call boundaries; names the nearest divisors).
    """
    if cfg.dataset_sink_mode == "true" and cfg.device_target == "CPU":
        raise ConfigError("dataset_sink_mode true: MindSpore has no dataset sink mode on CPU "
                          "(Model.train falls back to step by step); use false or auto")
    if cfg.dataset_sink_mode == "true" and cfg.mode != "GRAPH":
        raise ConfigError(f"dataset_sink_mode true needs mode GRAPH (got {cfg.mode}): in "
                          f"PyNative mode Model.train runs sink mode step by step; use false "
                          f"or auto")
    sink = cfg.dataset_sink_mode == "true" or (cfg.dataset_sink_mode == "auto"
                                               and cfg.device_target != "CPU"
                                               and cfg.mode == "GRAPH")
    if not sink:
        return 0
    sink_size = cfg.sink_size or steps_per_epoch
    if sink_size > steps_per_epoch:
        raise ConfigError(f"sink_size {sink_size} is larger than an epoch ({steps_per_epoch} "
                          f"steps per device): use at most {steps_per_epoch}, or 0 for one "
                          f"epoch per call")
    if steps_per_epoch % sink_size:
        divisors = [d for d in range(1, steps_per_epoch + 1) if steps_per_epoch % d == 0]
        near = sorted(divisors, key=lambda d: abs(d - sink_size))[:2]
        raise ConfigError(f"sink_size {sink_size} does not divide an epoch of "
                          f"{steps_per_epoch} steps: epochs must end on a sink call; use a "
                          f"divisor such as {' or '.join(map(str, sorted(near)))}, or 0 for one "
                          f"epoch per call")
    return sink_size
