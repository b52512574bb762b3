"""One run per output folder: a lock taken at start-up, before anything is written; a stale
lock taken over; ``--overwrite`` never moves the lock; a folder of checkpoints alone refused."""
import contextlib
import json
import os
import subprocess
import sys

import pytest

from src.training.output_dir import LOCK_FILE, OutputDirLock, prepare_output_dir, trim_records
from src.utils.errors import OutputDirError
from src.utils.files import check_output_dir
from tests.helpers import file_size_limit, run_entry, run_in_process

TRAIN = ["--config_path", "configs/quick_start.yaml", "--num_parallel_workers", "1",
         "--run_eval", "false", "--epoch_size", "1"]


def test_a_second_run_into_a_locked_folder_fails_at_once_naming_the_holder(tmp_path,
                                                                          cifar_small):
    out = tmp_path / "run"
    holder = OutputDirLock(str(out))
    holder.acquire()  # a run in progress (this process)
    result = run_entry("train.py", *TRAIN, "--data_path", cifar_small["train"],
                       "--output_dir", out, "--batch_size", "8")
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"output_dir {out} is in use by another run" in result.stderr
    assert f"process id: {os.uname().nodename} {os.getpid()}" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(os.listdir(out)) == [LOCK_FILE]  # nothing written: no log, no config


def test_the_lock_is_exclusive_between_processes(tmp_path):
    holder = OutputDirLock(str(tmp_path))
    holder.acquire()
    code = ("import sys; from src.training.output_dir import OutputDirLock; "
            "from src.utils.errors import OutputDirError\n"
            "try:\n    OutputDirLock(sys.argv[1]).acquire()\n"
            "except OutputDirError as e:\n    print(e); sys.exit(2)")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert result.returncode == 2 and "in use by another run" in result.stdout


def test_the_lock_of_an_ended_process_is_taken_over_and_named(tmp_path):
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True).stdout.strip()
    (tmp_path / LOCK_FILE).write_text(f"{os.uname().nodename} {ended}\n")
    lock = OutputDirLock(str(tmp_path))
    assert lock.acquire() == f"{os.uname().nodename} {ended}"
    assert (tmp_path / LOCK_FILE).read_text() == f"{os.uname().nodename} {os.getpid()}\n"


def test_overwrite_moves_the_earlier_run_but_not_the_lock(tmp_path):
    lock = OutputDirLock(str(tmp_path))
    lock.acquire()
    for name in ("resnet18-1_10.ckpt", "metrics.jsonl", "train.log"):
        (tmp_path / name).write_text("x")
    moved = prepare_output_dir(str(tmp_path), starts_fresh=True, overwrite=True)
    assert sorted(os.listdir(moved)) == ["metrics.jsonl", "resnet18-1_10.ckpt", "train.log"]
    assert (tmp_path / LOCK_FILE).read_text().endswith(f" {os.getpid()}\n")


def test_a_folder_holding_only_checkpoints_is_refused(tmp_path):
    (tmp_path / "resnet18-3_10.ckpt").write_text("x")  # no metrics.jsonl
    with pytest.raises(OutputDirError, match="holds another run's files \\(resnet18-3_10.ckpt"):
        prepare_output_dir(str(tmp_path), starts_fresh=True, overwrite=False)
    assert prepare_output_dir(str(tmp_path), starts_fresh=False, overwrite=False) is None


def test_the_output_check_without_create_leaves_nothing_and_names_a_file_in_the_way(tmp_path):
    """``create=False`` (eval.py): a missing folder is checked in its nearest existing parent
    and not made; a file where the folder or a parent goes is named; the default makes it."""
    missing = tmp_path / "a" / "b"
    check_output_dir(str(missing), create=False)
    assert os.listdir(tmp_path) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputDirError, match="is a file, not a folder"):
        check_output_dir(str(tmp_path / "file"), create=False)
    with pytest.raises(OutputDirError, match=f"{tmp_path / 'file'} is a file, not a folder"):
        check_output_dir(str(tmp_path / "file" / "out"), create=False)
    check_output_dir(str(missing))  # create=True (the default) makes it
    assert missing.is_dir()


@contextlib.contextmanager
def immutable_folder(folder):
    """Make the empty folder ``folder`` immutable (``chattr +i``) for the block, then mutable
    again; skips the test where the filesystem has no such flag. Root writes into a chmod-000
    folder; an immutable one it cannot."""
    folder.mkdir()
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available on this filesystem")
    try:
        yield folder
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_the_output_check_without_create_names_an_unwritable_parent(tmp_path):
    with immutable_folder(tmp_path / "locked") as locked:
        with pytest.raises(OutputDirError, match="is not writable: Operation not permitted"):
            check_output_dir(str(locked / "out"), create=False)
    assert os.listdir(locked) == []


@pytest.mark.parametrize("script", ["train.py", "eval.py"])
def test_an_output_dir_that_is_a_file_is_named_before_any_work(tmp_path, script):
    target = tmp_path / "results"
    target.write_text("not a folder")
    result = run_in_process(script, "--config_path", "configs/quick_start.yaml", "--output_dir",
                            target, "--checkpoint_path", "missing.ckpt")
    assert result.returncode == 2
    assert result.stderr.strip().endswith(f"output_dir {target} is a file, not a folder")


def test_an_unwritable_output_dir_is_named_at_start_up(tmp_path):
    with immutable_folder(tmp_path / "read_only") as target:
        result = run_in_process("train.py", "--config_path", "configs/quick_start.yaml",
                                "--output_dir", target)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().endswith(
        f"output_dir {target} is not writable: Operation not permitted")
    assert os.listdir(target) == []


@pytest.mark.slow
def test_eval_on_a_full_disk_exits_4_and_keeps_the_earlier_result(tmp_path, cifar_small):
    import mindspore as ms

    from src.models.resnet import create_network

    ckpt = str(tmp_path / "r18.ckpt")  # any network: the result file is what is written
    ms.save_checkpoint(create_network("resnet18", class_num=10), ckpt)
    out = tmp_path / "eval"
    out.mkdir()
    earlier = '{"top1": 0.5}'
    (out / "eval_result.json").write_text(earlier)
    result = subprocess.run([sys.executable, "eval.py", "--config_path",
                             "configs/quick_start.yaml", "--checkpoint_path", ckpt,
                             "--data_path", cifar_small["test"], "--output_dir", str(out)],
                            cwd=os.path.dirname(os.path.dirname(__file__)), text=True,
                            capture_output=True, preexec_fn=file_size_limit(64), timeout=600)
    assert result.returncode == 4, result.stderr[-2000:]
    assert f"cannot write {out / 'eval_result.json'}: File too large" in result.stderr
    assert (out / "eval_result.json").read_text() == earlier
    assert sorted(os.listdir(out)) == ["eval_result.json"]


def test_records_after_the_resumed_checkpoint_are_dropped_once(tmp_path):
    records = [{"epoch": e, "step": 10 * e, "loss": 1.0} for e in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert trim_records(str(tmp_path), 20) == 1  # killed after epoch 3's record, before its save
    kept = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["epoch"] for r in kept] == [1, 2]
    assert trim_records(str(tmp_path), 20) == 0
    assert trim_records(str(tmp_path / "none"), 20) == 0
