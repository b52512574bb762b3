"""The optimizer hyperparameters of the config (``momentum``, ``beta1``, ``beta2``, ``eps``,
``trust_coeff``): null in config.yaml, so each optimizer trains at its declared default
(``OPTIMIZERS``) unless the run sets one; only the chosen optimizer's keys are passed, and one
set for an optimizer that does not take it is refused by name. Values are read from the
optimizer the recipe builds (``build_train_step`` of ``step_recipe``), as train.py builds it."""
import glob
import os

import mindspore.nn as nn
import numpy as np
import pytest

from src.recipe import check_optimizer_keys, check_train_config, optimizer_kwargs, step_recipe
from src.training.model import build_train_step
from src.training.optimizer import HYPERPARAMETERS, OPTIMIZERS
from src.utils.config import NULL_DEFAULT_TYPES, ConfigError, load_schema, parse_config
from tests.helpers import ROOT, run_in_process


class Tiny(nn.Cell):
    """A Dense(4, 3): a decayed weight and a bias, enough for every optimizer's groups."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 3)

    def construct(self, x):
        return self.fc(x)


def built_values(cfg):
    """The hyperparameters of the optimizer train.py builds for ``cfg``, as float32 values
    read from it: (its class name, {name: value})."""
    optimizer = build_train_step(Tiny(), 0.1, step_recipe(cfg, "O0")).optimizer
    values = {name: float(getattr(optimizer, name).asnumpy().reshape(-1)[0])
              for name in HYPERPARAMETERS if hasattr(getattr(optimizer, name, None), "asnumpy")}
    return type(optimizer).__name__, values


def f32(values):
    return {k: float(np.float32(v)) for k, v in values.items()}


# Each shipped recipe's optimizer as it trained before the keys defaulted to null.
MOMENTUM_0875 = ("Momentum", {"momentum": 0.875})
RECIPES = {
    "config.yaml": MOMENTUM_0875,
    "multilabel_quick_start.yaml": MOMENTUM_0875,
    "quick_start.yaml": MOMENTUM_0875,
    "resnet101_imagenet.yaml": MOMENTUM_0875,
    "resnet152_imagenet.yaml": MOMENTUM_0875,
    "resnet18_cifar10.yaml": MOMENTUM_0875,
    "resnet18_cifar10_v2.yaml": MOMENTUM_0875,
    "resnet18_imagenet.yaml": MOMENTUM_0875,
    "resnet34_imagenet.yaml": MOMENTUM_0875,
    "resnet50_finetune.yaml": ("Momentum", {"momentum": 0.9}),
    "resnet50_lars_large_batch.yaml": ("Lars", {"momentum": 0.9, "eps": 1e-7,
                                                "trust_coeff": 0.001}),
    "resnet50_multilabel_finetune.yaml": ("Momentum", {"momentum": 0.9}),
    "resnet50_nvidia_250ep.yaml": MOMENTUM_0875,
    "resnet50_rsb_a2.yaml": ("Lamb", {"beta1": 0.9, "beta2": 0.999, "eps": 1e-6}),
    "resnet50_rsb_a3.yaml": ("Lamb", {"beta1": 0.9, "beta2": 0.999, "eps": 1e-6}),
    "resnet50_torchvision_v2.yaml": ("Momentum", {"momentum": 0.9}),
}


def test_every_shipped_recipe_is_listed():
    assert sorted(RECIPES) == sorted(["config.yaml"] + [
        os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "configs", "*.yaml"))])


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_trains_with_its_values_of_before(name):
    """config.yaml (NVIDIA's recipe: SGD at momentum 0.875) and every recipe of configs/ build
    the optimizer they built when config.yaml set every key."""
    argv = [] if name == "config.yaml" else ["--config_path", os.path.join(ROOT, "configs", name)]
    kind, values = RECIPES[name]
    assert built_values(parse_config(argv)) == (kind, f32(values))


def test_the_default_recipe_trains_sgd_at_momentum_0875():
    kind, values = built_values(parse_config([]))
    assert kind == "Momentum" and values == {"momentum": 0.875}


@pytest.mark.parametrize("argv, momentum", [
    (["--optimizer", "lars"], 0.9),  # LARS's declared default (MLPerf), not SGD's 0.875
    (["--optimizer", "lars", "--momentum", "0.8"], 0.8),
    (["--optimizer", "lars", "--momentum", "0"], 0.0),
    # a recipe's momentum unset again on the command line: the optimizer's own
    (["--config_path", "configs/resnet50_finetune.yaml", "--momentum", "null"], 0.875),
    (["--config_path", "configs/resnet50_finetune.yaml", "--optimizer", "lars",
      "--momentum", "null"], 0.9)])
def test_lars_trains_at_its_declared_momentum_unless_one_is_set(argv, momentum):
    _, values = built_values(parse_config(argv))
    assert values["momentum"] == float(np.float32(momentum))


@pytest.mark.parametrize("argv", [
    [], ["--optimizer", "adamw"], ["--optimizer", "lamb", "--eps", "1e-6"],
    ["--optimizer", "lars", "--eps", "1e-7"], ["--config_path", "configs/resnet50_rsb_a2.yaml"]])
def test_only_the_chosen_optimizers_keys_that_are_set_are_passed(argv):
    cfg = parse_config(argv)
    kwargs = optimizer_kwargs(cfg)
    passed = {k: v for k, v in kwargs.items() if k in HYPERPARAMETERS}
    assert passed == {k: cfg[k] for k in OPTIMIZERS[cfg.optimizer].hyperparameters
                      if cfg[k] is not None}
    assert None not in passed.values()
    assert set(kwargs) - set(passed) == {"optimizer", "weight_decay", "layer_decay",
                                         "head_lr_scale"}


@pytest.mark.parametrize("argv, key, optimizer, takes", [
    (["--optimizer", "adamw", "--momentum", "0.9"], "momentum", "adamw", "beta1, beta2, eps"),
    (["--optimizer", "momentum", "--beta1", "0.8"], "beta1", "momentum", "momentum"),
    (["--optimizer", "lars", "--beta2", "0.99"], "beta2", "lars", "momentum, eps, trust_coeff"),
    (["--optimizer", "lamb", "--trust_coeff", "0.01"], "trust_coeff", "lamb",
     "beta1, beta2, eps"),
    (["--optimizer", "momentum", "--eps", "1e-7"], "eps", "momentum", "momentum"),
    # set by a recipe file: the LARS recipe's eps with another optimizer
    (["--config_path", "configs/resnet50_lars_large_batch.yaml", "--optimizer", "momentum"],
     "eps", "momentum", "momentum"),
    (["--config_path", "configs/resnet50_rsb_a3.yaml", "--optimizer", "lars"], "beta1", "lars",
     "momentum, eps, trust_coeff")])
def test_a_key_the_optimizer_does_not_take_is_refused_by_name(argv, key, optimizer, takes,
                                                              tmp_path):
    cfg = parse_config(argv + ["--data_path", str(tmp_path)])
    for check in (check_optimizer_keys, check_train_config, optimizer_kwargs):
        with pytest.raises(ConfigError) as err:
            check(cfg)
        message = str(err.value)
        assert message.startswith(f"{key} {cfg[key]} is set but optimizer {optimizer} does not "
                                  f"take it (it takes {takes})"), message
        assert f"leave {key} unset (null)" in message


def test_train_exits_2_on_a_key_the_optimizer_does_not_take(tmp_path):
    """Refused by the config check, before any data is read (data_path does not exist)."""
    result = run_in_process("train.py", "--config_path", "configs/quick_start.yaml",
                            "--data_path", tmp_path / "no_data", "--output_dir", tmp_path / "out",
                            "--optimizer", "adamw", "--momentum", "0.9")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "error: momentum 0.9 is set but optimizer adamw does not take it (it takes beta1, " \
           "beta2, eps)" in result.stderr
    assert "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "out")


def test_config_yaml_leaves_every_hyperparameter_null_and_states_the_defaults():
    """config.yaml: each key of ``HYPERPARAMETERS`` defaults to null, typed by
    ``NULL_DEFAULT_TYPES``; its help text gives each optimizer's declared default."""
    defaults, helps, _ = load_schema()
    assert {k for k, v in defaults.items() if v is None} == set(HYPERPARAMETERS)
    assert set(NULL_DEFAULT_TYPES) == set(HYPERPARAMETERS)
    for name, info in OPTIMIZERS.items():
        for key, default in info.hyperparameters.items():
            assert f"{name} {default:g}" in helps[key], (key, name)


@pytest.mark.parametrize("text, value", [("null", None), ("~", None), ("NULL", None),
                                         ("0.5", 0.5), ("1e-7", 1e-7)])
def test_a_null_key_takes_null_or_a_number(text, value):
    assert parse_config(["--eps", text, "--optimizer", "adamw"]).eps == value


def test_a_null_key_refuses_text():
    with pytest.raises(ConfigError, match="key 'beta1' expects a number or null, got 'high'"):
        parse_config(["--beta1", "high"])


def test_create_optimizer_takes_the_declared_default_for_none():
    from src.training.optimizer import create_optimizer
    optimizer = create_optimizer(Tiny(), 0.1, None, optimizer="adamw", beta1=None, beta2=0.99,
                                 eps=None)
    assert [float(optimizer.beta1.asnumpy()[0]), float(optimizer.beta2.asnumpy()[0]),
            float(optimizer.eps.asnumpy()[0])] == [float(np.float32(v)) for v in (0.9, 0.99, 1e-8)]
