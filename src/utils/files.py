"""Output files written whole or not at all (appends included), and output folders checked
before any work."""
import os
import tempfile

from src.utils.errors import OutputDirError, WriteError


def check_output_dir(path, key="output_dir"):
    """Create ``path`` if missing and check a file can be written in it, before any slow work
    (a run should not fail at its very end for want of a place to write its result).

    Args:
        path (str): The folder.
        key (str): The config key that named it, for the message.

    Raises:
        OutputDirError: If ``path`` is a file, cannot be created, or a file cannot be created
            in it (permission, read-only filesystem, full disk), naming the key and the path.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputDirError(f"{key} {path} is a file, not a folder")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write_check_"):
            pass
    except OSError as err:
        raise OutputDirError(f"{key} {path} is not writable: {err.strerror or err}") from err


def atomic_write_text(path, text):
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same folder, flushed
    to disk and renamed: ``path`` holds either its old content or all of ``text``.

    Raises:
        WriteError: Naming ``path`` and the cause (disk full, permission); the temporary file
            is removed and an existing ``path`` is left as it was.
    """
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=folder, delete=False,
                                         prefix=os.path.basename(path) + ".",
                                         suffix=".tmp") as f:
            tmp = f.name
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        if tmp and os.path.exists(tmp):
            os.remove(tmp)
        raise WriteError(f"cannot write {path}: {err.strerror or err}") from err


def append_line(path, line):
    """Append ``line`` to the text file ``path`` atomically (the file is small: one line per
    epoch): it holds its earlier lines and either all of ``line`` or none of it.

    Raises:
        WriteError: If the file cannot be written (names it).
    """
    earlier = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            earlier = f.read()
    atomic_write_text(path, earlier + line + "\n")
