"""A logger that writes to stdout and, optionally, a file in the output folder."""
import logging
import sys


def get_logger(name, log_file=None, rank=0):
    """Return a logger printing ``time rank level message`` lines; the ``src`` package's
    loggers write to the same stream and file.

    Args:
        name (str): Logger name (the entry point).
        log_file (str, optional): Also append to this file.
        rank (int): Device rank shown in each line (data-parallel runs).
    """
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    logger.handlers.clear()
    logger.propagate = False
    fmt = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s", "%H:%M:%S")
    handlers = [logging.StreamHandler(sys.stdout)]
    if log_file:
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(fmt)
        logger.addHandler(handler)
    # Warnings of the src.* modules (skipped files, unreadable checkpoints) go to the same places.
    package = logging.getLogger("src")
    package.handlers.clear()
    package.propagate = False
    for handler in handlers:
        package.addHandler(handler)
    return logger
