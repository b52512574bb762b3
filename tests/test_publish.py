"""``export.py --file_format SAFETENSORS`` (``src/deploy/publish.py``): the folder changes as a
whole or not at all, a failed write leaves nothing behind, the files follow the umask, a card or
config.json edited by hand is kept, and config.json and the card say what they should."""
import errno
import json
import logging
import math
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import mindspore as ms
import numpy as np
import pytest
from safetensors import safe_open

from src.deploy import publish
from src.models.resnet import create_network
from src.utils.errors import WriteError
from src.utils.files import FileLock
from tests.helpers import ROOT, file_size_limit, run_in_process, succeeded
from tests.test_export_atomic import EXPORTS

COMMON = ["--config_path", "configs/quick_start.yaml", "--net_name", "resnet18",
          "--class_num", "3", "--device_target", "CPU", "--file_format", "SAFETENSORS"]
FILES = ["README.md", "config.json", "model.safetensors"]


@pytest.fixture(scope="module")
def r18_3(tmp_path_factory):
    """A ResNet-18 checkpoint of 3 classes with ``eval_result.json`` and ``class_names.txt``
    beside it."""
    folder = tmp_path_factory.mktemp("ckpt")
    ms.save_checkpoint(create_network("resnet18", class_num=3), str(folder / "r18.ckpt"))
    (folder / "class_names.txt").write_text("cat\ndog\nfox\n")
    (folder / "eval_result.json").write_text(json.dumps(
        {"top1": 0.8123, "top5": 0.9567, "images": 50, "data_path": "data/val"}))
    return str(folder / "r18.ckpt")


def export(ckpt, file_name, *more):
    return run_in_process("export.py", *COMMON, "--checkpoint_path", ckpt, "--file_name",
                          file_name, "--eval_image_size", 64, "--eval_resize", 73,
                          "--eval_interpolation", "bicubic", *more)


def state(seed):
    rng = np.random.default_rng(seed)
    return {"fc.weight": rng.standard_normal((3, 4)).astype(np.float32),
            "fc.bias": rng.standard_normal(3).astype(np.float32)}


def save(folder, seed):
    return publish.save_hub_folder(str(folder), state(seed), {"architecture": f"net{seed}"},
                                   f"# card {seed}\n")


def snapshot(root):
    """Every file under ``root`` (names relative to it) -> its bytes."""
    found = {}
    for path, _, names in os.walk(root):
        for name in names:
            full = os.path.join(path, name)
            with open(full, "rb") as f:
                found[os.path.relpath(full, root)] = f.read()
    return found


@pytest.fixture()
def fail_nth_fsync(monkeypatch):
    """``fail(n)``: the n-th ``os.fsync`` from now on fails with ENOSPC (a disk that fills
    at the n-th file the export writes)."""
    def fail(n):
        real, calls = os.fsync, []

        def fsync(fd):
            calls.append(fd)
            if len(calls) == n:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(fd)
        monkeypatch.setattr(os, "fsync", fsync)
    return fail


# ---- 1, 13: the folder changes as a whole or not at all; nothing left behind ----

