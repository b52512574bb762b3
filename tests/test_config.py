"""Config loading: override order, unknown keys, wrong types, --help; the generated
configuration page (docs/configuration.md) is up to date."""
import pytest

from src.utils.config import DEFAULT_CONFIG, ConfigError, load_schema, parse_config
from tests.helpers import run_entry, run_in_process
from tools.gen_config_docs import CODE_RANGES, PAGE, markdown_text, read_page, render
from tools.gen_config_docs import main as gen_config_docs


def write(tmp_path, text):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_are_the_nvidia_recipe():
    cfg = parse_config([])
    assert cfg.net_name == "resnet50" and cfg.class_num == 1000
    assert cfg.batch_size == 256 and cfg.epoch_size == 90
    assert cfg.optimizer == "momentum" and cfg.momentum is None  # its declared 0.875
    assert cfg.base_lr == 0.256 and cfg.base_lr_batch_size == 256
    assert cfg.weight_decay == 1 / 32768
    assert cfg.warmup_epochs == 8 and cfg.lr_schedule == "cosine" and cfg.lr_end == 0.0
    assert cfg.label_smoothing == 0.1
    assert (cfg.train_image_size, cfg.eval_image_size, cfg.eval_resize) == (224, 224, 256)
    assert cfg.all_reduce_fusion_config == []  # for the network: ResNet-50 [85, 160]
    assert (cfg.save_checkpoint_epochs, cfg.keep_checkpoint_max) == (5, 10)


def test_override_order_file_then_command_line(tmp_path):
    recipe = write(tmp_path, "batch_size: 64\nepoch_size: 3\n")
    cfg = parse_config(["--config_path", recipe, "--batch_size", "16"])
    assert cfg.batch_size == 16  # command line beats the recipe file
    assert cfg.epoch_size == 3  # recipe file beats config.yaml
    assert cfg.base_lr == 0.256  # untouched keys keep config.yaml's value


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
                                       ("all_reduce_fusion_config", "a,b"),
                                       ("lr_decay_epochs", "[30"), ("lr_decay_epochs", "1:20")])
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
    """Each entry point's ``--help`` lists exactly the keys of the sections it reads, under the
    sections' titles (train.py: its checkpoint keys, no export key; eval.py: no training key)."""
    import importlib
    import re

    from src.utils.config import read_sections
    defaults, helps, _ = load_schema()
    assert set(defaults) == set(helps)
    sections = read_sections()
    assert sorted(k for keys in sections.values() for k in keys) == sorted(defaults)
    listed_somewhere, helps = set(), {}
    for script in ("train", "eval", "export", "predict", "serve", "label_issues"):
        # a fresh interpreter: the fast tier's one full start of each entry point (import
        # order, start-up), docs/tests.md; label_issues.py's is its end-to-end run (slow)
        if script == "label_issues":
            result = run_in_process(f"{script}.py", "--help")
        else:
            result = run_entry(f"{script}.py", "--help", timeout=120)
        assert result.returncode == 0, result.stderr
        helps[script] = result.stdout
        listed = set(re.findall(r"^  --(\w+)", result.stdout, re.M)) - {"config_path", "help"}
        wanted = {k for name in importlib.import_module(script).SECTIONS for k in sections[name]}
        assert listed == wanted, script
        listed_somewhere |= listed
    assert listed_somewhere == set(defaults)
    train_help, eval_help = helps["train"], helps["eval"]
    assert "training checkpoints:" in train_help and "--resume_ckpt" in train_help
    assert "--file_format" not in train_help
    assert "--checkpoint_path" in eval_help and "--data_path" in eval_help
    for key in ("--epoch_size", "--base_lr", "--resume_ckpt", "--file_format"):
        assert key not in eval_help, key


def test_recipes_in_configs_folder_load():
    import glob
    import os

    from src.utils.config import ROOT
    recipes = glob.glob(os.path.join(ROOT, "configs", "*.yaml"))
    assert recipes
    for recipe in recipes:
        parse_config(["--config_path", recipe])


def test_configuration_page_is_up_to_date():
    assert read_page(PAGE) == render(), \
        "docs/configuration.md is out of date: run python tools/gen_config_docs.py"


def test_configuration_page_documents_every_key_with_its_meaning():
    page = read_page(PAGE)
    defaults, helps, _ = load_schema()
    rows = {line.split(" | ")[0]: line for line in page.splitlines() if line.startswith("| `")}
    assert [k for k in defaults if f"| `{k}`" not in rows] == []
    assert [k for k in defaults if f" | {markdown_text(helps[k])} | " not in rows[f"| `{k}`"]] == []


