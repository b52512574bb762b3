"""Running an entry point: errors in the user's input become one clear line and exit status 2."""
import os
import sys

from src.utils.errors import UserError


def run_entry_point(main, argv=None):
    """Call ``main(argv)`` and exit with its status.

    A ``UserError`` (a bad config value, path, data folder or checkpoint, raised by this
    package's checks) prints ``<script>: error: <message>`` on stderr and exits with status 2,
    like argparse. Every other exception, from MindSpore, numpy or a bug here, propagates
    with its traceback.
    """
    prog = os.path.basename(sys.argv[0])
    try:
        status = main(argv)
    except UserError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        sys.exit(2)
    sys.exit(status)