@pytest.mark.parametrize("nth", [1, 2, 3])
def test_a_failed_write_leaves_the_earlier_folder_byte_identical(tmp_path, fail_nth_fsync,
                                                                 nth):
    folder = tmp_path / "published"
    save(folder, 1)
    (folder / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    before, listing = snapshot(tmp_path), sorted(os.listdir(tmp_path))
    fail_nth_fsync(nth)
    with pytest.raises(WriteError, match="No space left on device"):
        save(folder, 2)
    assert snapshot(tmp_path) == before
    assert sorted(os.listdir(tmp_path)) == listing  # no staging folder or .partial file left


@pytest.mark.parametrize("failing", ["aside", "into place"])
def test_a_failed_switch_puts_the_earlier_folder_back(tmp_path, monkeypatch, failing):
    folder = tmp_path / "published"
    save(folder, 1)
    before, listing = snapshot(tmp_path), sorted(os.listdir(tmp_path))
    real = os.rename

    def rename(src, dst):
        if (str(src) == str(folder) if failing == "aside"
                else str(dst) == str(folder) and ".staging." in str(src)):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(src, dst)
    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(WriteError, match=f"cannot write {folder}: Input/output error"):
        save(folder, 2)
    assert snapshot(tmp_path) == before and sorted(os.listdir(tmp_path)) == listing


@pytest.mark.parametrize("immutable", ["the folder", "its README.md"])
def test_an_immutable_folder_or_card(tmp_path, caplog, immutable):
    """``chattr +i`` on the folder: refused, unchanged, nothing left; on its card alone: the
    folder is switched and the earlier one, which cannot be deleted, is named."""
    if shutil.which("chattr") is None or os.geteuid() != 0:
        pytest.skip("needs chattr and root")
    folder = tmp_path / "published"
    save(folder, 1)
    pinned = folder if immutable == "the folder" else folder / "README.md"
    if subprocess.run(["chattr", "+i", str(pinned)], capture_output=True).returncode:
        pytest.skip("the filesystem has no immutable flag")
    before, listing = snapshot(tmp_path), sorted(os.listdir(tmp_path))
    try:
        if immutable == "the folder":
            with pytest.raises(WriteError, match=f"cannot write {folder}: Operation not "):
                save(folder, 2)
            assert snapshot(tmp_path) == before and sorted(os.listdir(tmp_path)) == listing
        else:
            with caplog.at_level(logging.WARNING):
                save(folder, 2)
            assert (folder / "README.md").read_text().startswith("# card 2\n")
            assert "could not delete the earlier folder" in caplog.text
    finally:
        for path in tmp_path.rglob("README.md"):
            subprocess.run(["chattr", "-i", str(path)], check=False)
        subprocess.run(["chattr", "-i", str(folder)], check=False)


def test_a_new_folder_whose_write_fails_is_not_left_behind(tmp_path, fail_nth_fsync):
    fail_nth_fsync(1)
    with pytest.raises(WriteError, match="model.safetensors: No space left on device"):
        save(tmp_path / "new", 1)
    assert os.listdir(tmp_path) == []


def test_other_files_of_the_folder_stay(tmp_path):
    folder = tmp_path / "published"
    save(folder, 1)
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    save(folder, 2)
    assert sorted(os.listdir(folder)) == [".git", *FILES]
    assert (folder / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
    assert sorted(os.listdir(tmp_path)) == ["published"]  # the earlier folder deleted
    assert (folder / "README.md").read_text().startswith("# card 2\n")


@pytest.mark.slow
def test_safetensors_export_on_a_full_disk_exits_4(tmp_path, r18_3):
    """A new and an existing folder on a full disk (files capped at 1 MB, the weights are 45
    MB): exit 4 with the OS reason, the existing folder byte-identical, no new one."""
    (tmp_path / "old").mkdir()
    save(tmp_path / "old", 1)
    before = snapshot(tmp_path)
    runs = [[*COMMON, "--checkpoint_path", r18_3, "--file_name", str(tmp_path / name)]
            for name in ("new", "old")]
    result = subprocess.run([sys.executable, "-c", EXPORTS, json.dumps(runs)], cwd=ROOT,
                            text=True, capture_output=True,
                            preexec_fn=file_size_limit(1 << 20), timeout=900)
    assert result.returncode == 0, result.stdout[-1500:] + result.stderr[-1500:]
    reports = json.loads(result.stdout.strip().splitlines()[-1])
    for name, report in zip(("new", "old"), reports):
        assert report["returncode"] == 4, report["stderr"][-1500:]
        assert report["stderr"] == (f"export.py: error: cannot write "
                                    f"{tmp_path / name / 'model.safetensors'}: File too large\n")
    assert snapshot(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["old"]


@pytest.mark.slow
def test_a_read_only_folder_exits_4_and_is_left_as_it_was(r18_3):
    """A real read-only export folder (0555) of an unprivileged user: exit 4, unchanged."""
    if not (os.geteuid() != 0 or shutil.which("setpriv")):
        pytest.skip("needs a non-root user, or root and setpriv to run as one")
    root = tempfile.mkdtemp(prefix="publish_ro_")
    try:
        os.chmod(root, 0o777)
        folder = os.path.join(root, "published")
        save(folder, 1)
        os.chmod(folder, 0o555)
        for name in os.listdir(folder):
            os.chmod(os.path.join(folder, name), 0o444)
        shutil.copy(r18_3, os.path.join(root, "r18.ckpt"))
        os.chmod(os.path.join(root, "r18.ckpt"), 0o444)
        before = snapshot(root)
        cmd = [sys.executable, "export.py", *COMMON, "--checkpoint_path",
               os.path.join(root, "r18.ckpt"), "--file_name", folder]
        if os.geteuid() == 0:
            cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
        result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                                env=dict(os.environ, HOME=tempfile.gettempdir()))
        assert result.returncode == 4, result.stderr[-1500:]
        assert result.stderr.splitlines()[-1] == (
            f"export.py: error: cannot write {folder}: Permission denied")
        assert snapshot(root) == before
    finally:
        os.chmod(os.path.join(root, "published"), 0o755)
        shutil.rmtree(root, ignore_errors=True)


# ---- 17: the files follow the umask ----

def test_files_follow_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        files = save(tmp_path / "new", 1)
    finally:
        os.umask(old)
    assert [stat.S_IMODE(os.stat(f).st_mode) for f in files] == [0o640] * 3
    assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o750
    os.chmod(tmp_path / "new", 0o705)
    save(tmp_path / "new", 2)
    assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o705  # an existing one's kept


# ---- 18: a card or config.json the export did not write is kept ----

@pytest.mark.parametrize("edited", ["README.md", "config.json"])
def test_an_edited_card_or_config_is_kept_with_a_log_line(tmp_path, caplog, edited):
    folder = tmp_path / "published"
    save(folder, 1)
    save(folder, 2)  # an unedited export folder is replaced without a word
    assert sorted(os.listdir(tmp_path)) == ["published"] and not caplog.records
    with open(folder / edited, "a", encoding="utf-8") as f:
        f.write("\n" if edited == "config.json" else "Trained on my own photos.\n")
    before = snapshot(folder)
    with caplog.at_level(logging.WARNING):
        save(folder, 3)
    kept = [n for n in os.listdir(tmp_path) if n != "published"]
    assert len(kept) == 1 and kept[0].startswith("published.before_export_")
    assert snapshot(tmp_path / kept[0]) == before
    assert [r.getMessage() for r in caplog.records] == [
        f"{folder} held {edited} not written by export.py (edited by hand?): the earlier "
        f"folder is kept whole as {tmp_path / kept[0]}"]
    assert (folder / "README.md").read_text().startswith("# card 3\n")


def test_a_hand_written_card_is_kept(tmp_path, caplog):
    folder = tmp_path / "published"
    folder.mkdir()
    (folder / "README.md").write_text("# My model\n")
    with caplog.at_level(logging.WARNING):
        save(folder, 1)
    kept = [n for n in os.listdir(tmp_path) if n != "published"]
    assert (tmp_path / kept[0] / "README.md").read_text() == "# My model\n"
    assert "held README.md not written by export.py" in caplog.text


# ---- 2: one lock whatever the spelling of the path ----

@pytest.mark.parametrize("spelling", ["trailing slash", "link"])
def test_the_export_lock_does_not_depend_on_the_spelling(tmp_path, r18_3, spelling):
    (tmp_path / "conc").mkdir()
    if spelling == "link":
        os.symlink(tmp_path / "conc", tmp_path / "alias")
    lock = FileLock(str(tmp_path / "conc.lock"), lambda holder: "", "the first export")
    lock.acquire()
    try:
        name = str(tmp_path / "conc") + "/" if spelling == "trailing slash" else \
            tmp_path / "alias"
        result = export(r18_3, name)
    finally:
        lock.release()
    assert result.returncode == 2, result.stdout[-1500:] + result.stderr[-1500:]
    assert f"{tmp_path / 'conc'} is being exported by another process" in result.stderr
    assert os.listdir(tmp_path / "conc") == []


def test_the_onnx_export_lock_is_the_folders_through_a_link(tmp_path, r18_3):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "alias")
    lock = FileLock(str(tmp_path / "real" / "m.onnx.lock"), lambda holder: "busy", "first")
    lock.acquire()
    try:
        result = run_in_process("export.py", "--config_path", "configs/quick_start.yaml",
                                "--checkpoint_path", r18_3, "--class_num", 3, "--file_format",
                                "ONNX", "--file_name", tmp_path / "alias" / "m")
    finally:
        lock.release()
    assert result.returncode == 2
    assert f"{tmp_path / 'real' / 'm.onnx'} is being exported by another process" in result.stderr


# ---- 14: file_name naming a file ----

def test_file_name_naming_a_file_is_a_named_error(tmp_path, r18_3):
    (tmp_path / "weights").write_text("not a folder")
    result = export(r18_3, tmp_path / "weights")
    assert result.returncode == 2
    assert result.stderr == (
        f"export.py: error: file_name {tmp_path / 'weights'} is a file: file_format SAFETENSORS "
        f"writes a folder (model.safetensors, config.json, README.md); choose another "
        f"--file_name\n")
    assert (tmp_path / "weights").read_text() == "not a folder"


# ---- what config.json, the card and the weights say ----

def test_config_card_and_weights_say_what_they_should(tmp_path, r18_3):
    folder = tmp_path / "my_resnet"
    succeeded(export(r18_3, folder))
    config = json.loads((folder / "config.json").read_text())
    crop_pct = config["pretrained_cfg"]["crop_pct"]
    assert math.floor(64 / crop_pct) == 73
    record = config.pop("model_record")  # ours beside timm's keys: what the folder holds
    assert (record["net_name"], record["class_num"], record["class_names"], record["task"],
            record["preprocess"]) == ("resnet18", 3, ["cat", "dog", "fox"], "multiclass",
                                      {"image_size": 64, "resize": 73,
                                       "interpolation": "bicubic"})
    assert config == {
        "architecture": "resnet18", "num_classes": 3, "num_features": 512,
        "global_pool": "avg", "label_names": ["cat", "dog", "fox"],
        "problem_type": "single_label_classification",
        "pretrained_cfg": {
            "tag": "", "custom_load": False, "input_size": [3, 64, 64],
            "fixed_input_size": False, "interpolation": "bicubic", "crop_pct": crop_pct,
            "crop_mode": "center", "mean": [0.485, 0.456, 0.406],
            "std": [0.229, 0.224, 0.225], "num_classes": 3, "pool_size": [2, 2],
            "first_conv": "conv1", "classifier": "fc"}}
    card = (folder / "README.md").read_text()
    assert "top-1 0.8123, top-5 0.9567 on 50 images of `data/val`" in card
    assert "resize the shorter side to 73 px (bicubic), center crop 64 px" in card
    assert "model = torchvision.models.resnet18(num_classes=3)" in card
    assert card.splitlines()[-1].startswith("<!-- written by export.py: card sha256 ")
    with safe_open(str(folder / "model.safetensors"), framework="np") as f:
        assert f.metadata() == {"format": "pt"}  # transformers and timm read the tag
        assert "fc.weight" in f.keys() and f.get_tensor("fc.weight").shape == (3, 512)
