"""Running an entry point: a ``UserError`` or a stop signal becomes one line and an exit status
(docs/reliability.md#exit-statuses)."""
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from src.utils.errors import UserError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignal(BaseException):
    """SIGINT or SIGTERM (``signum``) while an entry point ran; a ``BaseException`` like
    ``KeyboardInterrupt``, so cleanup runs on the way out."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stop(signum, frame):
    del frame
    raise StopSignal(signum)


def run_entry_point(main: Callable[[list[str] | None], int],
                    argv: list[str] | None = None) -> NoReturn:
    """Call ``main(argv)`` and exit with its status.

    A ``UserError`` prints ``<script>: error: <message>`` on stderr and exits with its
    ``exit_status``; SIGINT/SIGTERM raise ``StopSignal`` in ``main``, then print
    ``<script>: stopped by <SIGNAL>`` and exit with 128 + its number; a closed stdout
    (``predict.py ... | head``) exits quietly with 141, stdout pointed at /dev/null as the
    Python docs advise. Other exceptions keep their traceback.
    """
    prog = os.path.basename(sys.argv[0])
    for signum in STOP_SIGNALS:
        signal.signal(signum, _raise_stop)
    try:
        status = main(argv)
    except UserError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        sys.exit(err.exit_status)
    except StopSignal as stop:
        print(f"{prog}: stopped by {stop}", file=sys.stderr)
        sys.exit(128 + stop.signum)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    sys.exit(status)
