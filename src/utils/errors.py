"""Errors in the user's input (config value, path, data folder, checkpoint): the only ones an
entry point reports as one line, exiting with ``exit_status`` (``src.utils.cli``); see
docs/reliability.md#exit-statuses."""


class UserError(Exception):
    """Base class of errors that name a bad input and what was expected."""

    exit_status = 2


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user named does not exist (or holds nothing usable)."""


class OutputDirError(UserError):
    """The output folder cannot be used as asked (another run's files, or not writable)."""


class WriteError(UserError, OSError):
    """An output file could not be written; nothing is left under its final name."""

    exit_status = 4
