"""One training run stopped three times and resumed each time: killed with SIGKILL (after it
logged TensorBoard events past its newest checkpoint), then, resumed, stopped by SIGTERM, then
by SIGINT, then resumed to its end in the test process. Built once per session
(``interrupted_run`` in conftest.py) for the resume checks of test_resume.py (every stop resumes
exactly) and the TensorBoard checks of test_tracking.py (one curve over the four processes).
"""
import glob
import os
import signal
import subprocess
import sys
import time

from tests.helpers import CIFAR_SAMPLE, ROOT, copy_class_folders, run_in_process

# ResNet-18, 32 px, 80 real images, batch 8: 10 steps per epoch, 30 in all, a checkpoint every
# 3 steps and at each epoch's end, all kept; a progress line every step. Two data workers, so
# the data order must be the same in every process.
ARGS = ["--config_path", "configs/quick_start.yaml", "--train_image_size", "32",
        "--eval_image_size", "32", "--eval_resize", "32",
        "--batch_size", "8", "--epoch_size", "3", "--save_checkpoint_steps", "3",
        "--save_checkpoint_epochs", "1", "--keep_checkpoint_max", "20", "--run_eval", "false",
        "--num_parallel_workers", "2", "--log_interval", "1"]
# The interrupted run (and its uninterrupted twin) also evaluate 30 real images each epoch
# (records, the best score) and log to TensorBoard (the curves of every step).
TRACKED = ["--run_eval", "true", "--eval_interval", "1", "--tensorboard", "true"]
STEPS_PER_EPOCH, STEPS = 10, 30
FINAL = "resnet18-3_10.ckpt"


def train_args(run, out, *extra):
    """train.py's arguments of the interrupted run (``ARGS``, ``TRACKED``) on ``run``'s data
    (the fixture's dict) into ``out``."""
    return [*ARGS, *TRACKED, "--data_path", run["data"], "--eval_data_path", run["test"],
            "--output_dir", str(out), *extra]


def saved_steps(out, steps_per_epoch=STEPS_PER_EPOCH, net="resnet18"):
    """Global steps of the finished periodic checkpoints in ``out`` (not a save in progress)."""
    steps = []
    for name in glob.glob(os.path.join(out, f"{net}-*_*.ckpt")):
        if name.endswith(".partial.ckpt"):
            continue
        epoch, step = os.path.basename(name)[len(net) + 1:-len(".ckpt")].split("_")
        steps.append((int(epoch) - 1) * steps_per_epoch + int(step))
    return sorted(steps)


def logged_steps(folder):
    """Steps of the ``train/loss`` events TensorBoard's reader finds in ``folder``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    reader.Reload()
    if "train/loss" not in reader.Tags()["scalars"]:
        return []
    return [e.step for e in reader.Scalars("train/loss")]


def records(out):
    """The lines of ``out``'s metrics.jsonl (none before the first epoch ends)."""
    path = os.path.join(out, "metrics.jsonl")
    return open(path, encoding="utf-8").readlines() if os.path.exists(path) else []


def _start(run, out, *extra):
    """train.py with ``ARGS`` in a fresh interpreter (a process the test can signal)."""
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"),
                             *train_args(run, out, *extra)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _kill_past_a_checkpoint(run, out):
    """Start the run and SIGKILL it once TensorBoard holds a step after its newest checkpoint
    (an event a resumed run must hide), early enough to leave steps for two more stops.
    Returns what the checks read: the exit status, the saved steps and the steps logged at
    the kill."""
    proc = _start(run, out)
    deadline, logged, done = time.time() + 300, [], []
    try:
        while proc.poll() is None and time.time() < deadline:
            done = saved_steps(out)
            if done and done[-1] < STEPS - 3 and os.path.isdir(os.path.join(out, "tensorboard")):
                logged = logged_steps(os.path.join(out, "tensorboard"))
                if logged and logged[-1] > done[-1]:
                    break
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)
    return {"code": proc.returncode, "saved": saved_steps(out), "logged": logged,
            "stderr": stderr[-3000:]}


def _stop_at_the_next_checkpoint(run, out, signum):
    """Resume the run (``--resume_ckpt auto``) and send ``signum`` as soon as it writes a
    checkpoint. Returns the exit status, the output, and the checkpoints and records of the
    folder right after the stop."""
    before = set(saved_steps(out))
    proc = _start(run, out, "--resume_ckpt", "auto")
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline and not set(saved_steps(out)) - before:
        time.sleep(0.02)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    return {"signal": signal.Signals(signum).name, "code": proc.returncode, "stdout": stdout,
            "stderr": stderr[-3000:], "saved": saved_steps(out), "records": records(out)}


def build_interrupted_run(folder):
    """Copy the data (8 train and 3 test images of each CIFAR-10 class, from the shipped
    sample) into ``folder``, run it as the module docstring says into ``folder``/run.

    Returns:
        dict: ``data``, ``test``, ``out``; ``killed`` (``code``, ``saved``, ``logged``),
        ``stops`` (the SIGTERM and the SIGINT run: ``signal``, ``code``, ``stdout``,
        ``saved``, ``records``), ``final`` (the last resume: ``code``, ``stdout``).
    """
    run = {"data": copy_class_folders(os.path.join(CIFAR_SAMPLE, "train"),
                                      os.path.join(folder, "train"), 8),
           "test": copy_class_folders(os.path.join(CIFAR_SAMPLE, "test"),
                                      os.path.join(folder, "test"), 3),
           "out": os.path.join(folder, "run")}
    run["killed"] = _kill_past_a_checkpoint(run, run["out"])
    run["stops"] = [_stop_at_the_next_checkpoint(run, run["out"], signum)
                    for signum in (signal.SIGTERM, signal.SIGINT)]
    final = run_in_process("train.py", *train_args(run, run["out"], "--resume_ckpt", "auto"))
    run["final"] = {"code": final.returncode, "stdout": final.stdout,
                    "stderr": final.stderr[-3000:]}
    return run
