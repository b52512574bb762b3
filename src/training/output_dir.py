"""The output folder of a training run: one run per folder, an earlier run moved aside (never
deleted) only when asked."""
import glob
import os
import time

from src.utils.errors import OutputDirError

RECORDS = "metrics.jsonl"
RUN_FILES = (RECORDS, "config.yaml", "train.log", "class_names.txt")
"""Files a run writes besides its checkpoints (``*.ckpt``); moved with them."""
MOVED_PREFIX = "previous_run_"


def earlier_run_files(output_dir):
    """The files of an earlier run in ``output_dir``: its checkpoints first, then its
    records. Empty when the folder holds neither a checkpoint nor ``metrics.jsonl`` (a run
    that stopped during start-up leaves nothing worth keeping apart)."""
    found = sorted(glob.glob(os.path.join(glob.escape(output_dir), "*.ckpt")))
    records = [os.path.join(output_dir, n) for n in RUN_FILES
               if os.path.isfile(os.path.join(output_dir, n))]
    if not found and os.path.join(output_dir, RECORDS) not in records:
        return []
    return found + records


def prepare_output_dir(output_dir, starts_fresh, overwrite):
    """Create ``output_dir``; for a run that starts from step 0, make sure it holds no other
    run's checkpoints or records.

    Args:
        output_dir (str): The run's folder.
        starts_fresh (bool): The run starts from step 0 (no checkpoint to resume from).
        overwrite (bool): Move an earlier run's files into ``previous_run_<time>/`` inside
            ``output_dir`` instead of refusing. Nothing is ever deleted.

    Returns:
        str or None: the folder the earlier run's files were moved to, if any.

    Raises:
        OutputDirError: If a fresh run would mix with an earlier run's files (names the
            folder and the ways out), or the folder cannot be created.
    """
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as err:
        raise OutputDirError(f"cannot create output_dir {output_dir}: {err}") from err
    earlier = earlier_run_files(output_dir) if starts_fresh else []
    if not earlier:
        return None
    if not overwrite:
        names = ", ".join(os.path.basename(p) for p in earlier[:4])
        raise OutputDirError(
            f"output_dir {output_dir} holds another run's files ({names}"
            f"{' ...' if len(earlier) > 4 else ''}): a new run there would mix with them. "
            f"Continue that run with --resume_ckpt auto, choose another --output_dir, or pass "
            f"--overwrite true to move them into a {MOVED_PREFIX}* folder inside it")
    moved_to = os.path.join(output_dir, MOVED_PREFIX + time.strftime("%Y%m%d-%H%M%S"))
    suffix = 0
    while os.path.exists(moved_to + (f"-{suffix}" if suffix else "")):
        suffix += 1
    moved_to += f"-{suffix}" if suffix else ""
    os.makedirs(moved_to)
    for path in earlier:
        os.replace(path, os.path.join(moved_to, os.path.basename(path)))
    return moved_to
