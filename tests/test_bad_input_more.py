"""More faults and bad input, each one line naming the file, folder or value: the run's lock
file on a full disk, unreadable images and folders, entries with an image name that are not
image files, sub-folders inside class folders, a device target the installed MindSpore lacks,
two exports to one file at once, and the commands in the recipe files' headers."""
import fcntl
import json
import logging
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile

import mindspore as ms
import pytest

from src.data.image_check import ImageFolderError, check_image_folder
from src.data.pipeline import count_images, image_folder_files
from src.deploy.inference import list_images
from src.training.output_dir import LOCK_FILE
from src.utils.config import ConfigError, load_schema, parse_config
from tests.helpers import CIFAR_SAMPLE, ROOT, copy_class_folders, run_entry, run_in_process

SAMPLE = os.path.join(CIFAR_SAMPLE, "train")
QUICK = os.path.join(ROOT, "configs", "quick_start.yaml")
NOBODY = 65534


def one_line_error(result, status=2):
    """The one error line of an entry point that exited with ``status``."""
    assert result.returncode == status, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "C++" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


@pytest.fixture()
def folder(tmp_path):
    """Two real classes, 3 JPEGs each."""
    return copy_class_folders(SAMPLE, str(tmp_path / "data"), 3, classes=["cat", "dog"])


@pytest.fixture(scope="module")
def r18_2():
    """A ResNet-18 checkpoint of 2 classes, readable by every user (pytest's folders are the
    owner's only)."""
    from src.models.resnet import create_network
    folder = tempfile.mkdtemp(prefix="bad_input_ckpt_")
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "r18.ckpt")
    ms.save_checkpoint(create_network("resnet18", class_num=2), path)
    os.chmod(path, 0o644)
    yield path
    shutil.rmtree(folder, ignore_errors=True)


# ---- 7: the run's lock file on a full disk ----

def full_disk():
    """``preexec_fn``: files may not grow past 4 bytes (a full disk; ``tempfile``'s probe of
    its folder, 4 bytes, still passes; the lock file's ``host pid`` line is longer), and a
    write past that fails with EFBIG (SIGXFSZ ignored)."""
    import resource
    import signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4, 4))


@pytest.mark.slow
def test_a_lock_file_that_cannot_be_written_exits_4_naming_it(tmp_path):
    out = tmp_path / "new_run"  # a new folder: the lock file is the first file written
    result = subprocess.run([sys.executable, "train.py", "--config_path", QUICK, "--output_dir",
                             str(out)], cwd=ROOT, text=True, capture_output=True,
                            preexec_fn=full_disk, timeout=600)
    assert one_line_error(result, 4) == (
        f"train.py: error: cannot write the lock file {out / LOCK_FILE}: File too large")


# ---- 8: images and folders the run's user cannot read ----

def can_switch_user():
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


@pytest.fixture()
def open_dir():
    """A folder every user can write (pytest's own are the owner's only), removed after."""
    path = tempfile.mkdtemp(prefix="bad_input_")
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_as_nobody(script, *args):
    """An entry point run as the unprivileged user ``nobody`` (root reads any file)."""
    if not can_switch_user():
        pytest.skip("needs root and setpriv to run as an unprivileged user")
    cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
           sys.executable, os.path.join(ROOT, script), *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, HOME=tempfile.gettempdir()), check=False)


def world_readable(root):
    for path, _, files in os.walk(root):
        os.chmod(path, 0o755)
        for name in files:
            os.chmod(os.path.join(path, name), 0o644)
    return root