def test_changed_meaning_makes_the_page_out_of_date(tmp_path, capsys):
    with open(DEFAULT_CONFIG, encoding="utf-8") as f:
        text = f.read()
    changed = text.replace('net_name: "network architecture"', 'net_name: "the network"')
    assert changed != text
    schema = tmp_path / "config.yaml"
    schema.write_text(changed, encoding="utf-8")
    assert render(str(schema)) != read_page(PAGE)
    assert gen_config_docs(["--check", "--config", str(schema)]) == 1
    assert "docs/configuration.md is out of date" in capsys.readouterr().err
    page = tmp_path / "configuration.md"
    assert gen_config_docs(["--config", str(schema), "--output", str(page)]) == 0
    assert "| `net_name` | `resnet50` | the network |" in page.read_text(encoding="utf-8")
    assert gen_config_docs(["--check", "--config", str(schema), "--output", str(page)]) == 0
    # written through a temporary file that os.replace renamed: nothing else is left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "configuration.md"]


CODE_RANGE_VIOLATIONS = {"scale_factor": "1", "randaugment_num_ops": "4",
                         "randaugment_magnitude": "31", "train_crop_scale": "0.5,0.4"}
"""A value just outside each range the page takes from check_values' code (CODE_RANGES)."""


def test_ranges_the_page_states_from_code_are_checked():
    assert set(CODE_RANGE_VIOLATIONS) == set(CODE_RANGES)
    for key, value in CODE_RANGE_VIOLATIONS.items():
        with pytest.raises(ConfigError, match=key):
            parse_config([f"--{key}", value])


@pytest.mark.parametrize("key, value", [("base_lr", "nan"), ("base_lr", "inf"),
                                        ("weight_decay", "-inf"), ("label_smoothing", "nan"),
                                        ("train_crop_scale", "0.08,nan")])
def test_non_finite_floats_are_refused_naming_the_key(key, value):
    # nan passes every comparison-based range check (nan <= 0 is false)
    with pytest.raises(ConfigError, match=f"{key} must (be a finite number|hold finite)"):
        parse_config([f"--{key}={value}"])


