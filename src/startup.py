"""Signals during start-up: SIGINT and SIGTERM print ``<script>: stopped by <SIGNAL>`` and exit
with 128 + the signal number (importing it installs this, by design; ``train.py`` later installs
``StopSignals``). See docs/reliability.md#signals-during-start-up.
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


def catch_stop_signals() -> None:
    """Install the one-line exit for SIGINT and SIGTERM (importing the module already did)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _exit_on_signal)


catch_stop_signals()
