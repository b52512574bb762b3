"""``--profile_steps A,B``: profile global optimizer steps A..B with MindSpore 2.10's
``mindspore.profiler.profile`` and log the costliest operator types. The files written per
backend and how the summary reads them: docs/training.md#profiling-a-run."""
import csv
import glob
import logging
import os
import re
import time
from collections.abc import Sequence

import mindspore as ms
from mindspore.train import Callback, RunContext

from src.training.callbacks import StepState
from src.utils.config import ConfigError

CONFIG_KEY = "profile_steps"
TOP_OPS = 10
# op statistics files, preferred first: device op types (Ascend, GPU), then host (CPU) ones
STATS_PATTERNS = (("op_statistic.csv", "Ascend op_statistic"),
                  (r"gpu_op_type_info_\d+\.csv", "GPU op types"),
                  (r"cpu_op_type_info_\d+\.csv", "CPU op types"))
VIEWERS = ("MindStudio Insight (the MindSpore docs' viewer: open the folder), "
           "chrome://tracing or https://ui.perfetto.dev (open trace_view.json)")


def parse_profile_steps(values: Sequence[int] | None) -> tuple[int, int] | None:
    """``profile_steps`` checked: ``[A, B]`` (global optimizer steps, 1-based,
    inclusive) -> ``(A, B)``; empty or None -> None (off).

    Raises:
        ConfigError: Unless two integers with ``1 <= A <= B`` (names ``profile_steps``).
    """
    if values is None or (isinstance(values, (list, tuple)) and not values):
        return None
    if (not isinstance(values, (list, tuple)) or len(values) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in values)):
        raise ConfigError(f"{CONFIG_KEY} expects two integers FIRST,LAST (global optimizer "
                          f"steps, e.g. 20,25) or nothing for no profiling, got {values!r}")
    first, last = values
    if first < 1:
        raise ConfigError(f"{CONFIG_KEY} {first},{last}: the first step must be >= 1 "
                          f"(steps count from 1)")
    if last < first:
        raise ConfigError(f"{CONFIG_KEY} {first},{last}: the last step must be >= the first")
    return first, last


def _device_activities():
    """Profiler activities for the current device target: the host always, plus the device."""
    from mindspore.profiler import ProfilerActivity
    device = ms.get_context("device_target")
    extra = {"GPU": [ProfilerActivity.GPU], "Ascend": [ProfilerActivity.NPU]}.get(device, [])
    return [ProfilerActivity.CPU] + extra


def find_op_statistics(folder: str, since: float = 0.0,
                       pid: int | None = None) -> tuple[str, str] | None:
    """(path, kind) of the preferred op statistics file under ``folder``
    (device before host, then the newest), modified at or after ``since`` and, with ``pid``, in
    that process's ``*_ascend_ms`` session (or directly in ``folder``, GPU); None if none."""
    found = []
    for root, _, files in os.walk(folder):
        session = os.path.relpath(root, folder).split(os.sep)[0]
        if pid is not None and session != "." and f"_{pid}_" not in session:
            continue
        for name in files:
            for rank, (pattern, kind) in enumerate(STATS_PATTERNS):
                path = os.path.join(root, name)
                if re.fullmatch(pattern, name) and os.path.getmtime(path) >= since:
                    found.append((rank, -os.path.getmtime(path), path, kind))
    if not found:
        return None
    _, _, path, kind = min(found)
    return path, kind


def _column(header, *names, contains=None):
    """Index of the first header cell equal to one of ``names`` (case-insensitive), or
    holding all words of ``contains``; None if absent."""
    cells = [h.strip().lower() for h in header]
    for name in names:
        if name.lower() in cells:
            return cells.index(name.lower())
    for i, cell in enumerate(cells):
        if contains and all(word in cell for word in contains):
            return i
    return None


