"""Config loading: override order, unknown keys, wrong types, --help."""
import pytest

from src.utils.config import ConfigError, load_schema, parse_config
from tests.helpers import run_entry


def write(tmp_path, text):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_are_the_nvidia_recipe():
    cfg = parse_config([])
    assert cfg.net_name == "resnet50" and cfg.class_num == 1000
    assert cfg.batch_size == 256 and cfg.epoch_size == 90
    assert cfg.momentum == 0.875 and cfg.base_lr == 0.256 and cfg.base_lr_batch_size == 256
    assert cfg.weight_decay == 1 / 32768
    assert cfg.warmup_epochs == 8 and cfg.lr_schedule == "cosine" and cfg.lr_end == 0.0
    assert cfg.label_smoothing == 0.1
    assert (cfg.train_image_size, cfg.eval_image_size, cfg.eval_resize) == (224, 224, 256)
    assert cfg.all_reduce_fusion_config == [85, 160]
    assert (cfg.save_checkpoint_epochs, cfg.keep_checkpoint_max) == (5, 10)


def test_override_order_file_then_command_line(tmp_path):
    recipe = write(tmp_path, "batch_size: 64\nepoch_size: 3\n")
    cfg = parse_config(["--config_path", recipe, "--batch_size", "16"])
    assert cfg.batch_size == 16  # command line beats the recipe file
    assert cfg.epoch_size == 3  # recipe file beats config.yaml
    assert cfg.momentum == 0.875  # untouched keys keep config.yaml's value


def test_types_are_parsed_from_the_command_line():
    cfg = parse_config(["--base_lr", "1e-3", "--run_eval", "true", "--lr_end", "0",
                        "--all_reduce_fusion_config", "10,20", "--train_crop_scale", "0.5,1"])
    assert cfg.base_lr == 1e-3 and cfg.run_eval is True and cfg.lr_end == 0.0
    assert cfg.all_reduce_fusion_config == [10, 20]
    assert cfg.train_crop_scale == [0.5, 1.0]


def test_yaml_exponent_string_is_read_as_float(tmp_path):
    # PyYAML reads 1e-4 (no dot) as a string; a float key must still accept it.
    cfg = parse_config(["--config_path", write(tmp_path, "weight_decay: 1e-4\n")])
    assert cfg.weight_decay == 1e-4


def test_unknown_key_in_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key 'batchsize'"):
        parse_config(["--config_path", write(tmp_path, "batchsize: 32\n")])


def test_unknown_flag_is_named(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--batchsize", "32"])
    assert "--batchsize" in capsys.readouterr().err


@pytest.mark.parametrize("key,value", [("batch_size", "large"), ("batch_size", "3.5"),
                                       ("base_lr", "fast"), ("run_eval", "maybe"),
                                       ("all_reduce_fusion_config", "a,b")])
def test_wrong_type_on_command_line_is_named(key, value):
    with pytest.raises(ConfigError, match=f"'{key}' expects"):
        parse_config([f"--{key}", value])


@pytest.mark.parametrize("text,key", [("batch_size: 3.5\n", "batch_size"),
                                      ("run_eval: 1\n", "run_eval"),
                                      ("net_name: 50\n", "net_name"),
                                      ("all_reduce_fusion_config: 85\n",
                                       "all_reduce_fusion_config")])
def test_wrong_type_in_file_is_named(tmp_path, text, key):
    with pytest.raises(ConfigError, match=f"recipe.yaml: key '{key}' expects"):
        parse_config(["--config_path", write(tmp_path, text)])


def test_value_outside_choices_is_named():
    with pytest.raises(ConfigError, match="'device_target' must be one of"):
        parse_config(["--device_target", "TPU"])


def test_every_key_has_help_and_each_entry_point_lists_its_sections():
    import importlib
    import re

    from src.utils.config import read_sections
    defaults, helps, _ = load_schema()
    assert set(defaults) == set(helps)
    sections = read_sections()
    assert sorted(k for keys in sections.values() for k in keys) == sorted(defaults)
    listed_somewhere = set()
    for script in ("train", "eval", "export", "predict"):
        result = run_entry(f"{script}.py", "--help", timeout=120)
        assert result.returncode == 0
        listed = set(re.findall(r"^  --(\w+)", result.stdout, re.M)) - {"config_path", "help"}
        wanted = {k for name in importlib.import_module(script).SECTIONS for k in sections[name]}
        assert listed == wanted, script
        listed_somewhere |= listed
    assert listed_somewhere == set(defaults)


def test_recipes_in_configs_folder_load():
    import glob
    import os

    from src.utils.config import ROOT
    recipes = glob.glob(os.path.join(ROOT, "configs", "*.yaml"))
    assert recipes
    for recipe in recipes:
        parse_config(["--config_path", recipe])


def test_readme_documents_every_key():
    import os

    from src.utils.config import ROOT
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    defaults, _, _ = load_schema()
    assert [k for k in defaults if f"| `{k}` |" not in readme] == []
