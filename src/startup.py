"""Signals during start-up, before an entry point installs its own handlers.

Importing this module has one side effect, by design: SIGINT and SIGTERM print one line
naming the signal and the entry point, then exit with 128 + the signal number. Without it, a
SIGTERM while MindSpore loads (seconds) ends the process with status 143 and no word, and
Ctrl-C prints a ``KeyboardInterrupt`` traceback from inside some import. The entry points
import it right after ``src.env``; ``train.py`` replaces the handlers with ``StopSignals``
(save and stop), the others keep them. Nothing has been written when they fire during
start-up.
"""
import os
import signal
import sys


def _exit_on_signal(signum, frame):
    del frame
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    sys.stderr.write(f"{script}: stopped by {signal.Signals(signum).name}\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def catch_stop_signals():
    """Install the one-line exit for SIGINT and SIGTERM (importing the module already did)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _exit_on_signal)


catch_stop_signals()
