"""Helpers shared by the tests: paths, copying real images, running entry points."""
import contextlib
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Real images shipped in the repository: enough for every test but the large real-data checks.
CIFAR_SAMPLE = os.path.join(ROOT, "data", "cifar10_sample")
IMAGENET_SMALL = os.path.join(ROOT, "data", "imagenet_sample_small")
GREYSCALE_JPEG = os.path.join(IMAGENET_SMALL, "n02096051", "n02096051_Airedale.JPEG")
# The full real data sets beside the repository (CI has them; a fresh clone may not).
SHARED_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")


def slow_beyond(values, fast):
    """``values`` for ``pytest.mark.parametrize``, each whose value (first value, for a tuple)
    is not in ``fast`` marked ``slow``: the fast tier (``-m "not slow"``) runs a check on its
    small cases, the full suite on all.

    Returns:
        list: The values, the slow ones as ``pytest.param(..., marks=pytest.mark.slow)``.
    """
    import pytest

    params = []
    for value in values:
        args = value if isinstance(value, tuple) else (value,)
        params.append(value if args[0] in fast else pytest.param(*args, marks=pytest.mark.slow))
    return params


def imagenet_images():
    """Paths of the shipped ImageNet JPEGs, one per class folder, in class (sorted wnid) order.

    Returns:
        list[str]: Image paths.
    """
    return [os.path.join(IMAGENET_SMALL, w, sorted(os.listdir(os.path.join(IMAGENET_SMALL, w)))[0])
            for w in sorted(os.listdir(IMAGENET_SMALL))]


def require_shared_data(path, environ):
    """``path`` (the shared real data) if it is a folder; otherwise skip the calling test with
    the reason, or fail it when ``environ`` has ``CI`` set to a true value (CI has the data,
    so its absence there is an error, never a silent skip).

    Returns:
        str: ``path``.

    Raises:
        pytest.skip.Exception: If ``path`` is missing outside CI.
        pytest.fail.Exception: If ``path`` is missing in CI.
    """
    import pytest

    if os.path.isdir(path):
        return path
    reason = (f"large real-data check: needs ../shared/data beside the repository ({path} does "
              f"not exist; see data/README.md)")
    if environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason}; CI is set, so a missing data folder is a failure")
    pytest.skip(reason)


def copy_class_folders(src_root, dst_root, per_class, classes=None):
    """Copy the first ``per_class`` images of each class folder (sorted) into ``dst_root``."""
    for cls in classes or sorted(os.listdir(src_root)):
        os.makedirs(os.path.join(dst_root, cls), exist_ok=True)
        for name in sorted(os.listdir(os.path.join(src_root, cls)))[:per_class]:
            shutil.copy(os.path.join(src_root, cls, name), os.path.join(dst_root, cls, name))
    return dst_root


def run_entry(script, *args, timeout=600, cwd=ROOT):
    """Run an entry point as a user would (fresh interpreter, from ``cwd``: the repo root by
    default); return the result."""
    cmd = [sys.executable, os.path.join(ROOT, script), *map(str, args)]
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                            check=False)
    return result


def succeeded(result):
    """``result`` of ``run_entry``, after asserting it exited 0 (the output tails otherwise)."""
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n" \
                                   f"{result.stderr[-3000:]}"
    return result


def read_csv_rows(path):
    """The rows of a CSV file with a header, as dicts (``csv.DictReader``).

    Returns:
        list[dict]: One per row, keyed by the header's names.
    """
    import csv

    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def check_label_issues_resume(out, args):
    """Rerun label_issues.py ``args`` on its finished 2-fold ``out`` after removing fold 2's
    ``held_out.npz``, in this process: fold 1 is read, fold 2 predicted again to the same
    probabilities, and no fold trained (its ``metrics.jsonl`` unchanged).

    Raises:
        AssertionError: If a fold is trained, or fold 2's probabilities differ.
    """
    import numpy as np

    metrics = [open(os.path.join(out, f"fold_{k}", "train", "metrics.jsonl")).read()
               for k in (1, 2)]
    with np.load(os.path.join(out, "fold_2", "held_out.npz")) as saved:
        before = saved["probabilities"].copy()
    os.remove(os.path.join(out, "fold_2", "held_out.npz"))
    again = succeeded(run_in_process("label_issues.py", *args))
    assert "fold 1/2: done" in again.stdout and "fold 2/2: predicting" in again.stdout
    assert "training on" not in again.stdout
    assert [open(os.path.join(out, f"fold_{k}", "train", "metrics.jsonl")).read()
            for k in (1, 2)] == metrics
    with np.load(os.path.join(out, "fold_2", "held_out.npz")) as saved:
        np.testing.assert_allclose(saved["probabilities"], before, atol=1e-6)


