"""A resume never rewrites a run behind the user's back: every key that changes what is trained
is checked, a resume from an older checkpoint than the folder's newest is a branch (refused,
or with --overwrite the later steps moved aside), the best score is the higher of the
checkpoint's and the best checkpoint's, the data must be the one trained on, and a folder with
nothing to resume says so. Also the class weights of ``class_balance loss`` count the images
that train."""
import glob
import json
import os
import shutil

import mindspore as ms
import numpy as np
import pytest
from PIL import Image

from src.recipe import loss_class_weights
from src.training.resume import MAY_DIFFER, check_same_recipe
from src.utils.checkpoint import BEST_KEY, atomic_save_checkpoint, read_checkpoint, stored_best
from src.utils.config import ConfigError, parse_config
from src.utils.errors import UserError
from tests.helpers import CIFAR_SAMPLE, ROOT, copy_class_folders, run_in_process, train_in_process
from tests.test_run_files import folder_bytes

NET = "resnet18"
# 80 real CIFAR-10 images, batch 16: 5 steps per epoch; 3 epochs, evaluated and saved each.
COMMON = ["--config_path", "configs/quick_start.yaml", "--batch_size", "16", "--epoch_size",
          "3", "--eval_interval", "1", "--save_checkpoint_epochs", "1",
          "--keep_checkpoint_max", "10", "--num_parallel_workers", "2", "--log_interval", "1"]


def last_line(result):
    lines = result.stderr.strip().splitlines()
    return lines[-1] if lines else ""


