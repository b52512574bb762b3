"""Output files written whole or not at all (appends included), with the mode a plain write
gives; output folders checked before any work; one-process file locks (``FileLock``)."""
import contextlib
import errno
import fcntl
import os
import socket
import tempfile
from collections.abc import Callable

from src.utils.errors import OutputDirError, WriteError


def check_output_dir(path: str, key: str = "output_dir", create: bool = True) -> None:
    """Check before any slow work that files can be written in the folder ``path`` (named
    ``key`` in messages), creating it; with ``create`` False a missing folder is not created
    (its nearest existing parent is checked), so a run refused later leaves nothing behind.

    Raises:
        OutputDirError: If it (or that parent) is a file or not writable.
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


def current_umask() -> int:
    """The process's umask (``/proc/self/status``; elsewhere set and restored at once)."""
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


def plain_file_mode(fd: int) -> None:
    """Give the open file ``fd`` the mode ``open(path, "w")`` would have: 0o666 less the
    umask (``tempfile`` creates its files 0o600, which the rename would keep)."""
    os.fchmod(fd, 0o666 & ~current_umask())


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a flushed temporary file renamed over it,
    with a plain write's mode: ``path`` holds its old content or all of ``text``.

    Raises:
        WriteError: Naming ``path`` and the cause; an existing ``path`` is left as it was.
    """
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str, data: bytes) -> None:
    """``atomic_write_text`` for bytes (a PNG, a ``.npy``)."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        with tempfile.NamedTemporaryFile("wb", dir=folder, delete=False,
                                         prefix=os.path.basename(path) + ".",
                                         suffix=".tmp") as f:
            tmp = f.name
            f.write(data)
            f.flush()
            plain_file_mode(f.fileno())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        if tmp and os.path.exists(tmp):
            os.remove(tmp)
        raise WriteError(f"cannot write {path}: {err.strerror or err}") from err


def append_line(path: str, line: str) -> None:
    """Append ``line`` to the small text file ``path`` atomically (``atomic_write_text``)."""
    earlier = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            earlier = f.read()
    atomic_write_text(path, earlier + line + "\n")


class FileLock:
    """An exclusive lock until the process exits: ``fcntl.flock`` on ``path`` (its folder
    must exist), which holds ``host pid`` of the holder; a file left by a dead process is
    free and taken over.

    Args:
        in_use: ``in_use(holder)`` -> the message when another process holds it (``holder``:
            its ``host pid`` or ``unknown``); ``what`` names the lock in other messages.
        remove: Delete the file on ``release``; otherwise it stays, naming its last holder.
    """

    def __init__(self, path: str, in_use: Callable[[str], str], what: str,
                 remove: bool = False) -> None:
        self.path = path
        self.in_use = in_use
        self.what = what
        self.remove = remove
        self.file = None

    def acquire(self) -> str | None:
        """Take the lock, or fail at once naming the holder; returns the ``host pid`` of an
        earlier holder that ended without releasing it, else None.

        Raises:
            OutputDirError: If another process holds it, or it cannot be created or locked.
            WriteError: If the holder's name cannot be written into it (disk full).
        """
        while True:
            try:
                handle = open(self.path, "a+", encoding="utf-8")  # held open while locked
            except OSError as err:
                raise OutputDirError(f"cannot create the lock file {self.path} of "
                                     f"{self.what}: {err.strerror or err}") from err
            handle.seek(0)
            previous = handle.read().strip()
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                handle.close()
                if err.errno in (errno.EAGAIN, errno.EACCES):
                    raise OutputDirError(self.in_use(previous or "unknown")) from None
                raise OutputDirError(f"cannot lock {self.what} ({self.path}): "
                                     f"{err.strerror or err}") from err
            if self._still_at_path(handle):
                break
            handle.close()  # a holder that deletes its file released it in between: again
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"{socket.gethostname()} {os.getpid()}\n")
            handle.flush()
        except OSError as err:  # a full disk: the folder may be new, the file empty
            with contextlib.suppress(OSError):  # close() flushes the rest again, and fails
                handle.close()
            raise WriteError(f"cannot write the lock file {self.path}: "
                             f"{err.strerror or err}") from err
        self.file = handle
        return previous or None

    def _still_at_path(self, handle):
        try:
            return os.stat(self.path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Give the lock back (the file deleted first with ``remove``, while still held)."""
        if self.file is not None:
            if self.remove:
                with contextlib.suppress(OSError):
                    os.remove(self.path)
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None