@pytest.mark.slow
def test_an_unreadable_image_is_named_by_train_eval_and_predict(open_dir, r18_2):
    data = world_readable(copy_class_folders(SAMPLE, os.path.join(open_dir, "data"), 3,
                                             classes=["cat", "dog"]))
    image = os.path.join(data, "cat", "0001.jpg")
    os.chmod(image, 0)
    named = f"image files that cannot be read (give the run's user read access, or remove " \
            f"them): {image} (Permission denied)"
    train = run_as_nobody("train.py", "--config_path", QUICK, "--class_num", 2, "--batch_size",
                          2, "--run_eval", "false", "--data_path", data, "--output_dir",
                          os.path.join(open_dir, "train"))
    assert one_line_error(train) == f"train.py: error: {named}"
    evaluated = run_as_nobody("eval.py", "--config_path", QUICK, "--class_num", 2, "--data_path",
                              data, "--checkpoint_path", r18_2, "--output_dir",
                              os.path.join(open_dir, "eval"))
    assert one_line_error(evaluated) == f"eval.py: error: {named}"
    predicted = run_as_nobody("predict.py", "--config_path", QUICK, "--class_num", 2,
                              "--checkpoint_path", r18_2, "--image_path",
                              os.path.join(data, "cat"))
    assert one_line_error(predicted) == (
        f"predict.py: error: cannot read image {image}: Permission denied")


@pytest.mark.slow
def test_an_unreadable_class_folder_is_named(open_dir, r18_2):
    data = world_readable(copy_class_folders(SAMPLE, os.path.join(open_dir, "data"), 3,
                                             classes=["cat", "dog"]))
    os.chmod(os.path.join(data, "dog"), 0)
    named = f"cannot read folder {os.path.join(data, 'dog')}: Permission denied"
    train = run_as_nobody("train.py", "--config_path", QUICK, "--class_num", 2, "--run_eval",
                          "false", "--data_path", data, "--output_dir",
                          os.path.join(open_dir, "train"))
    assert one_line_error(train) == f"train.py: error: {named}"
    predicted = run_as_nobody("predict.py", "--config_path", QUICK, "--class_num", 2,
                              "--checkpoint_path", r18_2, "--image_path", data)
    assert one_line_error(predicted) == f"predict.py: error: {named}"


def test_an_image_that_cannot_be_read_is_named_by_the_check(folder, monkeypatch):
    """In-process (root reads any file): the read itself fails as it does without permission."""
    import builtins
    denied = os.path.join(folder, "dog", "0002.jpg")
    real_open = builtins.open

    def fake_open(path, *args, **kwargs):
        if os.fspath(path) == denied:
            raise PermissionError(13, "Permission denied", denied)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    with pytest.raises(ImageFolderError, match=re.escape(f"{denied} (Permission denied)")):
        check_image_folder(folder)


# ---- 9: entries with an image name that are not image files ----

def add_folder_and_dangling_link(folder):
    os.makedirs(os.path.join(folder, "cat", "photos.jpg"))
    os.symlink("gone.jpg", os.path.join(folder, "dog", "moved.jpg"))
    return [f"{os.path.join(folder, 'cat', 'photos.jpg')} (a folder)",
            f"{os.path.join(folder, 'dog', 'moved.jpg')} (a link to a missing file)"]


def test_a_folder_or_dangling_link_with_an_image_name_is_named(folder):
    named = add_folder_and_dangling_link(folder)
    message = "entries with an image name that are not image files"
    with pytest.raises(ImageFolderError, match=message) as info:
        check_image_folder(folder, check_content=False)  # the layout, as the reader lists it
    assert all(entry in str(info.value) for entry in named)
    with pytest.raises(ImageFolderError, match=message) as info:
        list_images(folder)  # predict: the same listing
    assert all(entry in str(info.value) for entry in named)


@pytest.mark.slow
def test_eval_names_a_folder_with_an_image_name_before_the_pipeline_fails(folder, r18_2,
                                                                          tmp_path):
    named = add_folder_and_dangling_link(folder)
    result = run_in_process("eval.py", "--config_path", QUICK, "--class_num", 2, "--data_path",
                            folder, "--checkpoint_path", r18_2, "--output_dir", tmp_path / "eval",
                            cwd=tmp_path)  # (MindSpore's decoder writes what it rejects here)
    assert one_line_error(result) == (
        f"eval.py: error: entries with an image name that are not image files (the reader "
        f"would fail on them): remove or rename them: {named[0]}, {named[1]}")


# ---- 16: sub-folders inside class folders ----

