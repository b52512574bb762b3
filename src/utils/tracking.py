"""TensorBoard event files of a run (``tensorboard true``), written with tensorboardX's protocol
buffers and record writer, synchronously: each call appends its events and flushes, so a
watching TensorBoard (``tensorboard --logdir output/``) sees them at once, and a failed write is
known where it happens. A write that fails (full disk, read-only folder, a file where the folder
should be) logs one warning and ends tracking; the run goes on untouched.

(tensorboardX's ``SummaryWriter`` writes from a background thread through a bounded queue: a
write error there ends the thread silently and a full queue then blocks the caller, which would
stop training; hence the synchronous writer here.)
"""
import logging
import os
import tempfile
import time

import numpy as np

from src.utils.errors import UserError

LOGGER = logging.getLogger(__name__)
FOLDER = "tensorboard"
"""The events' folder inside ``output_dir``."""


class TrackingError(UserError):
    """Tracking was asked for but its writer is not installed."""


def _tensorboardx():
    try:
        import tensorboardX  # noqa: F401
    except ImportError as err:
        raise TrackingError("tensorboard true needs the tensorboardX package (in "
                            "requirements.txt): pip install tensorboardX") from err
    from tensorboardX import summary
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto.event_pb2 import Event, SessionLog
    return summary, EventsWriter, Event, SessionLog


class TensorBoardLog:
    """Scalars, images and hyperparameters of one process, as TensorBoard reads them.

    Steps are global optimizer steps (the ``step`` of ``metrics.jsonl``). A run resumed at
    step S opens its file with ``purge_step`` S + 1: TensorBoard's reader then drops the
    events an interrupted run wrote after S, so the curves continue without duplicated or
    backwards steps (tensorboardX's ``SummaryWriter(purge_step=...)`` convention: a
    ``SessionLog.START`` event at that step).

    Args:
        logdir (str): The events' folder (created at the first write).
        purge_step (int, optional): First step this process writes; events of earlier files
            at or after it are hidden. None: nothing hidden.
        logger (logging.Logger): Where the one warning of a failed write goes.

    Raises:
        TrackingError: If tensorboardX is not installed.
    """

    def __init__(self, logdir, purge_step=None, logger=LOGGER):
        self.summary, self._writer_class, self._event, self._session_log = _tensorboardx()
        self.logdir, self.purge_step, self.logger = logdir, purge_step, logger
        self.writer = None
        self.failed = self.drawing_failed = False

    def _write(self, summaries, step):
        """Append one event per summary at ``step`` and flush; on failure warn once and stop."""
        if self.failed:
            return
        try:
            if self.writer is None:
                os.makedirs(self.logdir, exist_ok=True)
                self.writer = self._writer_class(os.path.join(self.logdir, "events"))
                if self.purge_step is not None:
                    self.writer.write_event(self._event(
                        step=self.purge_step, wall_time=time.time(),
                        session_log=self._session_log(status=self._session_log.START)))
            for summary in summaries:
                self.writer.write_event(self._event(summary=summary, step=step,
                                                    wall_time=time.time()))
            self.writer.flush()
        except Exception as err:  # noqa: BLE001  any failure of the writer ends tracking only
            self.failed = True
            self.logger.warning("tensorboard: cannot write events in %s (%s); TensorBoard "
                                "logging stops, training goes on", self.logdir,
                                str(err).splitlines()[0] if str(err) else type(err).__name__)
            self._close_quietly()

    def scalars(self, step, values):
        """Write ``{tag: number}`` at ``step`` (None values are skipped)."""
        self._write([self.summary.scalar(tag, float(value)) for tag, value in values.items()
                     if value is not None], step)

    def image(self, tag, step, png_path):
        """Write the PNG file ``png_path`` as image ``tag`` at ``step``."""
        from PIL import Image
        try:
            with Image.open(png_path) as picture:
                pixels = np.asarray(picture.convert("RGB"))
        except OSError as err:
            self.logger.warning("tensorboard: cannot read %s: %s", png_path, err)
            return
        self._write([self.summary.image(tag, pixels, dataformats="HWC")], step)

    def drawn_image(self, tag, step, draw):
        """Write the picture ``draw(path)`` saves as a PNG (in a temporary folder, removed after)
        as image ``tag`` at ``step``. A drawing that fails (matplotlib absent, a write error)
        logs one warning and no picture is drawn again; scalars go on."""
        if self.failed or self.drawing_failed:
            return
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "picture.png")
            try:
                draw(path)
            except (OSError, UserError) as err:
                self.drawing_failed = True
                self.logger.warning("tensorboard: no %s picture (%s); scalars go on", tag,
                                    str(err).splitlines()[0] if str(err) else type(err).__name__)
                return
            self.image(tag, step, path)

    def hparams(self, config, metrics, step):
        """The run's resolved config as hyperparameters (lists as strings: TensorBoard takes
        scalars) with its final ``metrics`` (``{tag: number}``), in TensorBoard's HParams
        dashboard."""
        flat = {key: (value if isinstance(value, (bool, int, float, str)) else str(value))
                for key, value in config.items()}
        metrics = {tag: float(value) for tag, value in metrics.items() if value is not None}
        self._write(list(self.summary.hparams(flat, metrics)), step)
        self.scalars(step, metrics)

    def _close_quietly(self):
        try:
            if self.writer is not None:
                self.writer.close()
        except Exception:  # noqa: BLE001  the warning was given already
            pass
        self.writer = None

    def close(self):
        """Flush and close the file (nothing happens if nothing was written)."""
        if not self.failed:
            self._close_quietly()
