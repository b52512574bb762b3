"""Running an entry point: errors in the user's input become one clear line and exit status 2;
a stop signal one line and exit status 128 + its number; a closed output pipe a quiet exit."""
import os
import signal
import sys

from src.utils.errors import UserError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignal(BaseException):
    """SIGINT or SIGTERM arrived while an entry point ran (outside ``train.py``'s training,
    where ``StopSignals`` saves and stops instead). A ``BaseException``, like
    ``KeyboardInterrupt``: ``finally`` blocks and context managers clean up on the way out.

    Args:
        signum (int): The signal number.
    """

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stop(signum, frame):
    del frame
    raise StopSignal(signum)


def run_entry_point(main, argv=None):
    """Call ``main(argv)`` and exit with its status.

    A ``UserError`` (a bad config value, path, data folder or checkpoint, raised by this
    package's checks) prints ``<script>: error: <message>`` on stderr and exits with its
    ``exit_status``: 2 like argparse, 4 for an output file that could not be written. SIGINT
    and SIGTERM raise ``StopSignal`` in ``main`` (its cleanup runs), then print
    ``<script>: stopped by <SIGNAL>`` and exit with 128 + the signal number (during the
    imports before this call, ``src.startup`` does the same). Standard output closed by its
    reader (``predict.py ... | head``) ends the run quietly with 141 (128 + SIGPIPE, a shell's
    status for a command ended by a closed pipe), as the Python docs advise: stdout is pointed
    at /dev/null so the interpreter's final flush raises nothing. Every other exception, from
    MindSpore, numpy or a bug here, propagates with its traceback.
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