def test_a_recipe_that_is_not_utf8_is_named(tmp_path):
    recipe = tmp_path / "latin1.yaml"
    recipe.write_bytes("base_lr: 0.1\n# café\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="latin1.yaml: not UTF-8 text \\(byte 0xe9"):
        parse_config(["--config_path", str(recipe)])


@pytest.mark.parametrize("image_size, side", [(32, 1), (33, 2), (224, 7), (17, 1)])
def test_last_feature_map_side_matches_the_network(image_size, side):
    import mindspore as ms
    import numpy as np

    from src.models.resnet import create_network, last_feature_map_side
    net = create_network("resnet18", class_num=10)
    stem = ms.nn.SequentialCell([net.conv1, net.bn1, net.relu, net.maxpool, net.layer1,
                                 net.layer2, net.layer3, net.layer4])
    stem.set_train(False)
    out = stem(ms.Tensor(np.zeros((1, 3, image_size, image_size), np.float32)))
    assert last_feature_map_side(image_size) == side == out.shape[-1]


def test_one_value_per_channel_in_a_training_batchnorm_is_refused():
    from src.recipe import check_train_config
    cfg = parse_config(["--config_path", "configs/quick_start.yaml", "--batch_size", "1"])
    with pytest.raises(ConfigError, match="batch_size 1 at train_image_size 32: the last "
                                          "stage's feature map is 1x1"):
        check_train_config(cfg)
    check_train_config(parse_config(["--config_path", "configs/quick_start.yaml",
                                     "--batch_size", "2"]))
    check_train_config(parse_config(["--config_path", "configs/quick_start.yaml",
                                     "--batch_size", "1", "--train_image_size", "64"]))


def test_trainable_layers_limit_is_the_networks_stage_count():
    # the limit lives in src.utils (the config check cannot import src.models); the network's
    # stages that can train must number exactly that
    from src.models.freeze import STAGES_LAST_FIRST
    from src.utils.limits import MAX_TRAINABLE_LAYERS
    assert MAX_TRAINABLE_LAYERS == len(STAGES_LAST_FIRST)


# ---- numbers in YAML files read as on the command line (YAML 1.2, not PyYAML's 1.1) ----

@pytest.mark.parametrize("text, flag, key, value", [
    ("epoch_size: 010\n", "010", "epoch_size", 10),  # YAML 1.1: octal 8
    ("lr_decay_epochs: [010, 020]\n", "010,020", "lr_decay_epochs", [10, 20]),
    ("base_lr: -.5e1\n", "-.5e1", "lr_end", None),  # a 1.2 float, not a string
    ("weight_decay: 1e-4\n", "1e-4", "weight_decay", 1e-4)])
def test_yaml_numbers_read_as_the_command_line_reads_them(tmp_path, text, flag, key, value):
    if value is None:  # a negative base_lr: the same refusal from the file and the flag
        with pytest.raises(ConfigError, match="base_lr must be positive, got -5.0"):
            parse_config(["--config_path", write(tmp_path, text)])
        return
    from_file = parse_config(["--config_path", write(tmp_path, text)])[key]
    assert from_file == parse_config([f"--{key}", flag])[key] == value


@pytest.mark.parametrize("text", ["seed: 1:20\n", "seed: 0x10\n", "seed: 0o17\n", "seed: 0b11\n"])
def test_yaml_11_only_integers_are_refused_naming_file_key_and_value(tmp_path, text):
    # YAML 1.1 reads 1:20 as 80 (base 60), 0x10 as 16; the command line refuses each
    shown = text.split(": ")[1].strip()
    with pytest.raises(ConfigError, match=f"recipe.yaml: key 'seed' expects an integer, "
                                          f"got '{shown}'"):
        parse_config(["--config_path", write(tmp_path, text)])
    with pytest.raises(ConfigError, match="command line: key 'seed' expects an integer"):
        parse_config(["--seed", shown])
    if shown == "1:20":  # one case in a process: one line, exit status 2
        result = run_entry("train.py", "--config_path", write(tmp_path, text), timeout=120)
        assert result.returncode == 2 and "key 'seed' expects an integer" in result.stderr
        assert "Traceback" not in result.stderr


def test_a_runs_written_config_reads_back_as_written(tmp_path):
    # strings that look like numbers in either YAML version are quoted in output_dir/config.yaml
    cfg = parse_config(["--file_name", "1e5", "--output_dir", "010", "--split_file", "1:20"])
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml())
    again = parse_config(["--config_path", str(path)])
    assert {k: again[k] for k in cfg if k != "config_path"} == {
        k: cfg[k] for k in cfg if k != "config_path"}


def test_a_float_list_item_beyond_float32_is_named():
    # the [0, 1] check of train_crop_scale would refuse it too, in other words
    with pytest.raises(ConfigError, match=r"train_crop_scale must hold numbers of at most "
                                          r"3\.40\d+e\+38 in magnitude \(float32\)"):
        parse_config(["--train_crop_scale", "0.08,1e39"])


@pytest.mark.parametrize("text, count", [
    ("epoch_size: 3\n---\nepoch_size: text\n", 2),  # strings like help texts, no choices
    ("epoch_size: 3\n---\nepoch_size: text\n---\nepoch_size: 4\n", 3),  # choices not lists
    ("epoch_size: 3\n---\nepoch_size: 4\n---\nepoch_size: [4]\n", 3)])  # help not strings
def test_documents_not_in_the_schema_layout_are_refused(tmp_path, text, count):
    with pytest.raises(ConfigError, match=f"recipe.yaml holds {count} YAML documents"):
        parse_config(["--config_path", write(tmp_path, text)])


def test_a_schema_without_three_documents_is_named(tmp_path):
    path = write(tmp_path, "epoch_size: 3\n---\nepoch_size: help\n")
    with pytest.raises(ConfigError, match="expected 3 YAML documents .* found 2"):
        load_schema(path)


def test_a_config_is_read_only_and_resolves_into_new_ones():
    """Every write is refused (so no resolver can write back into the parsed config); a key
    is resolved into a new config that keeps the user's keys and the defaults; copies and
    pickles are Configs with the same user keys."""
    import copy
    import pickle

    cfg = parse_config(["--batch_size", "8"])
    writes = (lambda: cfg.__setitem__("batch_size", 4), lambda: cfg.update(batch_size=4),
              lambda: setattr(cfg, "batch_size", 4), lambda: cfg.pop("batch_size"),
              lambda: cfg.setdefault("x", 1), lambda: cfg.clear(),
              lambda: cfg.__delitem__("batch_size"), lambda: setattr(cfg, "user_keys", set()))
    for write in writes:
        with pytest.raises(TypeError, match="read-only.*replaced"):
            write()
    assert cfg.batch_size == 8 and cfg.user_keys == {"batch_size"}
    new = cfg.replaced(batch_size=4)
    assert (new.batch_size, cfg.batch_size) == (4, 8)
    assert new.user_keys == cfg.user_keys and new.defaults is cfg.defaults
    dropped = cfg.replaced(user_keys=frozenset(), batch_size=cfg.defaults["batch_size"])
    assert dropped.user_value("batch_size") is None and cfg.user_value("batch_size") == 8
    for again in (copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg)), copy.copy(cfg)):
        assert type(again) is type(cfg) and again == cfg and again.user_keys == cfg.user_keys
        assert again.defaults == cfg.defaults
