"""Progress of long work over a known number of images: a bar on a terminal, lines elsewhere.

When stderr is a terminal, a tqdm bar shows the images done, img/s and the ETA. When it is not
(CI, nohup, msrun logs), a bar would fill the log with carriage returns, so plain lines are
written to stderr instead::

    eval: 6400/50000 images, 31.5 img/s, ETA 0:23:04

one after the first update, then whenever ``interval_s`` seconds have passed or another
``fraction`` of the total is done since the last line, and one at the end.
"""
import sys
import time

from tqdm import tqdm

LINE_INTERVAL_S = 30.0
LINE_FRACTION = 0.1


def format_eta(seconds):
    """Seconds as ``h:mm:ss`` (hours not wrapped into days); ``unknown`` for None."""
    if seconds is None:
        return "unknown"
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def is_terminal(stream):
    """Whether ``stream`` is an open terminal (False for files, pipes and closed streams)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class Progress:
    """Counts images done towards a total and shows it (see the module docstring).

    Use it as a context manager: leaving the block closes the bar or writes the last line.

    Args:
        total (int): Number of images the work covers.
        desc (str): What is being done, the start of each line (``eval``, ``predict``).
        stream (file, optional): Where progress goes; default ``sys.stderr``. A terminal gets
            a bar, anything else lines.
        interval_s (float): Lines: at most this many seconds between two lines.
        fraction (float): Lines: also a line each time this fraction of ``total`` is done.
        quiet (bool): Count only, show nothing (e.g. for work too small to need progress).
        clock (callable): Monotonic time in seconds (tests pass a fake one).
    """

    def __init__(self, total, desc, stream=None, interval_s=LINE_INTERVAL_S,
                 fraction=LINE_FRACTION, quiet=False, clock=time.monotonic):
        self.total = total
        self.desc = desc
        self.done = 0
        self.stream = sys.stderr if stream is None else stream
        self.interval_s = interval_s
        self.step = max(1, int(total * fraction))
        self.quiet = quiet
        self.clock = clock
        self.start = clock()
        self.last_line = None  # (time, done) of the last line written
        self.bar = None
        if not quiet and is_terminal(self.stream):
            self.bar = tqdm(total=total, desc=desc, unit="img", file=self.stream,
                            dynamic_ncols=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def update(self, count):
        """Add ``count`` images done; redraw the bar or write a line when one is due."""
        self.done += count
        if self.bar is not None:
            self.bar.update(count)
        elif not self.quiet and self._line_due():
            self._write_line()

    def write(self, text, file=None):
        """Print a line of output (default: to stdout) without breaking the bar."""
        file = sys.stdout if file is None else file
        if self.bar is not None:
            self.bar.write(text, file=file)
        else:
            print(text, file=file)

    def close(self):
        """End the bar, or write the last line if the count moved since the previous one."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif not self.quiet and (self.last_line is None or self.last_line[1] != self.done):
            self._write_line()

    def line(self):
        """The text of a progress line for the count so far (``N/total images, ...``)."""
        elapsed = self.clock() - self.start
        rate = self.done / elapsed if elapsed > 0 else None
        eta = (self.total - self.done) / rate if rate else None
        speed = f"{rate:.1f} img/s" if rate is not None else "- img/s"
        return f"{self.desc}: {self.done}/{self.total} images, {speed}, ETA {format_eta(eta)}"

    def _line_due(self):
        if self.last_line is None:
            return True
        last_time, last_done = self.last_line
        return (self.clock() - last_time >= self.interval_s
                or self.done - last_done >= self.step or self.done >= self.total)

    def _write_line(self):
        print(self.line(), file=self.stream, flush=True)
        self.last_line = (self.clock(), self.done)
