"""Keys that are read only with another key's setting (``UNUSED_KEYS``): set otherwise than
their default while that setting is off, they are refused naming both keys (a warning line for
``early_stopping_min_delta``), instead of being ignored without a word; every shipped recipe
and a run's written config.yaml still pass."""
import glob
import logging
import os

import pytest

from src.recipe import UNUSED_KEYS, check_train_config, check_unused_keys
from src.utils.config import ConfigError, load_schema, parse_config
from tests.helpers import ROOT, run_in_process


@pytest.mark.parametrize("argv, message", [
    (["--lr_schedule", "step", "--lr_end", "0.001"],
     "lr_end 0.001 is only read with lr_schedule cosine, linear or poly (lr_schedule is step): "
     "use lr_schedule cosine, linear or poly, or leave lr_end at its default 0.0"),
    (["--lr_poly_power", "3"], "lr_poly_power 3.0 is only read with lr_schedule poly "
                               "(lr_schedule is cosine)"),
    (["--lr_decay_epochs", "10,20"], "lr_decay_epochs [10, 20] is only read with lr_schedule "
                                     "step (lr_schedule is cosine)"),
    (["--lr_schedule", "linear", "--lr_decay_factor", "0.5"],
     "lr_decay_factor 0.5 is only read with lr_schedule step (lr_schedule is linear)"),
    (["--kd_net_name", "resnet50"], "kd_net_name resnet50 is only read with a kd_teacher "
                                    "(kd_teacher is empty): use a kd_teacher, or leave "
                                    "kd_net_name at its default empty"),
    (["--kd_distill_type", "feature"], "kd_distill_type feature is only read with a kd_teacher"),
    (["--kd_temperature", "2"], "kd_temperature 2.0 is only read with a kd_teacher"),
    (["--distill_loss_weight", "0.5"], "distill_loss_weight 0.5 is only read with a kd_teacher"),
    (["--task_loss_weight", "0.5"], "task_loss_weight 0.5 is only read with a kd_teacher"),
    (["--kd_teacher", "teacher.ckpt", "--kd_distill_type", "feature", "--kd_temperature", "2"],
     "kd_temperature 2.0 is only read with kd_distill_type logit (kd_distill_type is feature)"),
    # set in a recipe file: the LARS recipe's poly settings with another schedule
    (["--config_path", "configs/resnet50_lars_large_batch.yaml", "--lr_schedule", "step"],
     "lr_end 0.0001 is only read with lr_schedule cosine, linear or poly"),
])
def test_a_key_its_setting_leaves_unread_is_refused_naming_both(argv, message, tmp_path):
    cfg = parse_config(argv + ["--data_path", str(tmp_path)])
    for check in (lambda c: check_unused_keys(c, "train"), check_train_config):
        with pytest.raises(ConfigError) as err:
            check(cfg)
        assert str(err.value).startswith(message), str(err.value)


@pytest.mark.parametrize("argv", [
    ["--lr_schedule", "step", "--lr_end", "0"],  # set, but to the default: nothing ignored
    ["--lr_schedule", "step", "--lr_decay_epochs", "10,20", "--lr_decay_factor", "0.5"],
    ["--lr_schedule", "poly", "--lr_end", "1e-4", "--lr_poly_power", "3"],
    ["--lr_schedule", "linear", "--lr_end", "1e-4"],
    ["--kd_teacher", "teacher.ckpt", "--kd_net_name", "resnet50", "--kd_temperature", "2",
     "--task_loss_weight", "0.5"],
    ["--kd_teacher", "teacher.ckpt", "--kd_distill_type", "feature"],
    ["--kd_temperature", "4.0", "--kd_net_name", ""],  # the defaults, given
    ["--cam_class", "3"]])  # predict's key: train.py does not read it
def test_keys_read_with_their_setting_pass(argv):
    check_unused_keys(parse_config(argv), "train")


def test_cam_class_without_cam_dir_is_refused_by_predict():
    cfg = parse_config(["--cam_class", "3"])
    with pytest.raises(ConfigError, match=r"^cam_class 3 is only read with a cam_dir \(cam_dir "
                                          r"is empty\): use a cam_dir, or leave cam_class at "
                                          r"its default -1$"):
        check_unused_keys(cfg, "predict")
    check_unused_keys(parse_config(["--cam_class", "3", "--cam_dir", "cams"]), "predict")
    check_unused_keys(parse_config(["--lr_schedule", "step", "--lr_end", "0.1"]), "predict")


@pytest.fixture
def check_warnings():
    """The records ``src.recipe.checks`` logs (whatever the handlers of ``src``)."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("src.recipe.checks")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def test_min_delta_without_patience_is_one_warning_not_a_refusal(check_warnings):
    """A resumed run may turn early stopping off with patience 0 (docs/training.md) while its
    command still gives the min_delta: warned, not refused."""
    check_unused_keys(parse_config(["--early_stopping_min_delta", "0.001"]), "train")
    assert [r.getMessage() for r in check_warnings] == [
        "early_stopping_min_delta 0.001 is only read with early_stopping_patience above 0 "
        "(early_stopping_patience is 0): it is ignored"]
    check_unused_keys(parse_config(["--early_stopping_min_delta", "0.001",
                                    "--early_stopping_patience", "3"]), "train")
    check_unused_keys(parse_config(["--early_stopping_min_delta", "0.0"]), "train")
    assert len(check_warnings) == 1


@pytest.mark.parametrize("path", ["config.yaml"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "configs", "*.yaml"))))
def test_every_shipped_recipe_passes(path, check_warnings):
    cfg = parse_config([] if path == "config.yaml" else ["--config_path", path])
    for reader in ("train", "eval", "predict"):
        check_unused_keys(cfg, reader)
    assert check_warnings == []


def test_a_runs_written_config_passes(tmp_path, check_warnings):
    """A run's config.yaml sets every key (each a user key when read back): those at their
    defaults are not "set"."""
    written = tmp_path / "config.yaml"
    written.write_text(parse_config(["--config_path", "configs/quick_start.yaml",
                                     "--lr_schedule", "step"]).to_yaml())
    cfg = parse_config(["--config_path", str(written)])
    assert "lr_end" in cfg.user_keys and "kd_temperature" in cfg.user_keys
    for reader in ("train", "eval", "predict"):
        check_unused_keys(cfg, reader)
    assert check_warnings == []


def test_every_row_names_config_keys():
    defaults, _, _ = load_schema()
    assert [r for r in UNUSED_KEYS if r.key not in defaults or r.needed not in defaults] == []
    assert {r.reader for r in UNUSED_KEYS} == {"train", "eval", "predict"}


def test_train_exits_2_before_reading_data(tmp_path):
    result = run_in_process("train.py", "--config_path", "configs/quick_start.yaml",
                            "--data_path", tmp_path / "no_data", "--output_dir", tmp_path / "out",
                            "--lr_schedule", "step", "--lr_end", "0.001")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "error: lr_end 0.001 is only read with lr_schedule cosine, linear or poly" \
           in result.stderr
    assert "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "out")
