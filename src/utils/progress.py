"""Progress over a known number of images: a tqdm bar on a terminal, elsewhere (CI, msrun logs)
lines such as ``eval: 6400/50000 images, 31.5 img/s, ETA 0:23:04``."""
import sys
import time
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm

LINE_INTERVAL_S = 30.0
LINE_FRACTION = 0.1


def format_eta(seconds: float | None) -> str:
    """Seconds as ``h:mm:ss`` (hours not wrapped into days); ``unknown`` for None."""
    if seconds is None:
        return "unknown"
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an open terminal (False for files, pipes and closed streams)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class Progress:
    """Counts images done towards ``total`` and shows it; a context manager (leaving closes).

    Args:
        total: Images the work covers.
        desc: The start of each line (``eval``, ``predict``).
        stream: Where progress goes (default ``sys.stderr``); a terminal gets a bar.
        interval_s: Lines: an update writes one when this many seconds passed since the
            last line, or ``fraction`` of ``total`` was done since it; one at the end.
        fraction: See ``interval_s``.
        quiet: Count only, show nothing.
        clock: Monotonic time in seconds (tests pass a fake one).
    """

    def __init__(self, total: int, desc: str, *, stream: TextIO | None = None,
                 interval_s: float = LINE_INTERVAL_S, fraction: float = LINE_FRACTION,
                 quiet: bool = False, clock: Callable[[], float] = time.monotonic):
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

    def update(self, count: int) -> None:
        """Add ``count`` images done; redraw the bar or write a line when one is due."""
        self.done += count
        if self.bar is not None:
            self.bar.update(count)
        elif not self.quiet and self._line_due():
            self._write_line()

    def write(self, text: str, file: TextIO | None = None) -> None:
        """Print a line of output (default: to stdout) without breaking the bar."""
        file = sys.stdout if file is None else file
        if self.bar is not None:
            self.bar.write(text, file=file)
        else:
            print(text, file=file)

    def close(self) -> None:
        """End the bar, or write the last line if the count moved since the previous one."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif not self.quiet and (self.last_line is None or self.last_line[1] != self.done):
            self._write_line()

    def line(self) -> str:
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
