"""Output files written whole or not at all (appends included), with the mode a plain write
gives, and output folders checked before any work."""
import os
import tempfile

from src.utils.errors import OutputDirError, WriteError


def check_output_dir(path, key="output_dir", create=True):
    """Check that files can be written in the folder ``path``, before any slow work (a run
    should not fail at its very end for want of a place to write its result), creating it if
    missing.

    Args:
        path (str): The folder.
        key (str): The config key that named it, for the message.
        create (bool): False: a missing folder is not created; a temporary folder is created
            and removed in its nearest existing parent instead, so a run refused after this
            check leaves nothing behind (the caller creates ``path`` when it writes).

    Raises:
        OutputDirError: If ``path`` (or, with ``create`` False, its nearest existing parent)
            is a file, or the folder or a file in it cannot be created (permission, read-only
            filesystem, full disk), naming the key and the path.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputDirError(f"{key} {path} is a file, not a folder")
    try:
        if create or os.path.isdir(path):
            os.makedirs(path, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path, prefix=".write_check_"):
                pass
            return
        parent = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            raise OutputDirError(f"{key} {path}: {parent} is a file, not a folder")
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".write_check_"))
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
