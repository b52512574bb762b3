"""TensorBoard event files of a run (``tensorboard true``), written synchronously with
tensorboardX's record writer: a failed write logs one warning and ends tracking, the run goes on.
See docs/reliability.md#tensorboard-writes for why not ``SummaryWriter``.
"""
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping

import numpy as np

from src.utils.errors import UserError

LOGGER = logging.getLogger(__name__)
TENSORBOARD_FOLDER = "tensorboard"
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
    """Scalars, images and hyperparameters of one process at global optimizer steps.

    A resumed run passes ``purge_step`` S + 1: a ``SessionLog.START`` event there makes
    TensorBoard hide the earlier files' events at or after it (tensorboardX's convention).

    Args:
        logdir: The events' folder (created at the first write).
        purge_step: First step this process writes; None: nothing hidden.
        logger: Where the one warning of a failed write goes.

    Raises:
        TrackingError: If tensorboardX is not installed.
    """

    def __init__(self, logdir: str, purge_step: int | None = None,
                 logger: logging.Logger = LOGGER):
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

    def scalars(self, step: int, values: Mapping[str, float | None]) -> None:
        """Write ``{tag: number}`` at ``step`` (None values are skipped)."""
        self._write([self.summary.scalar(tag, float(value)) for tag, value in values.items()
                     if value is not None], step)

    def text(self, tag: str, step: int, text: str) -> None:
        """Write ``text`` as text summary ``tag`` at ``step``."""
        self._write([self.summary.text(tag, text)], step)

    def image(self, tag: str, step: int, png_path: str) -> None:
        """Write the PNG file ``png_path`` as image ``tag`` at ``step``."""
        from PIL import Image
        try:
            with Image.open(png_path) as picture:
                pixels = np.asarray(picture.convert("RGB"))
        except OSError as err:
            self.logger.warning("tensorboard: cannot read %s: %s", png_path, err)
            return
        self._write([self.summary.image(tag, pixels, dataformats="HWC")], step)

    def drawn_image(self, tag: str, step: int, draw: Callable[[str], None]) -> None:
        """Write the PNG ``draw(path)`` saves (in a temporary folder) as image ``tag``; a failed
        drawing logs one warning and ends pictures, scalars go on."""
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

    def hparams(self, config: Mapping[str, bool | int | float | str | list],
                metrics: Mapping[str, float | None],
                step: int) -> None:
        """The run's config as hyperparameters (lists as strings) with its final ``metrics``."""
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

    def close(self) -> None:
        """Flush and close the file (nothing happens if nothing was written)."""
        if not self.failed:
            self._close_quietly()
