"""The training runs of K-fold cross-validation (``label_issues.py``): each fold is train.py
in a child process (or the data-parallel launcher of ``scripts/``) with ``--resume_ckpt
auto`` in the fold's own output folder, so that an interrupted fold resumes where its last
checkpoint left it; a fold whose last epoch's checkpoint exists is not trained again. A stop
signal to the command is passed on to the fold's process group once, and the command waits
for it. See docs/label_issues.md.
"""
import glob
import os
import re
import signal
import subprocess
import sys

from src.utils.checkpoint import NAME, read_checkpoint, stored_data
from src.utils.cli import StopSignal
from src.utils.config import ROOT
from src.utils.errors import UserError

LAUNCH_SCRIPTS = {"CPU": "run_distribute_train_cpu.sh", "GPU": "run_distribute_train_gpu.sh",
                  "Ascend": "run_distribute_train.sh"}
"""The data-parallel launcher in ``scripts/`` per ``device_target``."""


class FoldError(UserError):
    """A fold's training ended with another status than 0; the command exits with it."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.exit_status = status


def fold_command(recipe: str, data_path: str, output_dir: str, *, fresh: bool,
                 launcher: str | None = None, device_num: int = 1,
                 label_file: str = "") -> list[str]:
    """The command line that trains one fold.

    Args:
        recipe: The training keys (a recipe file: ``--config_path``).
        data_path: The fold's class-folder root (its training part), or with ``label_file``
            the folder its rows are relative to.
        output_dir: The fold's train.py output folder.
        fresh: No checkpoint there yet: ``--overwrite true`` moves the files of a run stopped
            before its first checkpoint aside (train.py's rule) instead of refusing.
        launcher: None: ``python train.py``; a ``device_target``: its data-parallel script
            (``LAUNCH_SCRIPTS``), ``device_num`` processes (1: the script's default), which
            passes the flags after its 3 positional arguments on to train.py.
        label_file: ``task multilabel``: the fold's training rows, passed as an absolute
            ``--label_file`` (the launcher makes its own paths absolute too); "" none.

    Returns:
        list[str]: The command, ending with ``--resume_ckpt auto`` (and ``--overwrite true``
        when ``fresh``).
    """
    if launcher is None:
        command = [sys.executable, os.path.join(ROOT, "train.py"), "--config_path", recipe,
                   "--data_path", data_path, "--output_dir", output_dir]
    else:
        command = ["bash", os.path.join(ROOT, "scripts", LAUNCH_SCRIPTS[launcher])]
        command += ["--device_num", str(device_num)] if device_num > 1 else []
        command += [data_path, recipe, output_dir]
    command += ["--label_file", os.path.abspath(label_file)] if label_file else []
    return command + ["--resume_ckpt", "auto"] + (["--overwrite", "true"] if fresh else [])


def newest_checkpoint(output_dir: str, prefix: str) -> tuple[int, int, str] | None:
    """The newest training checkpoint ``prefix-EPOCH_STEP.ckpt`` in ``output_dir`` as
    (epoch, step in the epoch, path), or None."""
    own = re.compile(re.escape(prefix) + r"-\d+_\d+\.ckpt")
    found = [(int(m.group(1)), int(m.group(2)), path)
             for path in glob.glob(os.path.join(glob.escape(output_dir), f"{prefix}-*_*.ckpt"))
             if own.fullmatch(os.path.basename(path)) and (m := NAME.search(path))]
    return max(found) if found else None


def finished_checkpoint(output_dir: str, prefix: str, epoch_size: int) -> str | None:
    """The checkpoint of a finished training run in ``output_dir``: the newest one, if it is
    at the last step of epoch ``epoch_size`` (its stored steps per epoch); else None.

    Raises:
        CheckpointError: If that checkpoint cannot be read.
    """
    newest = newest_checkpoint(output_dir, prefix)
    if newest is None or newest[0] != epoch_size:
        return None
    data = stored_data(read_checkpoint(newest[2]))
    return newest[2] if data and newest[1] == data["steps_per_epoch"] else None


def run_fold(command: list[str], what: str, log_file: str) -> None:
    """Run ``command`` in a process group of its own and wait for it. A stop signal to this
    process is sent on to that group (each one: a second one ends train.py at once), and is
    raised again once the group's leader has ended.

    Raises:
        FoldError: If it ends with another status than 0 (a signal N: 128 + N), naming
            ``what`` and its ``log_file`` (or that it ended before writing it).
        StopSignal: After passing it on.
    """
    env = dict(os.environ, PYTHON=sys.executable)  # the launch scripts start this Python
    process = subprocess.Popen(command, env=env, start_new_session=True)
    stopped = None
    while True:
        try:
            status = process.wait()
            break
        except StopSignal as stop:
            stopped = stopped or stop
            try:
                os.killpg(process.pid, stop.signum)
            except ProcessLookupError:  # it has ended already
                pass
    if stopped is not None:
        raise stopped
    if status:
        killed = f" (killed by {signal.Signals(-status).name})" if status < 0 else ""
        status = 128 - status if status < 0 else status
        then = (f"its lines are above and in {log_file}. Rerun the same command to resume it"
                if os.path.isfile(log_file) else
                f"its lines are above (it ended before training, without a "
                f"{os.path.basename(log_file)}): fix what they name and run the command again")
        raise FoldError(f"{what}: training ended with status {status}{killed}; {then}", status)


def started_folds(output_dir: str, held_out_file: str) -> list[str]:
    """The fold folders of ``output_dir`` (``fold_K``) holding something trained or predicted:
    a checkpoint in ``fold_K/train`` or the fold's ``held_out_file``; sorted."""
    folds = os.path.join(glob.escape(output_dir), "fold_*")
    trained = glob.glob(os.path.join(folds, "train", "*.ckpt"))
    predicted = glob.glob(os.path.join(folds, held_out_file))
    return sorted({os.path.dirname(os.path.dirname(path)) for path in trained}
                  | {os.path.dirname(path) for path in predicted})
