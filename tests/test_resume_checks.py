"""What a resume checks before it restores anything: the recipe of the checkpoint, named key
by key (another optimizer too, whose state has other parameter names)."""
import json
import logging

import mindspore as ms
import numpy as np
import pytest

from src.training.resume import restore_training_state
from src.utils.checkpoint import (
    BEST_KEY,
    CONFIG_KEY,
    STEP_KEY,
    CheckpointError,
    atomic_save_checkpoint,
)
from src.utils.config import ConfigError, parse_config


def momentum_checkpoint(path):
    """A training checkpoint of a Momentum run (optimizer state ``moments.*``)."""
    stored = dict(parse_config([]), device_num=1)
    params = [{"name": "w", "data": ms.Tensor(np.ones(2, np.float32))},
              {"name": "moments.w", "data": ms.Tensor(np.zeros(2, np.float32))},
              {"name": "global_step", "data": ms.Tensor(np.array([5], np.int32))}]
    atomic_save_checkpoint(params, str(path), {STEP_KEY: 5, CONFIG_KEY: json.dumps(stored)})
    return str(path)


class AdamWCell(ms.nn.Cell):
    """A training cell whose optimizer state is AdamW's (``adam_m.*``, ``adam_v.*``)."""

    def __init__(self):
        super().__init__()
        self.w = ms.Parameter(ms.Tensor(np.ones(2, np.float32)), name="w")
        self.m = ms.Parameter(ms.Tensor(np.zeros(2, np.float32)), name="adam_m.w")
        self.v = ms.Parameter(ms.Tensor(np.zeros(2, np.float32)), name="adam_v.w")
        self.step = ms.Parameter(ms.Tensor(np.array([0], np.int32)), name="global_step")


def test_resuming_with_another_optimizer_names_the_key(tmp_path):
    path = momentum_checkpoint(tmp_path / "net-1_5.ckpt")
    current = dict(parse_config(["--optimizer", "adamw"]), device_num=1)
    with pytest.raises(ConfigError, match="other optimizer 'adamw' \\(checkpoint: 'momentum'\\)"):
        restore_training_state(AdamWCell(), path, current)


def test_ignoring_the_config_names_the_missing_optimizer_state(tmp_path):
    path = momentum_checkpoint(tmp_path / "net-1_5.ckpt")
    with pytest.raises(CheckpointError, match="missing \\['adam_m.w', 'adam_v.w'\\] \\("
                                              "optimizer state of another optimizer"):
        restore_training_state(AdamWCell(), path, None)


def test_resume_returns_the_stored_best_score(tmp_path):
    stored = dict(parse_config(["--optimizer", "adamw"]), device_num=1)
    params = [{"name": p.name, "data": p.data} for p in AdamWCell().get_parameters()]
    path = str(tmp_path / "net-2_10.ckpt")
    atomic_save_checkpoint(params, path, {STEP_KEY: 20, CONFIG_KEY: json.dumps(stored),
                                          BEST_KEY: json.dumps({"top1": 0.51, "epoch": 2})})
    steps, _, best, _ = restore_training_state(AdamWCell(), path, stored)
    assert steps == 20 and best == {"top1": 0.51, "epoch": 2}


def test_a_log_file_that_cannot_be_written_is_reported_once(tmp_path):
    from src.utils.logger import get_logger, log_file_error
    log = get_logger("full_disk_test", str(tmp_path / "train.log"))
    handler = [h for h in log.handlers if hasattr(h, "baseFilename")][0]

    def no_space(text):
        raise OSError(28, "No space left on device")

    handler.stream.write = no_space
    try:
        log.info("a line that cannot be written")
        log.info("another")
        assert log_file_error(log) == (f"cannot write {tmp_path / 'train.log'}: [Errno 28] No "
                                       f"space left on device")
    finally:
        for logger in (log, logging.getLogger("src")):
            logger.removeHandler(handler)
