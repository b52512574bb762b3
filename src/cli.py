"""Running an entry point: user errors become one clear line and exit status 2."""
import os
import sys

from src.checkpoint import CheckpointMismatchError
from src.config import ConfigError

USER_ERRORS = (ConfigError, CheckpointMismatchError, FileNotFoundError, FileExistsError,
               IsADirectoryError, NotADirectoryError, PermissionError, KeyError, ValueError)


def run_entry_point(main, argv=None):
    """Call ``main(argv)`` and exit with its status.

    Errors caused by the user's input (config, paths, checkpoints: ``USER_ERRORS``) print
    ``<script>: error: <message>`` on stderr and exit with status 2, like argparse; anything
    else propagates with its traceback.
    """
    prog = os.path.basename(sys.argv[0])
    try:
        status = main(argv)
    except USER_ERRORS as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"{prog}: error: {message}", file=sys.stderr)
        sys.exit(2)
    sys.exit(status)
