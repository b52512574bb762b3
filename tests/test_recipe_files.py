"""Recipe files (``--config_path``) are read whole or refused: a second YAML document or a key
given twice is an error naming it; a copy of config.yaml and a run's written config.yaml
load; the LARS recipe holds the MLPerf reference's values.
"""
import os

import pytest

from src.training.lr_schedule import LR_KEYS, create_lr
from src.utils.config import DEFAULT_CONFIG, ROOT, ConfigError, parse_config


def write(tmp_path, text, name="recipe.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("text, message", [
    ("batch_size: 64\n---\nepoch_size: 3\n",
     r"recipe.yaml holds 2 YAML documents \(the second starts at line 3\): a recipe is one "
     r"document of key: value lines, only the first would be read; merge them into one$"),
    ("seed: 1\nbatch_size: 64\nseed: 7\n",
     r"recipe.yaml: key 'seed' is given twice \(lines 1 and 3\): keep one"),
])
def test_a_recipe_read_in_part_is_refused_naming_where(tmp_path, text, message):
    """A second document used to be dropped, a key's first value overridden by its second:
    both silently."""
    with pytest.raises(ConfigError, match=message):
        parse_config(["--config_path", write(tmp_path, text)])


def test_a_copy_of_config_yaml_is_accepted(tmp_path):
    """Its second and third documents are the help texts and choices, not overrides."""
    with open(DEFAULT_CONFIG, encoding="utf-8") as f:
        text = f.read().replace("epoch_size: 90\n", "epoch_size: 3\n", 1)
    assert parse_config(["--config_path", write(tmp_path, text)]).epoch_size == 3


def test_a_merge_key_may_be_overridden(tmp_path):
    """YAML's merge key (<<) is not a duplicate: the mapping's own keys override it."""
    from src.utils.config import _read_yaml_documents
    path = write(tmp_path, "base: &b {seed: 1, batch_size: 8}\nrun:\n  <<: *b\n  seed: 7\n")
    assert _read_yaml_documents(path)[0]["run"] == {"seed": 7, "batch_size": 8}


def test_a_runs_written_config_is_accepted_as_a_recipe(tmp_path):
    """A run's config.yaml (Config.to_yaml) holds config_path too: re-running a run from it."""
    first = parse_config(["--config_path", "configs/quick_start.yaml", "--seed", "5"])
    written = write(tmp_path, first.to_yaml(), "config.yaml")
    again = parse_config(["--config_path", written])
    assert {k: v for k, v in again.items() if k != "config_path"} == \
        {k: v for k, v in first.items() if k != "config_path"}
    assert again.config_path == written and "config_path" not in again.user_keys
    assert os.path.isfile(written)


def test_the_lars_recipe_parses_to_the_mlperf_reference_values():
    """configs/resnet50_lars_large_batch.yaml validates and gives the MLPerf v1.0 reference's
    TPU-v3-64 run: LARS (eta 0.001, eps 1e-7), momentum 0.9, weight decay 2e-4, label
    smoothing 0.1, 42 epochs; on 64 devices a global batch of 4096 and LR 10 after 5 warmup
    epochs, decaying with power 2 towards 1e-4."""
    path = os.path.join(ROOT, "configs", "resnet50_lars_large_batch.yaml")
    cfg = parse_config(["--config_path", path])
    expected = {"net_name": "resnet50", "optimizer": "lars", "trust_coeff": 0.001, "eps": 1e-7,
                "momentum": 0.9, "weight_decay": 2e-4, "label_smoothing": 0.1,
                "epoch_size": 42, "lr_schedule": "poly", "warmup_epochs": 5, "lr_end": 1e-4,
                "lr_poly_power": 2.0, "train_crop_scale": [0.05, 1.0]}
    assert {k: cfg[k] for k in expected} == expected
    steps = 1281167 // (64 * cfg.batch_size)  # ImageNet's training images, 64 devices
    lr, peak = create_lr(**{k: cfg[k] for k in LR_KEYS}, global_batch_size=64 * cfg.batch_size,
                         steps_per_epoch=steps)
    assert 64 * cfg.batch_size == 4096 and peak == 10.0 and lr.shape == (42 * steps,)
    assert lr[5 * steps] == pytest.approx(10.0) and lr[-1] == pytest.approx(1e-4, abs=1e-4)
    header = open(path, encoding="utf-8").read()
    assert "75.9%" in header and "Source: MLPerf Training v1.0 reference" in header
