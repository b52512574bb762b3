"""Convergence parity in short: train.py against its PyTorch twin
(benchmarks/torch_reference_train.py), from the same initial weights, on the same images, step
by step.

Why the set-up is what it is. Between two runs of one framework the loss curve moves by what
their random numbers differ in (data order, crop, flip) and, once those are equal, by float
rounding, which training amplifies. With random data order and augmentation a short run's
seed-to-seed spread (about 0.26 nats at 20 steps of batch 40) hides optimizer mistakes:
momentum removed, or Nesterov turned on, passed it. So here every random draw of the input
pipeline is taken out, in both frameworks alike, and what is left is float rounding:

- full batch: the 100 training images are one batch, one optimizer step per epoch (the order
  within the batch does not change its loss or gradient beyond rounding);
- the images (``deterministic_images``: real CIFAR-10 images of data/cifar10_sample, rows 4-27,
  columns 0-19 and their mirror image: 40 x 24 pixels, PNG) make the random resized crop
  deterministic: at ``train_crop_scale`` [1, 1] no area-1 box of aspect 3/4-4/3 fits a 5:3
  image, so both frameworks fall back to the center 32 x 24 crop; its resize to 32 x 32 is
  exact in both (pixel values multiples of 8, the first row repeated: OpenCV clamps at the
  border where Pillow renormalizes), and the flip leaves the mirror-symmetric image as it is
  (``test_both_pipelines_feed_the_same_images`` checks that the input tensors agree).

The twin's seeds then differ only in the order of the images inside the batch, i.e. in
rounding. In the first ``EARLY`` steps that rounding has hardly grown: the twin's seeds agree
to 1e-4 nats in the first two and within 0.007 in the third (torch on one thread; 0.0015 on
two), torch with other kernels (channels_last memory layout) within 0.005, ours within
0.004, while the mistakes this test is for move those steps by 0.03 to 0.3 nats (Nesterov
changes the first update, momentum 0 the second, a warmup one epoch longer both; MindSpore
2.10's CPU kernel of ``nn.Momentum`` ignores ``use_nesterov``, so Nesterov can only come
from our own code there): there ours
must lie within ``EARLY_TOL`` of the twin's mean, or within the seeds' prediction interval
(below) where that is wider (0.022 at the third step: still below the smallest mistake).
Later, training amplifies rounding (torch against itself in channels_last: up to 0.08 nats in
the steep part of the curve), more than the twin's seed-to-seed spread shows (its seeds
differ in reductions only, not in kernels), so there the band is the 99% prediction interval
of one more twin run (Student's t times the seeds' standard deviation) but at least
``LATE_TOL``. The twin without momentum is the negative control of the band. The LR of every
step (one per epoch) must agree with the twin's, which computes its schedule itself
(``lr_per_step``), not with ``src.training.lr_schedule``. ``pytest -s`` prints the numbers.
The twin's five runs share one interpreter and train on one thread each (``TWIN_THREADS``).
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
    run_twin_series,
    train_args,
)
from src.utils.config import parse_config
from tests.helpers import CIFAR_SAMPLE, ROOT
from tools import plot_metrics

PER_CLASS, EPOCHS, WARMUP_EPOCHS = 10, 10, 2
BATCH = 10 * PER_CLASS  # the whole training set: one step per epoch
PEAK_LR = 0.005  # per step, at batch 100: base_lr 0.0128 per 256 images
BASE_LR = f"{PEAK_LR * 256 / BATCH:g}"
OURS_SEED, TWIN_SEEDS = 1, (1, 2, 3, 4)
# Student's t quantile 0.995 by degrees of freedom (seeds - 1): the two-sided 99% prediction
# interval of one more draw is mean +- t * std * sqrt(1 + 1/seeds) (a mathematical constant).
T_995 = {2: 9.925, 3: 5.841, 4: 4.604, 5: 4.032}
# The band, nats, at least: in the first EARLY steps, and after them (see the docstring).
EARLY, EARLY_TOL, LATE_TOL = 3, 0.01, 0.15
# The negative control: the twin without momentum must fall outside the band.
NO_MOMENTUM = ["--momentum", "0"]
# torch's CPU threads in the twin's runs: one. The suite keeps both cores busy, and torch's
# OpenMP threads, when they outnumber the free cores, wait for each other (a step of batch 100
# took 2.1 s on one thread and 7-13 s on two, the cores loaded). One thread or two changes
# only the order of the sums, i.e. rounding, which the band is made for.
TWIN_THREADS = 1
CONFIG = os.path.join(ROOT, "configs", "resnet18_cifar10.yaml")  # accuracy_parity's default


def deterministic_images(src_root, dst_root, per_class):
    """PNG class folders of the first ``per_class`` images of each class of ``src_root``
    (32 x 32 CIFAR-10 JPEGs), each made 40 x 24: rows 4-27 of columns 0-19 and their mirror
    image, pixel values rounded down to multiples of 8, the first row a copy of the second
    (see the module docstring: a deterministic, exact train transform in both frameworks)."""
    for cls in sorted(os.listdir(src_root)):
        os.makedirs(os.path.join(dst_root, cls))
        for name in sorted(os.listdir(os.path.join(src_root, cls)))[:per_class]:
            with Image.open(os.path.join(src_root, cls, name)) as image:
                pixels = np.asarray(image.convert("RGB"))
            half = pixels[4:28, :20]
            made = np.concatenate([half, half[:, ::-1]], axis=1) // 8 * 8
            made[0] = made[1]
            Image.fromarray(np.ascontiguousarray(made)).save(
                os.path.join(dst_root, cls, os.path.splitext(name)[0] + ".png"))
    return dst_root


def common_args():
    """The arguments both frameworks get after the config file and data (see the docstring)."""
    return ["--batch_size", str(BATCH), "--base_lr", BASE_LR, "--warmup_epochs",
            str(WARMUP_EPOCHS), "--train_crop_scale", "[1.0, 1.0]", "--num_parallel_workers",
            "1", "--log_interval", "1", "--eval_interval", str(EPOCHS),
            "--save_checkpoint_epochs", str(EPOCHS)]


@pytest.fixture(scope="module")
def train_images(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity_images")
    return deterministic_images(os.path.join(CIFAR_SAMPLE, "train"), str(root / "train"),
                                PER_CLASS)


@pytest.fixture(scope="module")
def parity_runs(train_images, tmp_path_factory):
    """Every run of the comparison: {"ours": records, ("torch", seed): records, "control":
    records, "seconds": {key: s}, "dirs": {key: output folder}} (records of metrics.jsonl)."""
    root = tmp_path_factory.mktemp("parity")
    common = common_args()
    # eval (for the plot's top-1) after the last epoch only, on the real test images
    args = parse_args(["--config_path", CONFIG, "--data_path", train_images, "--eval_data_path",
                       os.path.join(CIFAR_SAMPLE, "test"), "--epoch_size", str(EPOCHS),
                       "--work_dir", str(root), "--"] + common)
    cfg = parse_config(["--config_path", args.config_path, "--epoch_size", str(EPOCHS)] + common)
    ckpt, pth = str(root / "init.ckpt"), str(root / "init.pth")
    make_initial_weights(cfg, OURS_SEED, ckpt, pth)
    dirs = {"ours": str(root / "ours"), "control": str(root / "torch_no_momentum")}
    dirs.update({("torch", s): str(root / f"torch_seed{s}") for s in TWIN_SEEDS})
    runs = {"dirs": dirs, "seconds": {"ours": run_training(
        "ours", train_args(args, OURS_SEED, ckpt, dirs["ours"]), dirs["ours"] + ".out")}}
    # the twin's five runs in one interpreter, on one thread each (see TWIN_THREADS)
    twins = [train_args(args, s, pth, dirs[("torch", s)]) for s in TWIN_SEEDS]
    twins.append(train_args(args, TWIN_SEEDS[0], pth, dirs["control"]) + NO_MOMENTUM)
    runs["seconds"]["twins"] = run_twin_series(twins, str(root / "twins.out"), TWIN_THREADS)
    for key, out in dirs.items():
        runs[key] = finished_records(out, EPOCHS)
        assert runs[key] is not None, f"{key}: no {EPOCHS} epochs in {out}/metrics.jsonl"
    return runs


def loss_band(runs):
    """Per epoch (= step): the twin's losses over its seeds, their mean and the half-width of
    the 99% prediction interval of one more run (Student's t times the seed-to-seed standard
    deviation), at least ``EARLY_TOL`` in the first ``EARLY`` epochs, ``LATE_TOL`` after."""
    losses = np.array([[r["loss"] for r in runs[("torch", s)]] for s in TWIN_SEEDS])
    k = len(TWIN_SEEDS)
    half = T_995[k - 1] * losses.std(axis=0, ddof=1) * math.sqrt(1 + 1 / k)
    floor = np.where(np.arange(losses.shape[1]) < EARLY, EARLY_TOL, LATE_TOL)
    return losses, losses.mean(axis=0), np.maximum(half, floor)


def test_both_pipelines_feed_the_same_images(train_images):
    """The premise of the comparison: ours' training pipeline (two epoch seeds) and the twin's
    transforms give the same input tensors for these images (float rounding of the
    normalization aside)."""
    import mindspore.dataset as ds

    from benchmarks.torch_reference_train import ImageFolder, list_images
    from src.data.pipeline import create_dataset
    from src.data.settings import Sampling, TrainAugment

    cfg = parse_config(["--config_path", CONFIG] + common_args())
    _, paths, labels = list_images(train_images, False)
    twin_set = ImageFolder(paths, labels, True, cfg)
    twin = np.stack([twin_set[i][0].numpy() for i in range(len(paths))])
    for seed in (1, 2):
        ds.config.set_seed(seed)
        batch = next(create_dataset(
            train_images, TrainAugment(image_size=cfg.train_image_size,
                                       crop_scale=tuple(cfg.train_crop_scale)),
            batch_size=len(paths), sampling=Sampling(shuffle=False),
            num_parallel_workers=1).create_dict_iterator(output_numpy=True))
        np.testing.assert_array_equal(batch["label"], labels)
        np.testing.assert_allclose(batch["image"], twin, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_per_epoch_loss_within_twin_seed_spread(parity_runs):
    losses, mean, half = loss_band(parity_runs)
    ours = np.array([r["loss"] for r in parity_runs["ours"]])
    control = np.array([r["loss"] for r in parity_runs["control"]])
    print(f"\n[parity] resnet18, {BATCH} CIFAR-10 images in one batch, {EPOCHS} steps, same "
          f"initial weights. Per-step train loss: ours {np.round(ours, 4).tolist()}; twin seeds "
          f"{TWIN_SEEDS}: {np.round(losses, 4).tolist()}; |ours - twin mean| "
          f"{np.round(np.abs(ours - mean), 4).tolist()} vs band {np.round(half, 4).tolist()}; "
          f"twin without momentum |diff| {np.round(np.abs(control - mean), 4).tolist()}; "
          f"seconds per run {({str(k): round(v, 1) for k, v in parity_runs['seconds'].items()})}")
    outside = np.nonzero(np.abs(ours - mean) > half)[0]
    assert not len(outside), (
        f"ours outside the twin's own seed-to-seed band at epochs {(outside + 1).tolist()}: "
        f"|ours - twin mean| {np.round(np.abs(ours - mean)[outside], 4).tolist()} > band "
        f"{np.round(half[outside], 4).tolist()}")
    # the band is narrow enough to see a recipe mistake (else this test could never fail)
    assert np.any(np.abs(control - mean)[:EARLY] > half[:EARLY]) and np.any(
        np.abs(control - mean)[EARLY:] > half[EARLY:]), "the band does not reject momentum 0"


@pytest.mark.slow
def test_twin_writes_train_py_metrics_format(parity_runs):
    """Same record keys and the same steps."""
    ours, twin = parity_runs["ours"], parity_runs[("torch", TWIN_SEEDS[0])]
    assert [sorted(r) for r in twin] == [sorted(r) for r in ours]
    assert [r["step"] for r in twin] == [r["step"] for r in ours]


@pytest.mark.slow
def test_lr_of_every_step_equals_the_twins(parity_runs):
    """One step per epoch, so the records hold the LR of every step: ours from
    ``src.training.lr_schedule``, the twin's from its own formulas (``lr_per_step``)."""
    ours, twin = parity_runs["ours"], parity_runs[("torch", TWIN_SEEDS[0])]
    assert [r["step"] for r in ours] == list(range(1, EPOCHS + 1))
    np.testing.assert_allclose([r["lr"] for r in ours], [r["lr"] for r in twin], rtol=1e-6,
                               err_msg="ours' LR per step differs from the twin's")


