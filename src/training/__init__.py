"""Training: train step, loss, optimizer, LR schedules, callbacks, resume, the output folder;
entry points ``create_loss``, ``create_optimizer``, ``create_lr``, ``build_model``. The
names train.py and label_issues.py use are exported here."""
from src.training.best import (
    BestCheckpoint,
    EvalKeepingBest,
    best_checkpoint_path,
    confusion_at_best,
    stored_score,
)
from src.training.callbacks import OptimizerStepCallbacks, StepState, TrainMonitor, loss_value
from src.training.cross_validation import (
    finished_checkpoint,
    fold_command,
    newest_checkpoint,
    run_fold,
    started_folds,
)
from src.training.early_stop import EarlyStop, Patience, ended_early, with_early_stop
from src.training.evaluator import eval_shard
from src.training.loop import TrainCallbacks, finish, track_run_end, train_run
from src.training.loss import CrossEntropySmooth, create_loss
from src.training.lr_schedule import LR_KEYS, create_lr
from src.training.model import build_model, classification_metrics
from src.training.optimizer import create_optimizer, lr_group_tags
from src.training.output_dir import (
    lock_output_dir,
    move_branch_aside,
    prepare_output_dir,
    trim_records,
)
from src.training.precision import resolve_amp_level, resolve_loss_scale_type
from src.training.profiler import ProfileSteps, parse_profile_steps
from src.training.resume import ResumedRun, resume_run
from src.training.saver import CheckpointSaver
from src.training.signals import StopSignals

__all__ = [
    "build_model", "create_loss", "create_lr", "create_optimizer",  # the factories
    "BestCheckpoint", "EvalKeepingBest", "best_checkpoint_path", "confusion_at_best",
    "stored_score",  # best
    "OptimizerStepCallbacks", "StepState", "TrainMonitor", "loss_value",  # callbacks
    "finished_checkpoint", "fold_command", "newest_checkpoint", "run_fold",
    "started_folds",  # cross_validation
    "EarlyStop", "Patience", "ended_early", "with_early_stop",  # early_stop
    "eval_shard",  # evaluator
    "TrainCallbacks", "finish", "track_run_end", "train_run",  # loop
    "CrossEntropySmooth",  # loss
    "LR_KEYS",  # lr_schedule
    "classification_metrics",  # model
    "lr_group_tags",  # optimizer
    "lock_output_dir", "move_branch_aside", "prepare_output_dir", "trim_records",  # output_dir
    "resolve_amp_level", "resolve_loss_scale_type",  # precision
    "ProfileSteps", "parse_profile_steps",  # profiler
    "ResumedRun", "resume_run",  # resume
    "CheckpointSaver",  # saver
    "StopSignals",  # signals
]
