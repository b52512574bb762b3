"""The output folder of a training run: one run per folder (held by a lock for the run's
lifetime), an earlier run moved aside (never deleted) only when asked."""
import glob
import json
import logging
import os
import time
from collections.abc import Sequence

from src.data.sampling import class_count_summary, class_counts
from src.data.split import (
    TRAIN_SPLIT_FILE,
    VAL_SPLIT_FILE,
    FolderSplit,
    training_labels,
    write_split_files,
)
from src.utils.errors import OutputDirError
from src.utils.files import FileLock, atomic_write_text, check_output_dir
from src.utils.tracking import TENSORBOARD_FOLDER

RECORDS = "metrics.jsonl"
RUN_FILES = (RECORDS, "config.yaml", "train.log", "class_names.txt", TRAIN_SPLIT_FILE,
             VAL_SPLIT_FILE, TENSORBOARD_FOLDER)
"""Files (and the TensorBoard events' folder) a run writes besides its checkpoints
(``*.ckpt``); moved with them."""
MOVED_PREFIX = "previous_run_"
IMBALANCE_WARNING = 10  # largest / smallest class count above which a warning is logged
LOCK_FILE = ".run.lock"
"""Held (``flock``) by the run writing to the folder; names its host and process id. Never
moved by ``--overwrite``."""


def earlier_run_files(output_dir: str) -> list[str]:
    """The files of an earlier run in ``output_dir``: its checkpoints first, then its
    records. Empty when the folder holds neither a checkpoint nor ``metrics.jsonl`` (a run
    that stopped during start-up leaves nothing worth keeping apart)."""
    found = sorted(glob.glob(os.path.join(glob.escape(output_dir), "*.ckpt")))
    records = [os.path.join(output_dir, n) for n in RUN_FILES
               if os.path.exists(os.path.join(output_dir, n))]
    if not found and os.path.join(output_dir, RECORDS) not in records:
        return []
    return found + records


def records_after(output_dir: str, done_steps: int) -> list[str]:
    """The ``metrics.jsonl`` lines of steps after ``done_steps``, in file order."""
    path = os.path.join(output_dir, RECORDS)
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [line for line in f if line.strip() and _record_step(line) > done_steps]


def trim_records(output_dir: str, done_steps: int) -> int:
    """Drop the ``metrics.jsonl`` records of steps after ``done_steps`` (the resumed
    checkpoint's: the checkpoint is the truth), rewriting the file atomically; returns how many.

    Raises:
        WriteError: If the file cannot be rewritten.
    """
    path = os.path.join(output_dir, RECORDS)
    if not os.path.isfile(path):
        return 0
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    kept = [line for line in lines if _record_step(line) <= done_steps]
    if len(kept) < len(lines):
        atomic_write_text(path, "".join(kept))
    return len(lines) - len(kept)


def _record_step(line):
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return -1  # not a record of ours: kept


def prepare_output_dir(output_dir: str, starts_fresh: bool, overwrite: bool,
                       resume_auto: bool = False) -> str | None:
    """Create ``output_dir``; for a run that ``starts_fresh`` (step 0) refuse
    an earlier run's checkpoints or records in it, or with ``overwrite`` move them into a new
    ``previous_run_<time>/`` inside it (nothing is deleted) and return that folder (else None).
    ``resume_auto``: the refusal says ``--resume_ckpt auto`` found nothing to resume.

    Raises:
        OutputDirError: For another run's files without ``overwrite`` (names the ways out), or
            a folder that cannot be created.
    """
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as err:
        raise OutputDirError(f"cannot create output_dir {output_dir}: {err}") from err
    earlier = earlier_run_files(output_dir) if starts_fresh else []
    if not earlier:
        return None
    names = ", ".join(os.path.basename(p) for p in earlier[:4])
    if not overwrite and resume_auto:
        raise OutputDirError(
            f"output_dir {output_dir} holds another run's files ({names}"
            f"{' ...' if len(earlier) > 4 else ''}) but no usable checkpoint: that run stopped "
            f"before its first checkpoint (or its checkpoints are unreadable), so there is "
            f"nothing to resume. Start afresh with --overwrite true, which moves its files "
            f"into a {MOVED_PREFIX}* folder inside it, or choose another --output_dir")
    if not overwrite:
        raise OutputDirError(
            f"output_dir {output_dir} holds another run's files ({names}"
            f"{' ...' if len(earlier) > 4 else ''}): a new run there would mix with them. "
            f"Continue that run with --resume_ckpt auto, choose another --output_dir, or pass "
            f"--overwrite true to move them into a {MOVED_PREFIX}* folder inside it")
    moved_to = _moved_folder(output_dir)
    for path in earlier:
        os.replace(path, os.path.join(moved_to, os.path.basename(path)))
    return moved_to


