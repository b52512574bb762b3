"""Recipe files (``--config_path``) are read whole or refused: a second YAML document or a key
given twice is an error naming it; a copy of config.yaml and a run's written config.yaml
load."""
import os

import pytest

from src.utils.config import DEFAULT_CONFIG, ConfigError, parse_config


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