def test_sub_folders_of_class_folders_are_skipped_with_a_count(folder, caplog):
    nested = os.path.join(folder, "cat", "more")
    os.makedirs(os.path.join(nested, "deeper"))
    shutil.copy(os.path.join(SAMPLE, "cat", "0010.jpg"), nested)
    shutil.copy(os.path.join(SAMPLE, "cat", "0011.jpg"), os.path.join(nested, "deeper"))
    with caplog.at_level(logging.WARNING):
        assert check_image_folder(folder) == ["cat", "dog"]
    assert (f"skipping 1 sub-folder holding 2 images inside class folders (only the images "
            f"directly in a class folder are read: move them up to use them): {nested}"
            in caplog.text)
    # one rule: the reader, the listing of the split and the check count the same images
    assert len(image_folder_files(folder)) == count_images(folder, False) == 6


def test_predict_reads_a_folder_as_eval_does(folder, caplog):
    """The images directly in image_path and in its sub-folders (a class-folder root), not
    deeper: one rule with train and eval, and a warning counting what is skipped."""
    nested = os.path.join(folder, "cat", "more")
    os.makedirs(nested)
    shutil.copy(os.path.join(SAMPLE, "cat", "0010.jpg"), nested)
    with caplog.at_level(logging.WARNING):
        found = list_images(folder)
    assert len(found) == 6 and os.path.join(nested, "0010.jpg") not in found
    assert f"image_path {folder}: skipping 1 sub-folder holding 1 image" in caplog.text
    assert nested in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # a sub-folder of image_path itself: read
        assert len(list_images(os.path.join(folder, "cat"))) == 4
    assert "skipping" not in caplog.text


# ---- 11: a device target the installed MindSpore does not run on ----

def installed_targets():
    try:
        from src.utils.device import available_targets
    except ImportError:  # a MindSpore that cannot say: a CPU-only test machine
        return ["CPU"]
    return available_targets() or ["CPU"]


GPU_CASES = {"train.py": ["--output_dir", "{tmp}/out"],
             "eval.py": ["--checkpoint_path", "unused.ckpt", "--output_dir", "{tmp}/out"],
             "export.py": ["--checkpoint_path", "unused.ckpt", "--file_name", "{tmp}/m"],
             "predict.py": ["--checkpoint_path", "unused.ckpt", "--image_path", SAMPLE]}

# Entry points run one after another in one fresh interpreter, each as ``python SCRIPT ARGS``
# runs it (``run_entry_point``, ``sys.argv[0]`` the script), its stderr file descriptor 2 (where
# MindSpore's own log goes too) sent to a file of its own; any other exception is printed
# there with its traceback, as the interpreter would. argv: JSON [[script, args], ...], the
# JSON file to write {script: {"returncode", "stderr"}} to.
IN_TURN = """\
import importlib, json, os, sys, tempfile, traceback
from src.utils.cli import run_entry_point
cases, results_path, results = json.loads(sys.argv[1]), sys.argv[2], {}
for script, args in cases:
    sys.argv = [os.path.abspath(script)]
    with tempfile.TemporaryFile("w+") as err:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            run_entry_point(importlib.import_module(script[:-3]).main, args)
            code = 0
        except SystemExit as stop:
            code = 0 if stop.code is None else stop.code
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        results[script] = {"returncode": code, "stderr": err.read()}
with open(results_path, "w", encoding="utf-8") as f:
    json.dump(results, f)
"""


