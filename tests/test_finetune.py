"""Fine-tuning: frozen stages (trainable_layers) and frozen BatchNorm stay bit-identical through
a run, layer-wise LR decay and the head's LR multiple give timm's LR per group, LP-FT trains
only fc first and resumes exactly on either side of its switch, bad values are named."""
import glob
import os
import re

import mindspore as ms
import numpy as np
import pytest

from src.models.freeze import set_trainable_layers
from src.models.resnet import create_network
from src.training.optimizer import create_optimizer
from src.utils.config import ConfigError, parse_config
from tests.helpers import run_in_process, train_in_process

# ResNet-18 at 32 px on 80 real CIFAR-10 images (cifar_small), batch 8: 10 steps per epoch.
ARGS = ["--config_path", "configs/quick_start.yaml", "--batch_size", "8",
        "--run_eval", "false", "--num_parallel_workers", "2", "--log_interval", "5",
        "--save_checkpoint_epochs", "1", "--keep_checkpoint_max", "10",
        "--weight_decay", "1e-3", "--ema_decay", "0.9"]
STATISTICS = (".moving_mean", ".moving_variance")


def run_train(data, out, *extra):
    """train.py with ``ARGS`` in the test process (no run here needs a process of its own);
    returns the run's log (its train.log, which holds every line of the run)."""
    assert train_in_process(*ARGS, "--data_path", data, "--output_dir", out, *extra) == 0
    with open(os.path.join(out, "train.log"), encoding="utf-8") as f:
        return f.read()


def load(path):
    return {k: v.asnumpy() for k, v in ms.load_checkpoint(path).items()
            if isinstance(v, ms.Parameter)}


def network_names(params):
    return [n for n in params if n.split(".")[0] in
            ("conv1", "bn1", "layer1", "layer2", "layer3", "layer4", "fc")]


def top(name):
    return name.split(".")[0]


@pytest.fixture(scope="module")
def start(quick_start):
    """Weights of the quick start's run (ResNet-18 trained on the CIFAR-10 sample)."""
    return quick_start["ckpt"]


@pytest.mark.slow
def test_frozen_stages_and_frozen_batchnorm_stay_bit_identical_through_a_run(cifar_small, start,
                                                                             tmp_path):
    out = str(tmp_path / "out")
    log = run_train(cifar_small["train"], out, "--pre_trained", start, "--epoch_size", "1",
                    "--trainable_layers", "1", "--freeze_bn", "true")
    assert re.search(r"trainable_layers 1, BatchNorm frozen: \d+ of 11181642 parameters "
                     r"train \(17 of 62 tensors\)", log), log[-3000:]
    before, after = load(start), load(os.path.join(out, "resnet18-1_10.ckpt"))
    frozen = [n for n in network_names(before) if top(n) not in ("layer4", "fc")]
    trained = [n for n in network_names(before) if top(n) in ("layer4", "fc")]
    for name in frozen:  # weights, BatchNorm gamma/beta and running statistics
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    statistics = [n for n in trained if n.endswith(STATISTICS)]
    assert len(statistics) == 10
    for name in statistics:  # freeze_bn: layer4 keeps its running statistics too
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    changed = [n for n in trained if not np.array_equal(after[n], before[n])]
    assert set(changed) == set(trained) - set(statistics)  # gamma and beta still train
    moments = {n[len("moments."):] for n in after if n.startswith("moments.")}
    assert moments == set(changed)  # no optimizer state for what does not train


def timm_layer_map(names):
    """timm's grouping of a ResNet for layer decay, written from its source:
    ``ResNet.group_matcher(coarse=False)`` is ``stem=r'^conv1|bn1|maxpool'``,
    ``blocks=r'^layer(\\d+)\\.(\\d+)'``; ``group_with_matcher`` orders the groups by their
    match (stem, then blocks by (layer, block)), unmatched names (the head) last."""
    keys = {}
    for name in names:
        if re.match(r"^conv1|bn1|maxpool", name):
            keys[name] = (0,)
        elif match := re.match(r"^layer(\d+)\.(\d+)", name):
            keys[name] = (1, int(match.group(1)), int(match.group(2)))
        else:
            keys[name] = (float("inf"),)
    order = sorted(set(keys.values()))
    return {name: order.index(key) for name, key in keys.items()}


@pytest.mark.parametrize("net_name, layer_decay, head_lr_scale",
                         [("resnet18", 0.7, 1.0), ("resnet50", 0.85, 10.0)])
def test_lr_of_each_group_is_timms_layer_decay(net_name, layer_decay, head_lr_scale):
    net = create_network(net_name, class_num=10)
    set_trainable_layers(net, 3)  # frozen layers still count in the depth, as in timm
    lr = np.linspace(0.1, 0.01, 7).astype(np.float32)
    opt = create_optimizer(net, lr, weight_decay=1e-4, layer_decay=layer_decay,
                           head_lr_scale=head_lr_scale)
    layer_map = timm_layer_map([p.name for p in net.get_parameters()])
    layer_max = max(layer_map.values())
    assert layer_max == {"resnet18": 9, "resnet50": 17}[net_name]  # stem, blocks, fc
    names = [p.name for p in opt.parameters]
    assert names == [p.name for p in net.trainable_params()]
    assert not any(n.startswith(("conv1", "bn1", "layer1")) for n in names)
    for name, group_lr in zip(names, opt.learning_rate):
        scale = layer_decay ** (layer_max - layer_map[name])
        if name.startswith("fc."):
            scale *= head_lr_scale
        expected = (lr.astype(np.float64) * scale).astype(np.float32)
        np.testing.assert_allclose(group_lr.learning_rate.asnumpy(), expected, rtol=1e-7,
                                   err_msg=name)
    decayed = {n for n, wd in zip(names, opt.group_weight_decay) if wd > 0}
    assert decayed == {n for n in names if not n.endswith((".gamma", ".beta", ".bias"))}


