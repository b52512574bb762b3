"""Errors caused by the user's input: the only ones an entry point reports as one line.

Every check of a config value, a path, a data folder or a checkpoint raises a subclass of
``UserError``; ``src.utils.cli.run_entry_point`` prints its message and exits with its
``exit_status`` (2; 4 for a file that could not be written). Any other exception (a bug here,
a failure inside MindSpore or numpy) keeps its traceback.
"""


class UserError(Exception):
    """Base class of errors that name a bad input (key, value, file) and what was expected."""

    exit_status = 2


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user named does not exist (or holds nothing usable)."""


class OutputDirError(UserError):
    """The output folder cannot be used as asked (it holds another run's files, or is not
    writable)."""


class WriteError(UserError, OSError):
    """An output file could not be written (disk full, permission, a file where a folder
    should be); nothing is left under its final name. Exit status 4, as for a checkpoint
    that could not be written."""

    exit_status = 4