@pytest.fixture(scope="module")
def gpu_refusals(tmp_path_factory):
    """The four entry points with ``--device_target GPU``, in one fresh interpreter
    (``IN_TURN``: MindSpore imported once, as none of them may set up a device before the
    check): each one's exit status and stderr, as ``run_entry``'s result."""
    if "GPU" in installed_targets():
        pytest.skip("this MindSpore runs on GPU")
    tmp = tmp_path_factory.mktemp("gpu")
    cases = [[script, ["--config_path", QUICK, "--device_target", "GPU",
                       *[a.format(tmp=tmp) for a in args]]] for script, args in GPU_CASES.items()]
    results = tmp / "results.json"
    run = subprocess.run([sys.executable, "-c", IN_TURN, json.dumps(cases), str(results)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    with open(results, encoding="utf-8") as f:
        return {script: subprocess.CompletedProcess([script], r["returncode"], "", r["stderr"])
                for script, r in json.load(f).items()}


@pytest.mark.slow
@pytest.mark.parametrize("script", list(GPU_CASES))
def test_a_device_target_mindspore_lacks_is_one_line(script, gpu_refusals):
    result = gpu_refusals[script]
    assert one_line_error(result) == (
        f"{script}: error: device_target GPU is not available: the installed MindSpore "
        f"{ms.__version__} runs on {', '.join(installed_targets())} only (a build without GPU, "
        f"or its CUDA libraries do not load); pass --device_target {installed_targets()[0]}")
    assert "[ERROR]" not in result.stderr  # refused before MindSpore's own attempt


def test_mindspore_s_unsupported_target_error_becomes_the_same_line(monkeypatch):
    """Where the backends cannot be asked beforehand, MindSpore's RuntimeError is turned into
    the line."""
    from src.utils import device

    def refuse(target, *args):
        raise RuntimeError(f"Unsupported device target {target}. This process only supports "
                           f"one of the ['CPU']. Please check ...")

    monkeypatch.setattr(device, "available_targets", lambda: None)
    monkeypatch.setattr(ms, "set_context", lambda **kwargs: None)
    monkeypatch.setattr(ms, "set_device", refuse)
    with pytest.raises(ConfigError) as info:
        device.setup_device("GRAPH", "Ascend")
    assert str(info.value) == (
        f"device_target Ascend is not available: the installed MindSpore {ms.__version__} runs "
        f"on CPU only (a build without Ascend, or its CANN libraries do not load); pass "
        f"--device_target CPU")


# ---- 19: two exports to one file at once ----

@pytest.mark.slow
def test_a_second_export_to_the_same_file_is_refused_while_the_first_runs(tmp_path, r18_2):
    out = tmp_path / "models"
    out.mkdir()
    lock_path = f"{out / 'model.onnx'}.lock"
    export = ["export.py", "--config_path", QUICK, "--class_num", 2, "--checkpoint_path", r18_2,
              "--file_format", "ONNX", "--file_name", out / "model"]
    with open(lock_path, "w", encoding="utf-8") as first:  # an export in progress (here)
        fcntl.flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB)
        first.write(f"{socket.gethostname()} {os.getpid()}\n")
        first.flush()
        result = run_entry(*export)
    os.remove(lock_path)  # as that export would at its end
    assert one_line_error(result) == (
        f"export.py: error: {out / 'model.onnx'} is being exported by another process (host and "
        f"process id: {socket.gethostname()} {os.getpid()}, lock file {lock_path}): wait for "
        f"it to end, or choose another --file_name")
    assert os.listdir(out) == []
    # the lock released: the export runs (in-process; the refusal above ran in another one)
    assert run_in_process(*export).returncode == 0
    assert os.listdir(out) == ["model.onnx"]  # and its lock file is gone


def test_an_export_lock_of_an_ended_process_is_taken_over_and_removed(tmp_path):
    from src.utils.files import FileLock
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True).stdout.strip()
    path = tmp_path / "model.onnx.lock"
    path.write_text(f"{socket.gethostname()} {ended}\n")
    lock = FileLock(str(path), str, "the export", remove=True)
    assert lock.acquire() == f"{socket.gethostname()} {ended}"
    assert path.read_text() == f"{socket.gethostname()} {os.getpid()}\n"
    lock.release()
    assert not path.exists()


# ---- 21: the commands in the recipe files' headers ----

HEADER_COMMAND = re.compile(r"^#\s{2,}((?:python|bash) .*)$")


def header_commands(path):
    """The commands of a recipe file's header comment (``#   python ...``, ``#   bash ...``),
    continuation lines joined."""
    commands, current = [], None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("#"):
                break
            text = line.rstrip("\n")
            if current is not None:
                current += " " + text.lstrip("#").strip()
            else:
                match = HEADER_COMMAND.match(text)
                current = match.group(1).strip() if match else None
            if current is not None and current.endswith("\\"):
                current = current[:-1].rstrip()
                continue
            if current is not None:
                commands.append(current)
            current = None
    return commands


