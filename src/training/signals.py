"""Stop signals during training: SIGINT/SIGTERM finish the current step, save and stop; in data
parallel every rank stops after the same step, also on a failure of one rank (non-finite loss,
a file not written). A second signal exits at once."""
import logging
import os
import signal
from collections.abc import Callable

from mindspore.train import Callback, RunContext

from src.training.callbacks import STOP_REASONS, StepState

LOGGER = logging.getLogger(__name__)


class StopSignals(Callback):
    """SIGINT/SIGTERM: finish the current step, save, stop; a second signal exits at once
    (``exit_now``). ``install()`` early and around every call of the training cell. In data
    parallel the ranks exchange signals and failures after every optimizer step and all stop
    after the same one (``received``, ``StepState.stopped_by``). See
    docs/reliability.md#stop-signals-in-data-parallel.

    Args:
        logger (logging.Logger): Gets the acknowledgement.
        exit_now (callable): ``exit_now(status)`` for the second signal (``os._exit``).
        gather (callable, optional): ``gather(int) -> list[int]`` of every rank in rank order;
            given, the stop is collective from the start (default in data parallel:
            ``src.utils.device.all_gather_int``).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    REASON_UNIT = 256  # the exchanged int: signal number + REASON_UNIT x failure reason

    def __init__(self, logger: logging.Logger, exit_now: Callable[[int], None] = os._exit,
                 gather: Callable[[int], list[int]] | None = None):
        super().__init__()
        self.logger = logger
        self.exit_now = exit_now
        self.received = None  # the signal that stops training (agreed, in data parallel)
        self.own = None  # the first signal this process got
        self.state = None  # the StepState whose failures are agreed on (``watch``)
        self._gather = gather
        self._previous = {}

    def watch(self, state: StepState) -> "FailureAgreement":
        """Agree on ``state``'s failures (a ``StepState``) too; returns the callback that
        exchanges them at the end of every epoch (``FailureAgreement``), to be listed after
        the callbacks that write files."""
        self.state = state
        state.agreed = self.collective
        return FailureAgreement(self)

    @property
    def signum(self) -> int | None:
        """The signal that stopped training (an int), or None."""
        return getattr(signal, self.received) if self.received else None

    @property
    def collective(self) -> bool:
        """Whether the stop is agreed over the ranks (data parallel)."""
        return self._gather is not None

    def gather(self, value: int) -> list[int]:
        """Every rank's ``value`` in rank order (``[value]`` outside data parallel); every rank
        must call it at the same point."""
        return self._gather(value) if self.collective else [value]

    def install(self) -> None:
        """Catch SIGINT and SIGTERM (the handlers found first are kept for ``restore``)."""
        for signum in self.SIGNALS:
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)

    def restore(self) -> None:
        """Put back the handlers found before the first ``install``."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame):
        del frame
        name = signal.Signals(signum).name
        if self.own:
            self.logger.error("second stop signal (%s): exiting now without saving", name)
            self.exit_now(128 + signum)
            return
        self.own = name
        if not self.collective:
            self.received = name
        self.logger.warning("%s received: stopping after the current step with a checkpoint%s "
                            "(Ctrl-C again to exit at once, without saving)", name,
                            ", every rank after the same step" if self.collective else "")

    def on_train_begin(self, run_context: RunContext) -> None:
        from mindspore import ParallelMode

        cb_params = run_context.original_args()
        try:
            parallel = (cb_params.parallel_mode == ParallelMode.DATA_PARALLEL
                        and (cb_params.device_number or 1) > 1)
        except (AttributeError, KeyError):  # not Model's parameters (tests)
            parallel = False
        if parallel and self._gather is None:
            from src.utils.device import all_gather_int
            self._gather = all_gather_int
        if self.state is not None:
            self.state.agreed = self.collective

    def on_train_step_begin(self, run_context: RunContext) -> None:
        self.install()

    def on_train_step_end(self, run_context: RunContext) -> None:
        self.install()
        if self.collective and (self.received is None or self._failures_open()):
            self._agree(run_context, signals=self.received is None)

    def _failures_open(self):
        """Whether failures are still exchanged (none agreed yet); the same on every rank."""
        return self.state is not None and self.state.stopped_by is None

    def agree_failures(self, run_context: RunContext) -> None:
        """Exchange the failures alone (``FailureAgreement``, at the end of an epoch)."""
        if self.collective and self._failures_open():
            self._agree(run_context, signals=False)

    def _agree(self, run_context, signals=True):
        """Exchange the signals (with ``signals``) and the failures the ranks got; on a
        failure or a signal, stop every rank after this step."""
        failure = (self.state.failure or 0) if self._failures_open() else 0
        own = getattr(signal, self.own) if signals and self.own else 0
        values = self.gather(own + self.REASON_UNIT * failure)
        failed = [(rank, value // self.REASON_UNIT) for rank, value in enumerate(values)
                  if value // self.REASON_UNIT]
        if failed and self._failures_open():
            rank, reason = failed[0]
            self.state.stopped_by = (rank, reason, self.state.global_step)
            self.logger.error("stopping every rank after global step %d: %s",
                              self.state.global_step, ", ".join(
                                  f"rank {r} stopped ({STOP_REASONS.get(x, x)})"
                                  for r, x in failed))
            run_context.request_stop()
        if not signals:
            return
        signalled = [(rank, signal.Signals(value % self.REASON_UNIT).name)
                     for rank, value in enumerate(values) if value % self.REASON_UNIT]
        if not signalled:
            return
        self.received = self.own or signalled[0][1]
        self.logger.warning("stopping every rank after this step (rank 0 saves it): %s",
                            ", ".join(f"rank {rank} received {name}"
                                      for rank, name in signalled))
        run_context.request_stop()


class FailureAgreement(Callback):
    """Listed after the callbacks that write files (``StopSignals.watch`` returns
    it): at the end of every ``Model.train`` epoch (sink call) the ranks exchange their failures
    (``StopSignals.agree_failures``), so a write that failed on rank 0 stops every rank after that
    step."""

    def __init__(self, stop: StopSignals):
        super().__init__()
        self.stop = stop

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        self.stop.agree_failures(run_context)
