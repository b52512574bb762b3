"""The core below every other package: config and command line, errors, logging, files,
device, checkpoint files, the task registry, metrics; imports no other package of ``src``.
The names the entry points use are exported here, each loaded from its module on first use
(PEP 562), so that importing one module of the core loads no other (nor MindSpore)."""
import importlib

_EXPORTS = {
    "calibration": ("check_fit_images", "fit_temperature"),
    "checkpoint": ("own_checkpoints", "read_checkpoint", "remove_stale_partials",
                   "stored_config"),
    "cli": ("run_entry_point",),
    "config": ("Config", "ConfigError", "parse_config"),
    "device": ("init_distributed",),
    "errors": ("MissingFileError", "UserError", "WriteError"),
    "files": ("FileLock", "atomic_write_bytes", "atomic_write_text", "check_output_dir"),
    "hub": ("is_pretrained_source",),
    "logger": ("get_logger",),
    "multilabel_metrics": ("tune_thresholds",),
    "ood": ("OOD_SCORES", "all_scores", "threshold_for_tpr"),
    "progress": ("Progress",),
    "tasks": ("MULTICLASS", "MULTILABEL", "get_task"),
    "throughput": ("as_tensors", "synthetic_batch", "throughput_report", "time_calls"),
    "tracking": ("TENSORBOARD_FOLDER", "TensorBoardLog"),
}
"""Module of ``src.utils`` -> the names exported from it."""
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    """A name of ``__all__``, imported from its module on first use (PEP 562).

    Raises:
        AttributeError: For any other name (``from src.utils import device`` then imports
            the module ``src.utils.device``).
    """
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