RECIPES = sorted(f for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".yaml"))


def test_header_commands_are_found():
    found = {name: header_commands(os.path.join(ROOT, "configs", name)) for name in RECIPES}
    assert found["resnet50_torchvision_v2.yaml"] == [
        "bash scripts/run_distribute_train.sh /data/imagenet/train "
        "configs/resnet50_torchvision_v2.yaml output/r50_tv2"]
    assert found["resnet18_cifar10.yaml"][0].startswith(
        "python train.py --config_path configs/resnet18_cifar10.yaml --data_path ")
    assert sum(map(len, found.values())) >= 6


def is_launcher(script):
    """Whether ``script`` is a distributed launcher (``scripts/launch_lib.sh``'s options)."""
    with open(os.path.join(ROOT, script), encoding="utf-8") as f:
        return "launch_lib.sh" in f.read()


def script_usage(script):
    """The arguments of a script's own usage line (``#   bash scripts/NAME ARGS``)."""
    with open(os.path.join(ROOT, script), encoding="utf-8") as f:
        for line in f:
            match = re.match(rf"^#\s+bash {re.escape(script)}(.*)$", line)
            if match:
                return match.group(1).split()
    raise AssertionError(f"{script} has no usage line")


def launcher_train_args(command, tmp_path):
    """Run a launcher command as written from a copy of the repository's layout (``configs``,
    ``config.yaml`` linked; absolute data paths made as empty folders), with a stand-in
    msrun; return the train.py arguments msrun got."""
    words = command.split()
    for name in ("configs", "config.yaml"):
        if not (tmp_path / name).exists():
            os.symlink(os.path.join(ROOT, name), tmp_path / name)
    for i, word in enumerate(words[2:], 2):
        if word.startswith("/") and not os.path.exists(word):
            words[i] = str(tmp_path / word.lstrip("/"))
            os.makedirs(words[i], exist_ok=True)
    argv_file = tmp_path / "msrun_argv"
    msrun = tmp_path / "msrun"
    msrun.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "{argv_file}"\n')
    msrun.chmod(msrun.stat().st_mode | stat.S_IEXEC)
    result = subprocess.run(["bash", os.path.join(ROOT, words[1]), *words[2:]], cwd=tmp_path,
                            env=dict(os.environ, MSRUN=str(msrun), RANK_TABLE_FILE=""),
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, f"{command}: {result.stderr}"
    argv = argv_file.read_text().splitlines()
    return argv[next(i for i, a in enumerate(argv) if a.endswith("train.py")) + 1:]


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_header_commands_parse(name, tmp_path):
    """Every command in a recipe file's header runs as written: an entry point's arguments
    parse (known keys, valid values), a launcher accepts its own and hands train.py ones that
    parse."""
    defaults, _, _ = load_schema()
    for command in header_commands(os.path.join(ROOT, "configs", name)):
        words = command.split()
        assert os.path.isfile(os.path.join(ROOT, words[1])), command
        if words[0] == "python":
            args = words[2:]
        elif is_launcher(words[1]):
            args = launcher_train_args(command, tmp_path)
        else:  # another script (the quick start installs and trains): its own usage line
            assert len(words) - 2 <= len(script_usage(words[1])), command
            continue
        flags = re.findall(r"(?:^|\s)--(\w+)", " ".join(args))
        assert set(flags) <= set(defaults) | {"config_path"}, command
        cwd = os.getcwd()
        os.chdir(ROOT if words[0] == "python" else tmp_path)
        try:
            cfg = parse_config(args)
        finally:
            os.chdir(cwd)
        assert os.path.basename(cfg.config_path) == name, command


def test_an_output_pipe_closed_by_its_reader_ends_quietly():
    """``predict.py ... | head -1``: the reader closes the pipe while the entry point still
    prints: exit 141 (128 + SIGPIPE), no BrokenPipeError traceback."""
    script = ("import sys\nfrom src.utils.cli import run_entry_point\n"
              "def main(argv):\n"
              "    for i in range(200000):\n"
              "        print('{\"image\": %d}' % i)\n"
              "    return 0\n"
              "run_entry_point(main)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith('{"image": 0}')
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
