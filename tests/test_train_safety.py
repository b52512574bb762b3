"""Nothing is lost and nothing is hidden: one run per output folder, only a run's own
checkpoints pruned, a checkpoint that cannot be written fails the run, atomic saves reach the
disk, ranks agree on the resume step, signals at any time, user errors vs bugs."""
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import RunContext

from src.training.callbacks import StepState, TrainMonitor
from src.training.output_dir import prepare_output_dir
from src.training.resume import agree_across_ranks
from src.training.saver import CheckpointSaver
from src.training.signals import StopSignals
from src.utils.checkpoint import atomic_save_checkpoint, checkpoint_name
from src.utils.config import ConfigError
from src.utils.errors import OutputDirError
from tests.helpers import ROOT, run_in_process, slow_beyond

LOG = logging.getLogger("test")
QUICK = ["--config_path", "configs/quick_start.yaml", "--train_image_size", "32",
         "--eval_image_size", "32", "--batch_size", "16",
         "--epoch_size", "1", "--run_eval", "false", "--num_parallel_workers", "2",
         "--log_interval", "1"]


class Params(dict):
    """Stands in for ``RunContext.original_args()``."""
    __getattr__ = dict.__getitem__


def write_file(path, text="x"):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


# ---- one run per output folder ----

def test_a_fresh_run_refuses_a_folder_with_another_runs_checkpoints(tmp_path):
    write_file(tmp_path / "resnet18-3_10.ckpt")
    write_file(tmp_path / "metrics.jsonl", '{"epoch": 3}\n')
    with pytest.raises(OutputDirError) as info:
        prepare_output_dir(str(tmp_path), starts_fresh=True, overwrite=False)
    message = str(info.value)
    assert str(tmp_path) in message and "--resume_ckpt auto" in message
    assert "--output_dir" in message and "--overwrite true" in message
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "resnet18-3_10.ckpt"]  # untouched
    # a run that continues there is fine
    assert prepare_output_dir(str(tmp_path), starts_fresh=False, overwrite=False) is None


def test_overwrite_moves_the_earlier_run_aside_and_deletes_nothing(tmp_path):
    files = {"resnet18-3_10.ckpt": "ckpt", "resnet18-best.ckpt": "best",
             "metrics.jsonl": "records", "config.yaml": "cfg", "train.log": "log"}
    for name, text in files.items():
        write_file(tmp_path / name, text)
    moved = prepare_output_dir(str(tmp_path), starts_fresh=True, overwrite=True)
    assert os.path.dirname(moved) == str(tmp_path)
    assert {n: open(os.path.join(moved, n)).read() for n in os.listdir(moved)} == files
    assert os.listdir(tmp_path) == [os.path.basename(moved)]
    # twice in the same second: a second folder, nothing overwritten
    write_file(tmp_path / "metrics.jsonl", "second")
    again = prepare_output_dir(str(tmp_path), starts_fresh=True, overwrite=True)
    assert again != moved and open(os.path.join(again, "metrics.jsonl")).read() == "second"


def test_start_up_leftovers_do_not_block_a_fresh_run(tmp_path):
    write_file(tmp_path / "config.yaml")
    write_file(tmp_path / "train.log")
    assert prepare_output_dir(str(tmp_path), starts_fresh=True, overwrite=False) is None