def interleaved_class_images(root, count):
    """The first ``count`` images of a class-folder root taken class by class in turn
    (1st of each class, then 2nd of each ...): a fixed order with every class in every batch.

    Returns:
        tuple(list[str], numpy.ndarray): image paths and int32 labels (sorted folder index).
    """
    import numpy as np

    classes = sorted(os.listdir(root))
    per_class = count // len(classes) + 1
    paths = [os.path.join(root, c, sorted(os.listdir(os.path.join(root, c)))[i])
             for i in range(per_class) for c in classes][:count]
    labels = np.array([classes.index(os.path.basename(os.path.dirname(p))) for p in paths],
                      np.int32)
    return paths, labels


def file_size_limit(limit):
    """A ``preexec_fn`` for a process on a full disk: no file may grow past ``limit`` bytes, and
    a write past it fails with EFBIG instead of killing the process (SIGXFSZ ignored, inherited
    across exec)."""
    def limited():
        import resource
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return limited


@contextlib.contextmanager
def entry_point_in_process(script, cwd=ROOT):
    """The entry point ``script`` (e.g. "train.py") imported and set to run in this process:
    from ``cwd``, ``sys.argv[0]`` the script, ``src.utils.device.setup_device`` applying the
    mode and the seed only (MindSpore's device is already set in the test process).
    Afterwards the mode, the SIGINT / SIGTERM handlers and the ``src`` package's logger
    (which ``get_logger`` points at the run's stdout) are put back.

    Yields:
        module: The entry point's module; call its ``main``.
    """
    import importlib
    import logging
    import signal

    import mindspore as ms
    import pytest

    from src.utils import cli, device

    def mode_and_seed(mode, device_target, device_id=0, seed=1, run_distribute=False):
        del device_id, run_distribute
        device.check_device_target(device_target)
        ms.set_context(mode=device.MODES[mode])
        ms.set_seed(seed)

    module = importlib.import_module(os.path.splitext(script)[0])
    handlers = {s: signal.getsignal(s) for s in cli.STOP_SIGNALS}
    mode = ms.get_context("mode")
    package = logging.getLogger("src")
    package_state = (list(package.handlers), package.level, package.propagate)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd or ROOT)
        patch.setattr(sys, "argv", [os.path.join(ROOT, script)])
        patch.setattr(device, "setup_device", mode_and_seed)
        try:
            yield module
        finally:
            ms.set_context(mode=mode)
            package.handlers[:], package.propagate = package_state[0], package_state[2]
            package.setLevel(package_state[1])
            for signum, handler in handlers.items():
                signal.signal(signum, handler)


def run_in_process(script, *args, cwd=ROOT):
    """Run an entry point in this process as ``run_entry`` runs it in a fresh one: its ``main``
    through ``src.utils.cli.run_entry_point`` (a ``UserError`` printed as one line and its exit
    status), in ``entry_point_in_process``; stdout and stderr captured. Any other exception
    propagates (a fresh interpreter would print it as a traceback).

    Saves the 3-5 s of imports a fresh interpreter pays; keep one ``run_entry`` case per entry
    point for the behaviour of a real process.

    Returns:
        subprocess.CompletedProcess: ``returncode``, ``stdout``, ``stderr`` as ``run_entry``'s.
    """
    import io

    from src.utils import cli

    out, err = io.StringIO(), io.StringIO()
    argv = [str(a) for a in args]
    status = 0
    with entry_point_in_process(script, cwd) as module:
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                cli.run_entry_point(module.main, argv)
        except SystemExit as stop:
            status = 0 if stop.code is None else stop.code
    return subprocess.CompletedProcess([script, *argv], status, out.getvalue(), err.getvalue())


def train_in_process(*args, cwd=ROOT):
    """train.py's ``main`` called in this process (``entry_point_in_process``), for runs that
    need no process of their own (no signal, no exit status of the interpreter); its output
    goes where the test's goes.

    Returns:
        int: ``main``'s exit status. A ``UserError`` propagates, its frames cleared so that the
        output folder's lock is freed as the end of a process would free it.
    """
    import traceback

    with entry_point_in_process("train.py", cwd) as train:
        try:
            return train.main([str(a) for a in args])
        except Exception as err:
            traceback.clear_frames(err.__traceback__)  # the frames hold the open lock file
            raise


def sigkill_train_when(args, ready, *, timeout=300, cwd=ROOT):
    """train.py with ``args`` in a fresh interpreter (a process of its own, as a user's),
    killed with SIGKILL as soon as ``ready()`` is true (polled every 20 ms) or ``timeout``
    seconds have passed; a run that ends first is not killed. Its output goes to temporary
    files, so that no pipe fills up while nobody reads it.

    Returns:
        subprocess.CompletedProcess: ``returncode`` (``-signal.SIGKILL`` if killed),
        ``stdout`` and ``stderr``.
    """
    import signal
    import tempfile
    import time

    cmd = [sys.executable, os.path.join(ROOT, "train.py"), *map(str, args)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err, text=True)
        deadline = time.time() + timeout
        try:
            while proc.poll() is None and time.time() < deadline and not ready():
                time.sleep(0.02)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=120)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read())
