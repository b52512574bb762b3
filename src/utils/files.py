"""Output files written whole or not at all (appends included), with the mode a plain write
gives, and output folders checked before any work."""
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


def current_umask():
    """The process's umask, read without changing it (``/proc/self/status``, Linux 4.7+);
    elsewhere set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def plain_file_mode(fd):
    """Give the open file ``fd`` the mode ``open(path, "w")`` would have: 0o666 less the
    umask (``tempfile`` creates its files 0o600, which the rename would keep)."""
    os.fchmod(fd, 0o666 & ~current_umask())


def atomic_write_text(path, text):
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same folder, flushed
    to disk and renamed: ``path`` holds either its old content or all of ``text``. The file
    gets the mode of a plain write (``plain_file_mode``).

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
            plain_file_mode(f.fileno())
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