def test_train_py_refuses_to_mix_runs_and_keeps_the_old_records(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    write_file(out / "resnet18-8_31.ckpt", "another run")
    write_file(out / "metrics.jsonl", "another run's records\n")
    result = run_in_process("train.py", *QUICK, "--output_dir", out)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"output_dir {out} holds another run's files" in result.stderr
    assert open(out / "metrics.jsonl").read() == "another run's records\n"
    # the lock it took stays, naming its last holder
    assert sorted(os.listdir(out)) == [".run.lock", "metrics.jsonl", "resnet18-8_31.ckpt"]


# ---- the saver: own files only, failures stop the run ----

def saver_context(net):
    context = RunContext(Params(train_network=net, cur_epoch_num=1, net_outputs=None))
    return context


def run_steps(state, saver, context, steps):
    for _ in range(steps):
        state.global_step += 1
        saver.on_train_step_end(context)


def test_keep_checkpoint_max_prunes_only_files_this_run_wrote(tmp_path):
    foreign = tmp_path / checkpoint_name("net", 90, 10)  # a later position than ours
    write_file(foreign, "another run")
    earlier = tmp_path / checkpoint_name("net", 2, 10)  # the resumed run's own, before us
    write_file(earlier, "ours, before the resume")
    state = StepState(start_step=2)
    saver = CheckpointSaver(state, StopSignals(LOG), output_dir=str(tmp_path), prefix="net",
                            steps_per_epoch=10, total_steps=100, save_steps=2, keep_max=2,
                            own_files=[str(earlier)])
    run_steps(state, saver, saver_context(nn.Dense(2, 2)), 6)  # saves at steps 4, 6, 8
    assert sorted(os.listdir(tmp_path)) == sorted(
        [foreign.name, checkpoint_name("net", 6, 10), checkpoint_name("net", 8, 10)])
    assert saver.last_saved == str(tmp_path / checkpoint_name("net", 8, 10))


def test_a_checkpoint_that_cannot_be_written_stops_the_run(tmp_path, monkeypatch):
    import src.training.saver

    state = StepState()
    saver = CheckpointSaver(state, StopSignals(LOG), output_dir=str(tmp_path), prefix="net",
                            steps_per_epoch=10, total_steps=100, save_steps=2)
    context = saver_context(nn.Dense(2, 2))
    run_steps(state, saver, context, 2)
    good = saver.last_saved
    assert good and not context.get_stop_requested()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(src.training.saver, "atomic_save_checkpoint", disk_full)
    run_steps(state, saver, context, 2)
    assert context.get_stop_requested() and "No space left on device" in saver.error
    assert saver.last_saved == good


def test_non_finite_parameters_are_not_saved_and_stop_the_run(tmp_path):
    net = nn.Dense(2, 2)
    net.weight.set_data(ms.Tensor(np.full((2, 2), np.nan, np.float32)))
    state = StepState()
    saver = CheckpointSaver(state, StopSignals(LOG), output_dir=str(tmp_path), prefix="net",
                            steps_per_epoch=10, total_steps=100, save_steps=1)
    context = saver_context(net)
    run_steps(state, saver, context, 1)
    assert "non-finite parameters" in saver.error and context.get_stop_requested()
    assert os.listdir(tmp_path) == []


def test_finish_exit_status_names_the_last_good_checkpoint(tmp_path, caplog):
    from src.training.loop import TrainCallbacks, finish

    state, stop = StepState(start_step=7), StopSignals(LOG)
    saver = CheckpointSaver(state, stop, output_dir=str(tmp_path), prefix="net", steps_per_epoch=10,
                            total_steps=20)
    monitor = TrainMonitor(state, lr=np.zeros(20, np.float32), global_batch_size=8,
                           steps_per_epoch=10, log_interval=1, metrics_path=None, logger=LOG)
    cbs = TrainCallbacks(state=state, saver=saver, monitor=monitor)
    saver.error, saver.last_saved = "cannot write checkpoint x: disk full", "net-1_6.ckpt"
    with caplog.at_level(logging.INFO):
        assert finish(cbs, stop, 20, str(tmp_path), LOG) == 4
    assert "last good checkpoint: net-1_6.ckpt" in caplog.text
    saver.error = None
    monitor.error = "cannot write metrics.jsonl: No space left on device"
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert finish(cbs, stop, 20, str(tmp_path), LOG) == 4
    assert "stopped: cannot write metrics.jsonl: No space left on device; last good " \
           "checkpoint: net-1_6.ckpt" in caplog.text
    monitor.error = None
    stop.received = "SIGTERM"
    assert finish(cbs, stop, 20, str(tmp_path), LOG) == 143
    state.global_step = 20  # the signal came after the last step: the run is complete
    assert finish(cbs, stop, 20, str(tmp_path), LOG) == 0


def test_atomic_save_flushes_the_file_before_the_rename_and_the_folder_after(tmp_path,
                                                                            monkeypatch):
    import src.utils.checkpoint

    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.path.isdir(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("rename", None))
        real_replace(src, dst)

    monkeypatch.setattr(src.utils.checkpoint.os, "fsync", fsync)
    monkeypatch.setattr(src.utils.checkpoint.os, "replace", replace)
    path = str(tmp_path / "a.ckpt")
    atomic_save_checkpoint(nn.Dense(2, 2), path)
    assert events == [("fsync", False), ("rename", None), ("fsync", True)]
    assert set(ms.load_checkpoint(path)) == {"weight", "bias"}
    assert os.listdir(tmp_path) == ["a.ckpt"]


# ---- ranks agree on the resume checkpoint ----

class ThreadGather:
    """An all-gather between threads standing for ranks (each call is a collective); with a
    ``timeout`` (s), a rank missing from one breaks it (``BrokenBarrierError``) instead of
    leaving the others waiting for ever."""

    def __init__(self, ranks, timeout=None):
        self.barrier = threading.Barrier(ranks, timeout=timeout)
        self.values = [None] * ranks

    def gather(self, rank, value):
        self.barrier.wait()
        self.values[rank] = value
        self.barrier.wait()
        result = list(self.values)
        self.barrier.wait()
        return result


def fake_checkpoint(folder, step):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, checkpoint_name("net", step, 10))
    net = nn.Dense(2, 2)
    ms.save_checkpoint(net, path, append_dict={"global_step": step, "train_step": step})
    return path