@pytest.mark.slow
def test_linear_probe_then_fine_tune_resumes_exactly_on_both_sides_of_the_switch(
        cifar_small, start, tmp_path):
    args = ["--pre_trained", start, "--epoch_size", "2", "--linear_probe_epochs", "1",
            "--trainable_layers", "2", "--layer_decay", "0.8", "--save_checkpoint_steps", "5"]
    full = str(tmp_path / "full")
    log = run_train(cifar_small["train"], full, *args)
    assert "LP-FT: linear probe done after 10 steps" in log
    before = load(start)
    probe = load(os.path.join(full, "resnet18-1_10.ckpt"))
    for name in network_names(before):  # the probe trains fc alone, BatchNorm frozen
        same = np.array_equal(probe[name], before[name])
        assert same == (top(name) != "fc"), name
    assert {n for n in probe if n.startswith("moments.")} == {"moments.fc.weight",
                                                              "moments.fc.bias"}
    tuned = load(os.path.join(full, "resnet18-2_5.ckpt"))
    assert {top(n[len("moments."):]) for n in tuned if n.startswith("moments.")} == {
        "layer3", "layer4", "fc"}
    assert not np.array_equal(tuned["layer3.0.bn1.moving_mean"],
                              probe["layer3.0.bn1.moving_mean"])
    np.testing.assert_array_equal(tuned["layer2.0.conv1.weight"], before["layer2.0.conv1.weight"])
    reference = load(os.path.join(full, "resnet18-2_10.ckpt"))
    for name in ("resnet18-1_10.ckpt", "resnet18-2_5.ckpt"):  # at the switch, and after it
        out = str(tmp_path / name)
        run_train(cifar_small["train"], out, *args, "--resume_ckpt", os.path.join(full, name))
        final = load(os.path.join(out, "resnet18-2_10.ckpt"))
        assert set(final) == set(reference)
        for key, value in reference.items():
            np.testing.assert_array_equal(final[key], value, err_msg=f"{name}: {key}")
    assert len(glob.glob(os.path.join(full, "resnet18-*.ckpt"))) == 4


@pytest.mark.parametrize("key, value, expected", [
    ("trainable_layers", "6", "trainable_layers must be in 0..5"),
    ("trainable_layers", "-1", "trainable_layers must be in 0..5"),
    ("layer_decay", "0", r"layer_decay must be in \(0, 1\]"),
    ("layer_decay", "1.5", r"layer_decay must be in \(0, 1\]"),
    ("head_lr_scale", "0", "head_lr_scale must be positive"),
])
def test_out_of_range_values_are_named(key, value, expected):
    with pytest.raises(ConfigError, match=expected):
        parse_config([f"--{key}", value])


def test_a_linear_probe_as_long_as_the_run_is_refused():
    from src import recipe
    cfg = parse_config(["--data_path", "x", "--epoch_size", "2", "--linear_probe_epochs", "2"])
    with pytest.raises(ConfigError, match="linear_probe_epochs 2 leaves no epoch"):
        recipe.check_train_config(cfg)


def test_frozen_batchnorm_allows_a_batch_of_one_at_32_px():
    from src import recipe
    cfg = parse_config(["--data_path", "x", "--batch_size", "1", "--train_image_size", "32"])
    with pytest.raises(ConfigError, match="freeze_bn true"):
        recipe.check_train_config(cfg)
    recipe.check_train_config(parse_config(["--data_path", "x", "--batch_size", "1",
                                           "--train_image_size", "32", "--freeze_bn", "true"]))


def test_bad_trainable_layers_exits_2_with_the_key_named(tmp_path):
    result = run_in_process("train.py", "--data_path", str(tmp_path), "--trainable_layers", "9")
    assert result.returncode == 2
    assert "trainable_layers must be in 0..5" in result.stderr
    assert "Traceback" not in result.stderr


def test_lp_ft_full_phase_starts_at_the_switch_step_s_lr():
    """The fine-tuning cell LP-FT builds at the switch is given the rest of the run's LR array:
    its first step's LR is ``lr[switch]``, not the warmup's first value again."""
    import logging

    from src.recipe import FineTuning, step_recipe, training_model
    cfg = parse_config(["--config_path", "configs/quick_start.yaml", "--epoch_size", "3",
                        "--linear_probe_epochs", "1", "--trainable_layers", "1",
                        "--ema_decay", "0"])
    lr = np.linspace(0.01, 0.3, 30, dtype=np.float32)
    net = create_network("resnet18", class_num=10)
    recipe = step_recipe(cfg, "O0")
    model, ema = training_model(cfg, net, lr, "O0", recipe)
    tuned = FineTuning(cfg, recipe=recipe, lr=lr, probe_end=10, ema=ema, device_num=1,
                       log=logging.getLogger("test"))(model)
    given = tuned.train_network.optimizer.learning_rate.learning_rate.asnumpy()
    np.testing.assert_array_equal(given, lr[10:])
    assert given[0] == np.float32(lr[10])
