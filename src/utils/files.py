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
    """Check that files can be written in the folder ``path``, before any slow work (a run
    should not fail at its very end for want of a place to write its result), creating it if
    missing.

    Args:
        path: The folder.
        key: The config key that named it, for the message.
        create: False: a missing folder is not created; a temporary folder is created
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


def current_umask() -> int:
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


def plain_file_mode(fd: int) -> None:
    """Give the open file ``fd`` the mode ``open(path, "w")`` would have: 0o666 less the
    umask (``tempfile`` creates its files 0o600, which the rename would keep)."""
    os.fchmod(fd, 0o666 & ~current_umask())


def atomic_write_text(path: str, text: str) -> None:
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


def append_line(path: str, line: str) -> None:
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


class FileLock:
    """An exclusive lock held until the process exits: ``fcntl.flock`` on ``path``, which
    then holds ``host pid`` of the holder. The kernel releases the lock when its process ends
    (killed or not), so a lock file left by a dead process is free: the next holder takes it
    over and says whose it was.

    Args:
        path: The lock file (its folder must exist).
        in_use: ``in_use(holder)`` -> the message of the error raised when another process
            holds the lock (``holder``: its ``host pid``, or ``unknown``).
        what: What the lock guards, for the other messages.
        remove: Delete the lock file on ``release`` (a lock taken for one command);
            otherwise it stays, naming its last holder.
    """

    def __init__(self, path: str, in_use: Callable[[str], str], what: str,
                 remove: bool = False) -> None:
        self.path = path
        self.in_use = in_use
        self.what = what
        self.remove = remove
        self.file = None

    def acquire(self) -> str | None:
        """Take the lock, or fail at once naming the holder.

        Returns:
            ``host pid`` of an earlier holder whose lock was free (it ended
            without releasing the file), for a message; None if there was none.

        Raises:
            OutputDirError: If another process holds the lock (``in_use``'s message), or the
                lock file cannot be created or locked.
            WriteError: If the holder's name cannot be written into the lock file (disk
                full), naming the file.
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