def agree(dirs, local_paths):
    """Run ``agree_across_ranks`` on one thread per rank; return each rank's result or error."""
    group = ThreadGather(len(dirs))
    results = [None] * len(dirs)

    def rank_main(rank):
        try:
            results[rank] = agree_across_ranks(local_paths[rank], dirs[rank], "net",
                                               steps_per_epoch=10, param_names=["weight", "bias"],
                                               gather=lambda v: group.gather(rank, v))
        except ConfigError as err:
            results[rank] = err

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(len(dirs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_ranks_follow_rank_0_and_fail_together_without_its_file(tmp_path):
    dirs = [str(tmp_path / f"host{r}") for r in range(3)]
    shared = [fake_checkpoint(d, 16) for d in dirs]
    newer = fake_checkpoint(dirs[2], 19)  # rank 2 has a newer file: rank 0 decides
    assert agree(dirs, [shared[0], shared[1], newer]) == shared
    os.remove(shared[1])  # rank 1's host has no copy: every rank stops with the same message
    results = agree(dirs, [shared[0], "", newer])
    assert all(isinstance(r, ConfigError) for r in results), results
    assert all("ranks [1]" in str(r) and "net-2_6.ckpt" in str(r) for r in results)
    # rank 0 starts from scratch: every rank does
    assert agree(dirs, ["", shared[0], newer]) == ["", "", ""]


# ---- signals ----

@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_exits_at_once(second):
    """The second may be a SIGTERM: MindSpore turns a Ctrl-C during a step into one."""
    exits = []
    stop = StopSignals(LOG, exit_now=exits.append)
    stop.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.received == "SIGINT" and exits == []
        os.kill(os.getpid(), second)
        time.sleep(0.05)
        assert exits == [128 + second] and stop.received == "SIGINT"
    finally:
        stop.restore()


@pytest.mark.parametrize("signum", slow_beyond([signal.SIGTERM, signal.SIGINT], (signal.SIGINT,)))
def test_a_signal_during_start_up_stops_with_a_message(tmp_path, signum):
    """Handlers are in place before the data check and graph compilation; Ctrl-C there
    exits 130 (the shell's status for SIGINT), SIGTERM 143."""
    out = str(tmp_path / "run")
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *QUICK,
                             "--output_dir", out], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # the first log line: the run is still starting up
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=300)
    name = signal.Signals(signum).name
    assert first, stderr[-2000:]
    assert proc.returncode == 128 + signum, stdout[-2000:] + stderr[-2000:]
    assert f"stopped by {name} at global step" in stdout


# ---- errors: the user's get one line, bugs keep their traceback ----

def test_only_user_errors_become_one_line(capsys):
    from src.utils.cli import run_entry_point

    def bad_value(argv):
        raise ConfigError("batch_size must be positive, got 0")

    with pytest.raises(SystemExit) as exit_info:
        run_entry_point(bad_value)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.endswith("error: batch_size must be positive, got 0\n")

    def bug(argv):
        raise ValueError("shapes (3,) and (4,) not aligned")  # e.g. numpy, from our own bug

    with pytest.raises(ValueError, match="not aligned"):
        run_entry_point(bug)
    with pytest.raises(KeyError):
        run_entry_point(lambda argv: {}["missing"])


@pytest.mark.parametrize("script", ["train.py", "eval.py", "predict.py", "export.py"])
def test_a_signal_while_the_imports_load_is_one_line(script):
    """MindSpore takes seconds to import; a SIGTERM then used to end the process silently."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, script), "--help"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # importing src.env, src.startup and then MindSpore (several seconds)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stdout[-1000:] + stderr[-1000:]
    assert stderr.strip().splitlines() == [f"{script}: stopped by SIGTERM"]


def test_a_signal_while_an_entry_point_runs_cleans_up_and_is_one_line(capsys):
    from src.utils.cli import run_entry_point
    cleaned = []

    def main(argv):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            cleaned.append(True)  # e.g. an export's temporary file removed

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as exit_info:
            run_entry_point(main)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert exit_info.value.code == 128 + signal.SIGTERM and cleaned == [True]
    assert capsys.readouterr().err.endswith("stopped by SIGTERM\n")