def _moved_folder(output_dir):
    """A new, empty ``previous_run_<time>`` folder inside ``output_dir``."""
    moved_to = os.path.join(output_dir, MOVED_PREFIX + time.strftime("%Y%m%d-%H%M%S"))
    suffix = 0
    while os.path.exists(moved_to + (f"-{suffix}" if suffix else "")):
        suffix += 1
    moved_to += f"-{suffix}" if suffix else ""
    os.makedirs(moved_to)
    return moved_to


def move_branch_aside(output_dir: str, later_files: Sequence[str], done_steps: int) -> str:
    """With ``--overwrite``, for a run resumed before its newest checkpoint:
    move ``later_files`` (later checkpoints, a later ``NET-best.ckpt``) and the records after
    ``done_steps`` (as a ``metrics.jsonl`` of their own) into a new ``previous_run_<time>``
    folder inside ``output_dir``, and return it.

    Raises:
        WriteError: If the records cannot be written or rewritten.
    """
    moved_to = _moved_folder(output_dir)
    for path in later_files:
        os.replace(path, os.path.join(moved_to, os.path.basename(path)))
    later = records_after(output_dir, done_steps)
    if later:
        atomic_write_text(os.path.join(moved_to, RECORDS), "".join(later))
        trim_records(output_dir, done_steps)
    return moved_to


class OutputDirLock(FileLock):
    """An exclusive lock on a run's output folder, held until the process exits
    (``FileLock`` on ``LOCK_FILE`` inside the folder, which stays).

    Args:
        output_dir (str): The run's folder (created if missing).
    """

    def __init__(self, output_dir: str):
        self.output_dir = output_dir
        path = os.path.join(output_dir, LOCK_FILE)
        super().__init__(path, lambda holder: (
            f"output_dir {output_dir} is in use by another run (host and process id: "
            f"{holder}, lock file {path}): wait for it to end, or choose another "
            f"--output_dir"), f"output_dir {output_dir}")

    def acquire(self) -> str | None:
        """``FileLock.acquire``, the folder created first.

        Raises:
            OutputDirError: As ``FileLock.acquire``, or if the folder cannot be created.
            WriteError: As ``FileLock.acquire``.
        """
        try:
            os.makedirs(self.output_dir, exist_ok=True)
        except OSError as err:
            raise OutputDirError(f"cannot create output_dir {self.output_dir}: "
                                 f"{err.strerror or err}") from err
        return super().acquire()


def record_training_images(output_dir: str, data_path: str, class_names: list[str],
                           log: logging.Logger, *, split: FolderSplit | None = None,
                           val_split: float = 0.0, changed: Sequence[str] = (),
                           write: bool = True, for_eval: bool = False,
                           suggest_balance: bool = False) -> None:
    """The training images of a class-folder run in the log: with a
    ``split`` (``checked_split``; ``val_split`` its fraction, ``changed`` the lists it changes)
    its two file lists written into ``output_dir`` when ``write`` and a line of their sizes, then
    the images per class, with a warning when the largest class has more than
    ``IMBALANCE_WARNING`` times the smallest's (suggesting ``class_balance`` if
    ``suggest_balance``). ``for_eval``: the held-out part is evaluated.

    Raises:
        WriteError: If a list cannot be written.
    """
    if split is not None:
        if changed:
            log.warning("resume_ignore_config: the split changed; %s rewritten",
                        ", ".join(changed))
        if write:
            write_split_files(output_dir, data_path, split)
        log.info("val_split %g: %d images train, %d held out%s (lists: %s, %s)",
                 val_split, len(split.train), len(split.val),
                 " for run_eval" if for_eval else "", TRAIN_SPLIT_FILE, VAL_SPLIT_FILE)
    labels = split.train_labels() if split is not None else training_labels(data_path, 0, 0)
    counts = class_counts(labels, len(class_names))
    line, ratio = class_count_summary(counts, class_names)
    log.info("training images per class: %s", line)
    if ratio > IMBALANCE_WARNING:
        log.warning("unbalanced classes: the largest has %.1f times the images of the smallest"
                    "%s", ratio, "; class_balance sampler or loss evens them out"
                    if suggest_balance else "")


def lock_output_dir(output_dir: str, rank: int, log: logging.Logger) -> OutputDirLock | None:
    """Take the run's output folder on rank 0 (the ranks share it and only rank 0 writes):
    checked writable, then locked for the run (``OutputDirLock``), so a second run into it
    fails at once. Returns the lock (None on other ranks).

    Raises:
        OutputDirError: If the folder is a file, not writable, or held by another run.
    """
    if rank != 0:
        return None
    check_output_dir(output_dir)
    lock = OutputDirLock(output_dir)
    ended = lock.acquire()
    if ended:
        log.info("output_dir %s: took over the lock of an ended run (host and process id "
                 "%s)", output_dir, ended)
    return lock