def records(out):
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 3-epoch run: its data, eval data and output folder."""
    root = tmp_path_factory.mktemp("finished")
    data = copy_class_folders(os.path.join(CIFAR_SAMPLE, "train"), str(root / "train"), 8)
    test = copy_class_folders(os.path.join(CIFAR_SAMPLE, "test"), str(root / "test"), 3)
    out = str(root / "run")
    assert train_in_process(*COMMON, "--data_path", data, "--eval_data_path", test,
                            "--output_dir", out) == 0
    names = sorted(os.listdir(out))
    assert {f"{NET}-1_5.ckpt", f"{NET}-3_5.ckpt", f"{NET}-best.ckpt"} <= set(names), names
    return {"data": data, "test": test, "out": out}


def copy_run(finished, tmp_path):
    out = str(tmp_path / "run")
    shutil.copytree(finished["out"], out)
    return out


def train(finished, out, *extra, data=None):
    """train.py in the test process (no run here needs a process of its own); asserts it
    exited 0."""
    assert train_in_process(*COMMON, "--data_path", data or finished["data"],
                            "--eval_data_path", finished["test"], "--output_dir", out,
                            *extra) == 0


def refused(finished, out, *extra, data=None):
    """The one-line error train.py exits 2 with (``train.py: error: <this>``), run in the test
    process; fails if the run is not refused so."""
    with pytest.raises(UserError) as error:
        train(finished, out, *extra, data=data)
    assert error.value.exit_status == 2, error.value
    return str(error.value)


# ---- (a) every key that changes what is trained ----

def test_every_key_but_the_harmless_ones_is_checked_on_resume():
    stored = json.loads(json.dumps(dict(parse_config([]), device_num=1)))
    for key, value in (("weight_decay", "0.05"), ("seed", "2"), ("momentum", "0.8"),
                       ("label_smoothing", "0.2"), ("auto_augment", "randaugment"),
                       ("train_crop_scale", "0.5,1.0"), ("ema_decay", "0.99")):
        current = dict(parse_config([f"--{key}", value]), device_num=1)
        with pytest.raises(ConfigError, match=f"with other {key} .*--resume_ignore_config"):
            check_same_recipe("net-1_5.ckpt", stored, current)
    harmless = ["--output_dir", "elsewhere", "--data_path", "moved", "--keep_checkpoint_max",
                "3", "--save_checkpoint_steps", "7", "--num_parallel_workers", "2",
                "--log_interval", "5", "--eval_interval", "3", "--run_eval", "true",
                "--resume_ckpt", "auto", "--device_id", "1", "--sink_size", "4",
                "--tensorboard", "true"]
    check_same_recipe("net-1_5.ckpt", stored, dict(parse_config(harmless), device_num=1))
    assert {"weight_decay", "seed", "batch_size", "eval_image_size"}.isdisjoint(MAY_DIFFER)
    assert set(MAY_DIFFER) <= set(parse_config([]))  # no stale names


@pytest.mark.slow
def test_a_resume_with_another_weight_decay_is_refused(finished, tmp_path):
    out = copy_run(finished, tmp_path)
    os.chmod(os.path.join(out, f"{NET}-3_5.ckpt"), 0o600)
    os.remove(os.path.join(out, f"{NET}-3_5.ckpt"))  # as if killed in epoch 3
    before = folder_bytes(out)
    line = refused(finished, out, "--resume_ckpt", "auto", "--weight_decay", "0.05")
    assert "with other weight_decay 0.05 (checkpoint: 0.0005)" in line
    assert folder_bytes(out) == before


# ---- (b) a resume from an older checkpoint than the folder's newest is a branch ----

@pytest.mark.slow
def test_resuming_an_older_checkpoint_is_refused_by_name(finished, tmp_path):
    """Seen before: exit 0, epochs 2-3 trained again over their checkpoints, their records
    dropped, and the best checkpoint replaced by a worse model."""
    out = copy_run(finished, tmp_path)
    before = folder_bytes(out)
    line = refused(finished, out, "--resume_ckpt", os.path.join(out, f"{NET}-1_5.ckpt"))
    assert f"{NET}-1_5.ckpt (step 5) is older than the newest checkpoint of the run" in line
    assert f"{NET}-3_5.ckpt (step 15)" in line and "drop the 2 record(s) after step 5" in line
    assert "--resume_ckpt auto" in line and "--overwrite true" in line
    assert folder_bytes(out) == before


@pytest.mark.slow
def test_overwrite_moves_the_later_steps_aside(finished, tmp_path, capsys):
    out = copy_run(finished, tmp_path)
    best = stored_best(read_checkpoint(os.path.join(out, f"{NET}-best.ckpt")))
    assert best is not None  # the best checkpoint stores its score
    capsys.readouterr()
    train(finished, out, "--resume_ckpt", os.path.join(out, f"{NET}-1_5.ckpt"), "--overwrite",
          "true")
    result = capsys.readouterr()
    moved = glob.glob(os.path.join(out, "previous_run_*"))
    assert len(moved) == 1, os.listdir(out)
    aside = sorted(os.listdir(moved[0]))
    expected = [f"{NET}-2_5.ckpt", f"{NET}-3_5.ckpt", "metrics.jsonl"]
    if best["epoch"] > 1:  # chosen after the step resumed from: part of the later steps
        expected.append(f"{NET}-best.ckpt")
    assert aside == sorted(expected)
    assert [r["epoch"] for r in records(moved[0])] == [2, 3]
    assert [r["epoch"] for r in records(out)] == [1, 2, 3]  # one record per epoch
    assert "later checkpoints and records were moved to" in result.out + result.err


# ---- (c) the best score: the higher of the checkpoint's and the best checkpoint's ----

# ---- an image the decoder rejects, met during training ----

@pytest.mark.slow
def test_an_image_the_decoder_rejects_mid_run_names_it_and_the_last_good_checkpoint(
        finished, tmp_path):
    """--check_images false, and one image replaced by a WebP under its .jpg name after epoch 2
    (killed in epoch 3): the resumed run stops at the image with exit 2, naming the file and
    the checkpoint to resume from."""
    out = copy_run(finished, tmp_path)
    os.chmod(os.path.join(out, f"{NET}-3_5.ckpt"), 0o600)
    os.remove(os.path.join(out, f"{NET}-3_5.ckpt"))  # as if killed in epoch 3
    data = str(tmp_path / "data")
    shutil.copytree(finished["data"], data)
    bad = os.path.join(data, "cat", sorted(os.listdir(os.path.join(data, "cat")))[0])
    with Image.open(bad) as image:
        image.load()
        image.save(bad, "WEBP")
    # run from tmp_path: MindSpore's decoder writes the file it rejects to ./unsupported_image.*
    args = [os.path.join(ROOT, a) if a.startswith("configs/") else a for a in COMMON]
    result = run_in_process("train.py", *args, "--data_path", data, "--eval_data_path",
                            finished["test"], "--output_dir", out, "--resume_ckpt", "auto",
                            "--check_images", "false", cwd=tmp_path)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    line = last_line(result)
    assert f"cannot decode image {bad}" in line
    assert f"last good checkpoint: {os.path.join(out, NET + '-2_5.ckpt')}" in line, line
    assert "Traceback" not in result.stderr


# ---- the data changed between a stop and the resume ----

def data_with(finished, tmp_path, change):
    """A copy of the run's data with ``change`` images added (> 0) or removed (< 0)."""
    data = str(tmp_path / "data")
    shutil.copytree(finished["data"], data)
    classes = sorted(os.listdir(data))
    for i in range(abs(change)):
        cls = classes[i % len(classes)]
        if change > 0:
            source = sorted(os.listdir(os.path.join(CIFAR_SAMPLE, "train", cls)))[8 + i // 10]
            shutil.copy(os.path.join(CIFAR_SAMPLE, "train", cls, source),
                        os.path.join(data, cls, source))
        else:
            os.remove(os.path.join(data, cls, sorted(os.listdir(os.path.join(data, cls)))[0]))
    return data


@pytest.mark.slow
@pytest.mark.parametrize("change, images, steps", [(15, 95, 5), (-8, 72, 4)])
def test_a_resume_on_other_data_is_refused(finished, tmp_path, change, images, steps):
    """Seen before: 15 images added, exit 0 with the LR schedule stretched and two epoch-2
    records; 8 removed, fewer steps."""
    out = copy_run(finished, tmp_path)
    os.chmod(os.path.join(out, f"{NET}-3_5.ckpt"), 0o600)
    os.remove(os.path.join(out, f"{NET}-3_5.ckpt"))  # as if killed in epoch 3
    data = data_with(finished, tmp_path, change)
    before = folder_bytes(out)
    line = refused(finished, out, "--resume_ckpt", "auto", data=data)
    assert (f"data_path {data} holds {images} images ({steps} steps per epoch) but the "
            f"checkpoint {os.path.join(out, f'{NET}-2_5.ckpt')} was trained on 80 (5 steps per "
            f"epoch)") in line
    assert "--resume_ignore_config true" in line
    assert folder_bytes(out) == before


# ---- one resume for two checks: the best score kept, and the data change forced ----

@pytest.fixture(scope="module")
def lost_save_resumed_on_new_data(finished, tmp_path_factory):
    """The newest checkpoint lost (a crash during its save) after the best checkpoint of its
    epoch was written (its score set to 0.99 here), and 15 images added to the data: resumed
    with ``--resume_ckpt auto --resume_ignore_config true`` in the test process. ``auto``
    falls back to the previous checkpoint, whose stored best is lower.

    Returns:
        dict: ``out``; ``best`` (the best checkpoint's bytes before the resume), ``newest``
        (the lost checkpoint's path, written again by the resume).
    """
    root = tmp_path_factory.mktemp("lost_save")
    out = copy_run(finished, root)
    best_path = os.path.join(out, f"{NET}-best.ckpt")
    params = ms.load_checkpoint(best_path)
    atomic_save_checkpoint([{"name": n, "data": v} for n, v in params.items()
                            if not isinstance(v, str)], best_path,
                           {BEST_KEY: json.dumps({"top1": 0.99, "epoch": 3})})
    newest = os.path.join(out, f"{NET}-3_5.ckpt")
    os.chmod(newest, 0o600)
    with open(newest, "r+b") as f:
        f.truncate(1000)
    before = folder_bytes(out)[f"{NET}-best.ckpt"]
    data = data_with(finished, root, 15)
    train(finished, out, "--resume_ckpt", "auto", "--resume_ignore_config", "true", data=data)
    return {"out": out, "best": before, "newest": newest}


@pytest.mark.slow
def test_a_resume_keeps_the_best_checkpoint_s_score(lost_save_resumed_on_new_data):
    """The best checkpoint must not be replaced by a worse model: the resumed run goes on from
    the best checkpoint's score (0.99), higher than the resumed checkpoint's."""
    run = lost_save_resumed_on_new_data
    assert folder_bytes(run["out"])[f"{NET}-best.ckpt"] == run["best"]
    assert stored_best(read_checkpoint(run["newest"])) == {"top1": 0.99, "epoch": 3}


@pytest.mark.slow
def test_a_resume_on_other_data_goes_on_with_resume_ignore_config(
        lost_save_resumed_on_new_data):
    """The way out the refusal names: resumed with the new data (95 images, 5 steps per
    epoch), epoch 3 trained once more after the records of epochs 1-2."""
    records_after = records(lost_save_resumed_on_new_data["out"])
    assert [(r["epoch"], r["step"]) for r in records_after] == [(1, 5), (2, 10), (3, 15)]


# ---- nothing to resume ----

@pytest.mark.slow
def test_a_run_without_a_checkpoint_says_there_is_nothing_to_resume(finished, tmp_path):
    """Seen before: the refusal told the user to pass --resume_ckpt auto, which they had."""
    out = copy_run(finished, tmp_path)
    for path in glob.glob(os.path.join(out, f"{NET}-*_*.ckpt")):  # stopped before the first
        os.chmod(path, 0o600)
        os.remove(path)
    before = folder_bytes(out)
    line = refused(finished, out, "--resume_ckpt", "auto")
    assert "no usable checkpoint" in line and "nothing to resume" in line
    assert "--overwrite true" in line and "Continue that run with --resume_ckpt auto" not in line
    assert folder_bytes(out) == before


# ---- class_balance loss with eval_data_path and val_split ----

def test_the_loss_weights_count_every_image_when_eval_data_path_wins_over_val_split(tmp_path):
    """eval_data_path wins over val_split: nothing is held out, so the weights count every
    image (seen before: the weights of the split that was not applied)."""
    source = os.path.join(CIFAR_SAMPLE, "train")
    counts = {"airplane": 20, "automobile": 2, "bird": 4}
    for cls, count in counts.items():
        os.makedirs(tmp_path / "data" / cls)
        for name in sorted(os.listdir(os.path.join(source, cls)))[:count]:
            shutil.copy(os.path.join(source, cls, name), tmp_path / "data" / cls / name)
    cfg = parse_config(["--data_path", str(tmp_path / "data"), "--class_num", "3",
                        "--class_balance", "loss", "--val_split", "0.25", "--eval_data_path",
                        str(tmp_path / "data")])
    n = np.array(list(counts.values()))
    np.testing.assert_allclose(loss_class_weights(cfg), n.sum() / (3 * n), rtol=1e-6)


def test_a_checkpoint_storing_the_optimizers_default_resumes_under_a_null_key():
    """A checkpoint written when config.yaml set momentum 0.875 (and the other optimizers'
    keys) resumes under a config that leaves them null (the optimizer's declared default);
    another momentum is still refused."""
    from src.training.resume import check_same_recipe

    old = {"optimizer": "momentum", "momentum": 0.875, "beta1": 0.9, "beta2": 0.999,
           "eps": 1e-8, "trust_coeff": 0.001}
    new = {"optimizer": "momentum", "momentum": None, "beta1": None, "beta2": None,
           "eps": None, "trust_coeff": None}
    check_same_recipe("old.ckpt", old, new)
    with pytest.raises(ConfigError, match=r"momentum 0.9 \(checkpoint: 0.875\)"):
        check_same_recipe("old.ckpt", old, dict(new, momentum=0.9))
