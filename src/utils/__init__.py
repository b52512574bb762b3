"""The core below every other package: config and command line, errors, logging, files,
device, checkpoint files, the task registry, metrics; imports no other package of ``src``.
The names the entry points use are exported here; the library imports the modules."""
from src.utils.calibration import check_fit_images, fit_temperature
from src.utils.checkpoint import (
    own_checkpoints,
    read_checkpoint,
    remove_stale_partials,
    stored_config,
)
from src.utils.cli import run_entry_point
from src.utils.config import Config, ConfigError, parse_config
from src.utils.device import init_distributed
from src.utils.errors import MissingFileError, UserError, WriteError
from src.utils.files import FileLock, atomic_write_bytes, atomic_write_text, check_output_dir
from src.utils.hub import is_pretrained_source
from src.utils.logger import get_logger
from src.utils.multilabel_metrics import tune_thresholds
from src.utils.ood import OOD_SCORES, all_scores, threshold_for_tpr
from src.utils.progress import Progress
from src.utils.tasks import MULTICLASS, MULTILABEL, get_task
from src.utils.throughput import as_tensors, synthetic_batch, throughput_report, time_calls
from src.utils.tracking import TENSORBOARD_FOLDER, TensorBoardLog

__all__ = [
    "check_fit_images", "fit_temperature",  # calibration
    "own_checkpoints", "read_checkpoint", "remove_stale_partials", "stored_config",  # checkpoint
    "run_entry_point",  # cli
    "Config", "ConfigError", "parse_config",  # config
    "init_distributed",  # device
    "MissingFileError", "UserError", "WriteError",  # errors
    "FileLock", "atomic_write_bytes", "atomic_write_text", "check_output_dir",  # files
    "is_pretrained_source",  # hub
    "get_logger",  # logger
    "tune_thresholds",  # multilabel_metrics
    "OOD_SCORES", "all_scores", "threshold_for_tpr",  # ood
    "Progress",  # progress
    "MULTICLASS", "MULTILABEL", "get_task",  # tasks
    "as_tensors", "synthetic_batch", "throughput_report", "time_calls",  # throughput
    "TENSORBOARD_FOLDER", "TensorBoardLog",  # tracking
]
