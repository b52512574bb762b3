"""Errors caused by the user's input: the only ones an entry point reports as one line.

Every check of a config value, a path, a data folder or a checkpoint raises a subclass of
``UserError``; ``src.utils.cli.run_entry_point`` prints its message and exits with status 2. Any
other exception (a bug here, a failure inside MindSpore or numpy) keeps its traceback.
"""


class UserError(Exception):
    """Base class of errors that name a bad input (key, value, file) and what was expected."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user named does not exist (or holds nothing usable)."""


class OutputDirError(UserError):
    """The output folder cannot be used as asked (it holds another run's files, or is not
    writable)."""