def read_op_statistics(path: str) -> list[dict]:
    """Per-op-type totals of a MindSpore (``cpu_/gpu_op_type_info``) or Ascend
    (``op_statistic.csv``) op statistics CSV, read by its header (time in ms, or us when the
    header says so): dicts of ``op_type``, ``time_ms`` (over the profiled steps) and ``calls``
    (None when absent), rows of one type summed.

    Raises:
        ValueError: If the header has no op type or total time column.
        OSError: If the file cannot be read.
    """
    with open(path, newline="", encoding="utf-8") as f:
        rows = [row for row in csv.reader(f) if any(cell.strip() for cell in row)]
    if not rows:
        raise ValueError(f"{path} is empty")
    header = rows[0]
    type_col = _column(header, "op_type", "op type", "type")
    time_col = _column(header, "total_compute_time", "total_time(ms)", "total time(ms)",
                       "total_time(us)", "total time(us)", contains=("total", "time"))
    count_col = _column(header, "type_occurrences", "count", "op_occurrences")
    if type_col is None or time_col is None:
        raise ValueError(f"{path}: no op type / total time column in header {header}")
    scale = 1e-3 if "(us)" in header[time_col].lower() else 1.0
    totals = {}
    for row in rows[1:]:
        op_type = row[type_col].strip()
        entry = totals.setdefault(op_type, {"op_type": op_type, "time_ms": 0.0, "calls": None})
        entry["time_ms"] += float(row[time_col]) * scale
        if count_col is not None and row[count_col].strip():
            entry["calls"] = (entry["calls"] or 0) + int(float(row[count_col]))
    return list(totals.values())


def top_ops(stats: list[dict], top: int = TOP_OPS) -> tuple[list[dict], float]:
    """(the ``top`` op types of ``stats`` by total time, each with its ``share`` of all op
    time in 0..1; that total in ms)."""
    total = sum(s["time_ms"] for s in stats)
    ranked = sorted(stats, key=lambda s: s["time_ms"], reverse=True)[:top]
    return [dict(s, share=s["time_ms"] / total if total > 0 else 0.0) for s in ranked], total


def format_table(ops: list[dict], total_ms: float, op_type_count: int, steps: int) -> str:
    """The logged table: op type, total ms, ms per step, share, calls; then the total."""
    width = max([len("op type")] + [len(o["op_type"]) for o in ops])
    lines = [f"  {'op type':<{width}}  {'time ms':>10}  {'ms/step':>9}  {'share':>6}  "
             f"{'calls':>6}"]
    for o in ops:
        calls = "" if o["calls"] is None else str(o["calls"])
        lines.append(f"  {o['op_type']:<{width}}  {o['time_ms']:>10.3f}  "
                     f"{o['time_ms'] / max(steps, 1):>9.3f}  {100 * o['share']:>5.1f}%  "
                     f"{calls:>6}")
    shown = sum(o["share"] for o in ops)
    lines.append(f"  top {len(ops)} of {op_type_count} op types: {100 * shown:.1f}% of "
                 f"{total_ms:.3f} ms operator time ({total_ms / max(steps, 1):.3f} ms/step)")
    return "\n".join(lines)


