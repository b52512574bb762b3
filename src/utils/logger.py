"""A logger that writes to stdout and, optionally, a file in the output folder."""
import logging
import logging.handlers
import sys
from typing import TextIO

EARLY_RECORDS = 10000  # lines kept for the log file before its folder is known


class RunLogFile(logging.FileHandler):
    """The run's log file; the first failed write (disk full) is kept in ``error`` for the run
    to stop on, instead of a traceback per line."""

    error = None

    def handleError(self, record: logging.LogRecord) -> None:
        if self.error is None:
            self.error = sys.exc_info()[1]


def log_file_error(logger: logging.Logger) -> str | None:
    """The first write error of ``logger``'s log file (``RunLogFile``), or None."""
    for handler in logger.handlers:
        if isinstance(handler, RunLogFile) and handler.error is not None:
            return f"cannot write {handler.baseFilename}: {handler.error}"
    return None


class _Early(logging.handlers.BufferingHandler):
    """Keeps the records logged before the log file exists (start-up), for that file."""

    def shouldFlush(self, record: logging.LogRecord) -> bool:
        return False


def get_logger(name: str, log_file: str | None = None, rank: int = 0,
               stream: TextIO | None = None) -> logging.Logger:
    """A logger printing ``time rankN level message`` lines to ``stream`` (default stdout) and,
    with ``log_file``, appending them there; the ``src`` loggers write to the same places.
    Lines logged before the call with ``log_file`` are written to the file first.
    """
    logger = logging.getLogger(name)
    early = [h for h in logger.handlers if isinstance(h, _Early)]
    logger.setLevel(logging.INFO)
    logger.handlers.clear()
    logger.propagate = False
    fmt = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s", "%H:%M:%S")
    handlers = [logging.StreamHandler(stream or sys.stdout)]
    if log_file:
        handlers.append(RunLogFile(log_file, encoding="utf-8"))
        for record in early[0].buffer if early else []:
            handlers[-1].handle(record)
    else:
        handlers.append(_Early(EARLY_RECORDS))
    for handler in handlers:
        handler.setFormatter(fmt)
        logger.addHandler(handler)
    # Lines of the src.* modules (skipped files, which weights were loaded) go to the same places.
    package = logging.getLogger("src")
    package.handlers.clear()
    package.setLevel(logging.INFO)
    package.propagate = False
    for handler in handlers:
        package.addHandler(handler)
    return logger
