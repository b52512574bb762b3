"""Convergence parity in short, on the real CIFAR-10 images shipped in data/cifar10_sample.

ResNet-18, 40 images per class, batch 40, 2 epochs (20 steps), the recipe of
configs/resnet18_cifar10.yaml at a lower LR (base_lr 0.05: with the recipe's 0.2, so few steps
do not train, and the loss of epoch 2 rises in both frameworks): train.py (seed 1) and the
PyTorch twin (benchmarks/torch_reference_train.py, seeds 1-4) start from the same initial
weights (ours, converted). The twin's data order and augmentation come
from its own random numbers, so ours is one more draw of the twin's seed-to-seed distribution;
the band is measured in the test: the twin's own spread over its seeds. A twin run that forgets
to scale the LR with the batch (a real mistake of this kind) must fall outside that band: the
test can fail. ``pytest -s`` prints the numbers. About a minute on 2 cores.
"""
import json
import math
import os

import numpy as np
import pytest
from PIL import Image

from benchmarks.accuracy_parity import (
    finished_records,
    make_initial_weights,
    parse_args,
    run_training,
    train_args,
)
from src.utils.config import parse_config
from tests.helpers import CIFAR_SAMPLE, copy_class_folders
from tools import plot_metrics

PER_CLASS, BATCH, EPOCHS, BASE_LR = 40, 40, 2, "0.05"
OURS_SEED, TWIN_SEEDS = 1, (1, 2, 3, 4)
# Student's t quantile 0.995 by degrees of freedom (seeds - 1): the two-sided 99% prediction
# interval of one more draw is mean +- t * std * sqrt(1 + 1/seeds) (a mathematical constant).
T_995 = {2: 9.925, 3: 5.841, 4: 4.604, 5: 4.032}
# The negative control: the LR of base_lr at batch 40 without the linear scaling rule.
UNSCALED_LR = ["--base_lr_batch_size", str(BATCH)]


@pytest.fixture(scope="module")
def parity_runs(tmp_path_factory):
    """Every run of the comparison: {"ours": records, ("torch", seed): records, "unscaled":
    records, "seconds": {key: s}, "dirs": {key: output folder}} (records of metrics.jsonl)."""
    root = tmp_path_factory.mktemp("parity")
    train = copy_class_folders(os.path.join(CIFAR_SAMPLE, "train"), str(root / "train"),
                               PER_CLASS)
    # eval (for the plot's top-1) and the checkpoint after the last epoch only
    common = ["--batch_size", str(BATCH), "--base_lr", BASE_LR, "--log_interval", "5",
              "--eval_interval", str(EPOCHS), "--save_checkpoint_epochs", str(EPOCHS)]
    args = parse_args(["--data_path", train, "--eval_data_path",
                       os.path.join(CIFAR_SAMPLE, "test"), "--epoch_size", str(EPOCHS),
                       "--work_dir", str(root), "--"] + common)
    cfg = parse_config(["--config_path", args.config_path, "--epoch_size", str(EPOCHS)] + common)
    ckpt, pth = str(root / "init.ckpt"), str(root / "init.pth")
    make_initial_weights(cfg, OURS_SEED, ckpt, pth)
    # (key, script, seed, initial weights, extra arguments, output folder name)
    plan = [("ours", "ours", OURS_SEED, ckpt, [], "ours")]
    plan += [(("torch", s), "torch", s, pth, [], f"torch_seed{s}") for s in TWIN_SEEDS]
    plan += [("unscaled", "torch", TWIN_SEEDS[0], pth, UNSCALED_LR, "torch_unscaled_lr")]
    runs = {"seconds": {}, "dirs": {}}
    for key, kind, seed, init, extra, name in plan:
        out = str(root / name)
        runs["seconds"][key] = run_training(kind, train_args(args, seed, init, out) + extra,
                                            out + ".out")
        runs[key] = finished_records(out, EPOCHS)
        runs["dirs"][key] = out
        assert runs[key] is not None, f"{key}: no {EPOCHS} epochs in {out}/metrics.jsonl"
    return runs


def loss_band(runs):
    """Per epoch: the twin's mean loss over its seeds and the half-width of the 99% prediction
    interval of one more run (Student's t times its seed-to-seed standard deviation)."""
    losses = np.array([[r["loss"] for r in runs[("torch", s)]] for s in TWIN_SEEDS])
    k = len(TWIN_SEEDS)
    half = T_995[k - 1] * losses.std(axis=0, ddof=1) * math.sqrt(1 + 1 / k)
    return losses, losses.mean(axis=0), half