class ProfileSteps(Callback):
    """Profile global optimizer steps ``first_step``..``last_step`` (1-based,
    inclusive; cut to ``total_steps``) into ``output_dir`` and log the ``top`` op types by time.
    Listed after ``StepState``; whole sink calls in sink mode; never raises into training
    (failures are warnings). See docs/training.md#profiling-a-run.

    Attributes:
        summary (dict | None): After the analysis: ``first_step``, ``last_step``, ``steps``,
            ``folder``, ``stats_file``, ``trace_file``, ``total_ms``, ``ops`` (``op_type``,
            ``time_ms``, ``share``, ``calls``) and ``analysis_s``; None before or on failure.
        start_step (int | None): The first step this run profiles (None: none).
        last_step (int): The last step it profiles.
    """

    def __init__(self, state: StepState, first_step: int, last_step: int, *, output_dir: str,
                 logger: logging.Logger, total_steps: int | None = None, top: int = TOP_OPS):
        super().__init__()
        self.state = state
        self.first_step, self.last_step = first_step, last_step
        self.output_dir = os.path.abspath(output_dir)
        self.logger = logger
        self.top = top
        self.summary = None
        self.start_step = self.profiled_first = None
        self._profiler = None
        self._phase = "done"  # waiting -> warmup -> recording -> done
        self._since = None
        self._active = self._recorded = 0  # calls the schedule records; calls begun
        self._call_steps = 1  # steps per call seen while recording (sink mode: > 1)
        requested = f"{first_step}..{last_step}"
        if total_steps is not None and last_step > total_steps:
            self.last_step = total_steps
            self.logger.warning("%s %s: the run has %d optimizer steps, profiling up to step "
                                "%d", CONFIG_KEY, requested, total_steps, total_steps)
        self._run_begin = state.global_step + 1
        if self._run_begin > self.last_step:
            self.logger.info("%s %s: this run starts at step %d, after the range: nothing is "
                             "profiled", CONFIG_KEY, requested, self._run_begin)
            return
        self.start_step = max(first_step, self._run_begin)
        if self.start_step > first_step:
            self.logger.info("%s %s: this run starts at step %d: profiling steps %d..%d",
                             CONFIG_KEY, requested, self._run_begin, self.start_step,
                             self.last_step)
        self._phase = "waiting"

    def _open(self, done, steps_per_call):
        """Create and start the profiler (warm-up: set up, not recording), its schedule
        recording the calls of ``steps_per_call`` steps from step ``done + 1`` to the last."""
        from mindspore import profiler
        os.makedirs(self.output_dir, exist_ok=True)
        self._active = max(1, -(-(self.last_step - done) // steps_per_call))
        self._since = time.time()
        self._profiler = profiler.profile(
            activities=_device_activities(), start_profile=False,
            schedule=profiler.schedule(wait=0, warmup=1, active=self._active, repeat=1),
            on_trace_ready=profiler.tensorboard_trace_handler(self.output_dir))
        self._profiler.start()

    def _fail(self, what, err):
        if self._profiler is not None:
            try:
                self._profiler.stop()
            except Exception:  # pylint: disable=broad-except
                pass
        self._profiler, self._phase = None, "done"
        self.logger.warning("profiling disabled, training goes on: %s (%s: %s); profiler "
                            "folder %s", what, type(err).__name__, str(err).splitlines()[0]
                            if str(err) else "", self.output_dir)

    def on_train_step_begin(self, run_context: RunContext) -> None:
        if self._phase not in ("waiting", "warmup", "recording"):
            return
        done = self.state.global_step
        per_call = max(1, getattr(self.state, "steps_per_call", 1))
        try:
            if self._phase == "recording":
                self._call_steps = max(self._call_steps, per_call)
                if self._recorded < self._active:  # else the schedule's last call goes on
                    self._profiler.step()
                    self._recorded += 1
                return
            if done + per_call < self.start_step:  # this call ends before the range
                if self._phase == "waiting" and done + 2 * per_call >= self.start_step:
                    self._open(done + per_call, per_call)  # warm-up: the call before it
                    self._phase = "warmup"
                return
            if self._phase == "waiting":  # no warm-up call in this run
                self._open(done, per_call)
            self._profiler.step()  # warm-up -> recording
            self._phase, self.profiled_first, self._recorded = "recording", done + 1, 1
            self._call_steps = per_call
            self.logger.info("profiling steps %d..%d into %s", done + 1, self.last_step,
                             self.output_dir)
            if done + 1 == self._run_begin:
                self.logger.info("step %d is the first this run trains: its operator times "
                                 "include one-off kernel set-up; profile later steps for "
                                 "steady-state numbers", done + 1)
        except Exception as err:  # pylint: disable=broad-except
            self._fail("cannot start the profiler", err)

    def on_train_step_end(self, run_context: RunContext) -> None:
        if self._phase == "recording" and self.state.global_step >= self.last_step:
            self.close()

    def on_train_end(self, run_context: RunContext) -> None:
        if self._phase in ("warmup", "recording") and run_context.get_stop_requested():
            self.close()

    def close(self) -> None:
        """Stop the profiling session if one is open, analyse the steps it recorded and log
        the summary. Called after ``last_step``; train.py also calls it when training ends
        (it does nothing when no session is open, and may be called again)."""
        if self._phase not in ("warmup", "recording"):
            return
        try:
            self._finish()
        except Exception as err:  # pylint: disable=broad-except
            self._fail("cannot stop or analyse the profiler", err)

    def _finish(self):
        """Stop recording, analyse, log the summary."""
        last = self.state.global_step
        if self._phase == "warmup" or last < self.profiled_first:
            self._profiler.stop()
            self._profiler, self._phase = None, "done"
            self.logger.info("%s: training ended before step %d: nothing was profiled",
                             CONFIG_KEY, self.start_step)
            return
        self.logger.info("profiled steps %d..%d%s: analysing (training waits)...",
                         self.profiled_first, last, "" if last >= self.last_step else
                         f" (training ended before step {self.last_step})")
        started = time.time()
        if self._recorded == self._active:  # the schedule's end: stop and analyse ...
            self._profiler.step()
        # ... then stop() only closes the session; before that end it stops and analyses
        # (MindSpore then warns that the schedule was cut short)
        self._profiler.stop()
        self._profiler, self._phase = None, "done"
        self._summarize(self.profiled_first, last, time.time() - started)

    def _summarize(self, first, last, analysis_s):
        """Read the op statistics the profiler wrote and log the table (or a warning)."""
        steps = last - first + 1
        found = find_op_statistics(self.output_dir, self._since - 1.0, os.getpid())
        if found is None:
            self.logger.warning("profiled steps %d..%d, but no op statistics file (%s) was "
                                "written under %s: see the profiler log in its logs/ folder",
                                first, last, ", ".join(p for p, _ in STATS_PATTERNS),
                                self.output_dir)
            return
        path, kind = found
        try:
            stats = read_op_statistics(path)
        except (OSError, ValueError, IndexError) as err:
            self.logger.warning("profiled steps %d..%d, but %s cannot be read (%s); the "
                                "profiler folder is %s", first, last, path, err,
                                self.output_dir)
            return
        ops, total_ms = top_ops(stats, self.top)
        session = self._session_folder(path)
        trace = glob.glob(os.path.join(session, "**", "trace_view.json"), recursive=True)
        self.summary = {"first_step": first, "last_step": last, "steps": steps,
                        "folder": session, "stats_file": path,
                        "trace_file": trace[0] if trace else None, "total_ms": total_ms,
                        "ops": ops, "analysis_s": analysis_s}
        table = format_table(ops, total_ms, len(stats), steps)
        sink = (f", whole sink calls of up to {self._call_steps} steps"
                if self._call_steps > 1 else "")
        self.logger.info(
            "profile of steps %d..%d (%d optimizer step%s%s, analysed in %.1f s), %s from %s:"
            "\n%s\nprofiler files: %s\n  timeline: %s\n  view with %s", first, last, steps,
            "" if steps == 1 else "s", sink, analysis_s, kind, os.path.relpath(path, session),
            table, session, trace[0] if trace else "none written", VIEWERS)

    def _session_folder(self, path):
        """The ``*_ascend_ms`` folder holding ``path`` (``output_dir`` if none does)."""
        rel = os.path.relpath(path, self.output_dir).split(os.sep)
        return os.path.join(self.output_dir, rel[0]) if len(rel) > 1 else self.output_dir
