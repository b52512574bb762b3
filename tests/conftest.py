"""Shared fixtures. MindSpore gets the same oneDNN setting as the entry points.

Every test runs on the real images shipped in ``data/`` except the large real-data checks,
which take ``shared_data`` (``../shared/data`` beside the repository): without it they are
skipped with the reason printed (``-rfEs`` in pytest.ini), or fail when ``CI`` is set, since CI
has the data and must run them all.
"""
import gc
import glob
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from filelock import FileLock

from src.env import set_cpu_fast_path
from tests.helpers import (
    CIFAR_SAMPLE,
    ROOT,
    SHARED_DATA,
    copy_class_folders,
    require_shared_data,
    run_entry,
)

set_cpu_fast_path()  # before any test module imports MindSpore


def pytest_unconfigure(config):
    """Free the cells the test functions compiled with ``ms.jit`` close over, while MindSpore
    can still run their ``__del__``.

    MindSpore keeps every function it compiles as a key of an ``lru_cache``
    (``mindspore.graph.api._get_func_args_info_cached``, 4,096 entries), so the cells a
    compiled closure refers to (tests/test_loss.py compiles the losses so) live until the
    interpreter exits. By then it may have emptied ``mindspore.nn.cell``'s globals, and each
    such cell's ``Cell.__del__`` fails on ``Cell.total_instance_count``: ``Exception ignored
    in: Cell.__del__`` tracebacks after the summary, which read as failures. Emptying that
    cache and collecting here, at the end of the session, frees them while the module is whole.
    """
    api = sys.modules.get("mindspore.graph.api")
    cached = getattr(api, "_get_func_args_info_cached", None)
    if cached is not None:
        cached.cache_clear()
    gc.collect()


def output_entries():
    """The names in the repository's ``output/`` (the configs' default output folders), or
    None when there is no such folder."""
    folder = os.path.join(ROOT, "output")
    return set(os.listdir(folder)) if os.path.isdir(folder) else None


@pytest.fixture(scope="session", autouse=True)
def repository_output_untouched():
    """Tests write into temporary folders, never into the repository's ``output/``, where the
    configs' default ``output_dir`` puts a user's own runs: the folder made or an entry added
    there during the session is an error at its end."""
    before = output_entries()
    yield
    after = output_entries()
    added = "output/ itself" if before is None and after is not None else sorted(
        (after or set()) - (before or set()))
    assert not added, f"tests wrote into the repository's output/: {added} (pass --output_dir)"


@pytest.fixture(scope="session")
def shared_data():
    """``../shared/data`` beside the repository: the full real CIFAR-10 and the 1,000-image
    ImageNet sample, for checks too large to ship (skipped without it, or failed under CI).

    Returns:
        str: The folder.
    """
    return require_shared_data(SHARED_DATA, os.environ)


@pytest.fixture(scope="session")
def cifar_small(tmp_path_factory):
    """Real CIFAR-10 JPEGs copied from the shipped sample (``data/cifar10_sample``): the first
    8 train and 3 test images of each class, in class folders.

    Returns:
        dict: ``train`` and ``test`` class-folder roots.
    """
    root = tmp_path_factory.mktemp("cifar_small")
    return {"train": copy_class_folders(os.path.join(CIFAR_SAMPLE, "train"),
                                        str(root / "train"), 8),
            "test": copy_class_folders(os.path.join(CIFAR_SAMPLE, "test"),
                                       str(root / "test"), 3)}


def shared_between_workers(tmp_path_factory, name, build):
    """What ``build(folder)`` returns for a new folder ``name``, built once per test session
    however many pytest-xdist workers run it (``scripts/run_tests.sh`` starts two): the first
    worker to ask builds it under a file lock in the session's temporary root, the others wait
    for it and read the result back (JSON). Without xdist, one process: built in place.

    Returns:
        The JSON value ``build`` returned.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return build(str(tmp_path_factory.mktemp(name)))
    root = tmp_path_factory.getbasetemp().parent  # shared by the session's workers
    result = root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock")):
        if not result.is_file():
            folder = root / name
            folder.mkdir()
            result.write_text(json.dumps(build(str(folder))))
    return json.loads(result.read_text())


def train_quick_start(out):
    """train.py with ``configs/quick_start.yaml`` into ``out``; returns ``quick_start``'s dict."""
    result = run_entry("train.py", "--config_path", "configs/quick_start.yaml", "--output_dir",
                       out, timeout=1800)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    steps = {}  # resnet18-EPOCH_STEP.ckpt -> (epoch, step)
    for path in glob.glob(os.path.join(out, "resnet18-*_*.ckpt")):
        match = re.fullmatch(r"resnet18-(\d+)_(\d+)\.ckpt", os.path.basename(path))
        if match:
            steps[path] = (int(match.group(1)), int(match.group(2)))
    assert steps, f"the quick start wrote no checkpoint in {out}"
    return {"out": out, "ckpt": max(steps, key=steps.get)}


@pytest.fixture(scope="session", autouse=True)
def quick_start_started(request, tmp_path_factory):
    """``quick_start``'s training, started in a background thread at the worker's first test
    when a selected test uses it: it trains beside the tests that come first instead of
    keeping a worker idle, waiting for it, when the first test that needs it comes (the
    suite is CPU-bound). The worker that does not build it waits for it in that thread.
    Yields a Future of ``quick_start``'s dict, or None when no selected test uses it; ends once
    the training has."""
    if not any("quick_start" in item.fixturenames for item in request.session.items):
        yield None
        return
    # made here, before the thread: pytest makes the worker's temporary root on its first
    # call, deleting what stands there, so a second first call (the thread's beside the
    # tests') would delete the folders the tests had made in it
    tmp_path_factory.getbasetemp()
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit(shared_between_workers, tmp_path_factory, "quick_start",
                          train_quick_start)


@pytest.fixture(scope="session")
def quick_start(quick_start_started, tmp_path_factory):
    """The quick start's training run: train.py with ``configs/quick_start.yaml`` (ResNet-18,
    8 epochs on the shipped CIFAR-10 sample), as ``scripts/run_quick_start.sh`` runs it, into
    a temporary folder, once per session (``shared_between_workers``; started early by
    ``quick_start_started``). Trained weights for the tests that need a network above chance;
    tests read its files and write elsewhere.

    Returns:
        dict: ``out`` (the output folder) and ``ckpt`` (its newest checkpoint, the one the
        quick start script evaluates).
    """
    if quick_start_started is None:  # asked for by name only (getfixturevalue)
        return shared_between_workers(tmp_path_factory, "quick_start", train_quick_start)
    return quick_start_started.result()


@pytest.fixture(scope="session")
def interrupted_run(tmp_path_factory):
    """A run with every piece of resumable state, stopped by SIGKILL, SIGTERM and SIGINT and
    resumed each time (``tests/interrupted_run.py``), once per session
    (``shared_between_workers``): its output folder and what each process reported, for the
    resume checks (test_resume.py) and the TensorBoard curve checks (test_tracking.py). Tests
    read its files and write elsewhere.

    Returns:
        dict: See ``build_interrupted_run``.
    """
    from tests.interrupted_run import build_interrupted_run

    return shared_between_workers(tmp_path_factory, "interrupted_run", build_interrupted_run)