@pytest.mark.parametrize("extra", [
    [], ["--lr_schedule", "linear", "--lr_end", "0.001"],
    ["--lr_schedule", "step", "--lr_decay_epochs", "[2, 5]", "--lr_decay_factor", "0.5"],
    ["--warmup_epochs", "0"], ["--warmup_epochs", "9"]])
def test_twin_lr_formulas_equal_ours_for_every_schedule(extra):
    """The twin's LR (written out from NVIDIA's formulas) equals ``create_lr`` for each
    schedule, with and without warmup, and does not import it."""
    import ast

    import benchmarks.torch_reference_train as twin
    from src.training.lr_schedule import LR_KEYS, create_lr

    cfg = parse_config(["--config_path", CONFIG, "--epoch_size", "7"] + extra)
    theirs, peak = twin.lr_per_step(cfg, 40, 3)
    ours, our_peak = create_lr(**{k: cfg[k] for k in LR_KEYS}, global_batch_size=40,
                               steps_per_epoch=3)
    assert len(theirs) == 21 and peak == pytest.approx(our_peak)
    np.testing.assert_allclose(theirs, ours, rtol=1e-6)
    with open(twin.__file__, encoding="utf-8") as f:
        imported = {n.module for n in ast.walk(ast.parse(f.read()))
                    if isinstance(n, ast.ImportFrom)}
    assert "src.training.lr_schedule" not in imported


@pytest.mark.slow
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

    net, tnet = create_network("resnet50", class_num=10), torch_resnet("resnet50", 10)
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