def test_per_epoch_loss_within_twin_seed_spread(parity_runs):
    losses, mean, half = loss_band(parity_runs)
    ours = np.array([r["loss"] for r in parity_runs["ours"]])
    unscaled = np.array([r["loss"] for r in parity_runs["unscaled"]])
    print(f"\n[parity] resnet18, {PER_CLASS * 10} CIFAR-10 images, batch {BATCH}, {EPOCHS} "
          f"epochs, same initial weights. Per-epoch train loss: ours {np.round(ours, 4)}; twin "
          f"seeds {TWIN_SEEDS}: {np.round(losses, 4).tolist()} (mean {np.round(mean, 4)}, "
          f"std {np.round(losses.std(axis=0, ddof=1), 4)}); |ours - twin mean| "
          f"{np.round(np.abs(ours - mean), 4)} vs band {np.round(half, 4)}; twin with unscaled "
          f"LR {np.round(unscaled, 4)} (|diff| {np.round(np.abs(unscaled - mean), 4)}); "
          f"seconds per run {({str(k): round(v, 1) for k, v in parity_runs['seconds'].items()})}")
    assert np.all(np.abs(ours - mean) <= half), "ours outside the twin's own seed-to-seed band"
    # the band is narrow enough to see a recipe mistake (else this test could never fail)
    assert np.any(np.abs(unscaled - mean) > half), "the band does not reject an unscaled LR"


def test_twin_writes_train_py_metrics_format(parity_runs):
    """Same record keys, the same steps and the same LR at the end of every epoch."""
    ours, twin = parity_runs["ours"], parity_runs[("torch", TWIN_SEEDS[0])]
    assert [sorted(r) for r in twin] == [sorted(r) for r in ours]
    assert [r["step"] for r in twin] == [r["step"] for r in ours]
    np.testing.assert_allclose([r["lr"] for r in twin], [r["lr"] for r in ours], rtol=1e-6)


def test_plot_tool_writes_png(parity_runs, tmp_path):
    paths = [os.path.join(parity_runs["dirs"][k], "metrics.jsonl")
             for k in ("ours", ("torch", TWIN_SEEDS[0]))]
    out = str(tmp_path / "curves.png")
    assert plot_metrics.main(paths + ["-o", out, "--labels", "ours,PyTorch"]) == 0
    with Image.open(out) as image:
        assert image.format == "PNG"
        width, height = image.size
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    fig_w, fig_h = plot_metrics.FIGSIZE
    assert (width, height) == (round(fig_w * plot_metrics.DPI), round(fig_h * plot_metrics.DPI))
    assert colours is None or len(colours) > 20  # lines and text were drawn, not a blank image


def test_plot_tool_names_a_bad_file(tmp_path, capsys):
    bad = tmp_path / "metrics.jsonl"
    bad.write_text(json.dumps({"epoch": 1, "loss": 2.0}) + "\n{not json\n", encoding="utf-8")
    assert plot_metrics.main([str(bad), "-o", str(tmp_path / "x.png")]) == 2
    assert f"{bad} line 2" in capsys.readouterr().err


def test_twin_weight_decay_set_equals_ours():
    """The twin decays exactly the tensors ours decays (conv/fc weights), nothing else."""
    from benchmarks.torch_reference_train import weight_decay_groups
    from src.models.resnet import create_network
    from src.training.optimizer import split_weight_decay
    from tests.torch_resnet import torch_resnet
    from tools.convert_torch_checkpoint import ms_to_torch_names

    net, tnet = create_network("resnet50", 10), torch_resnet("resnet50", 10)
    decay, _ = split_weight_decay(net.trainable_params())
    to_torch = ms_to_torch_names([p.name for p in net.trainable_params()])
    names = {id(p): n for n, p in tnet.named_parameters()}
    groups = weight_decay_groups(tnet, 0.1)
    assert {names[id(p)] for p in groups[0]["params"]} == {to_torch[p.name] for p in decay}
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0


def test_twin_crop_box_follows_scale_and_ratio():
    """torchvision's RandomResizedCrop sampling: areas within scale, ratios within 3/4-4/3 (up
    to integer rounding), every box inside the image."""
    from benchmarks.torch_reference_train import random_resized_crop_box

    rng = np.random.default_rng(0)
    boxes = np.array([random_resized_crop_box(rng, 32, 32, (0.35, 1.0)) for _ in range(2000)])
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + h <= 32).all() and (left + w <= 32).all()
    area = h * w / 1024.0
    assert area.min() >= 0.3 and area.max() <= 1.0
    assert (w / h).min() >= 0.7 and (w / h).max() <= 1.4
