"""Stall detection in the launch process: watch the local ranks' heartbeat records, and when a
rank has not advanced for `diagnostics.stall_seconds`, capture before anything is killed.

Capture: faulthandler's stacks of every thread of every local worker (STACKS_SIGNAL; the
handler runs at C level, so a worker stuck in a gloo/NCCL wait answers), the collectives each
rank started and finished, the lagging rank and this pod/node (POD_NAME/NODE_NAME from the
downward API, else the host name). The report goes to the log (between marker lines, which
`kubeddp diagnose` reads back), to `diagnostics.report_dir` and, at exit, to the
container's termination message. Then `diagnostics.on_stall`: `wait` (report once per stall),
or `exit`: stop the workers and end launch with STALLED (203, retryable).

A rank is watched from its first finished step (start-up is bounded by the start-up timeout).
A user program that never calls report_step counts its optimizer steps (worker/program.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kubeddp.trainer import constants, exit_codes, storage_rules
from kubeddp.trainer.common import installed_torch_version, this_pod
from kubeddp.trainer.config import DiagnosticsConfig
from kubeddp.trainer.launcher import scratch
from kubeddp.trainer.launcher.retry_budget import write_termination_message
from kubeddp.trainer.launcher.stall_report import (
    RankState,
    StallReport,
    build_report,
    flight_recorder_summary,
)
from kubeddp.trainer.process_contract import (
    ENV_DIAG_DIR,
    RECORD_GLOB,
    STACKS_SIGNAL,
    RankRecord,
    fr_buffer_default,
    fr_dump_path,
    read_record,
    request_flight_recorder,
    stacks_path,
)

REPORT_BEGIN = "[kubeddp] ---- stall report begin ----"
REPORT_END = "[kubeddp] ---- stall report end ----"
STALL_LINE = "[kubeddp] stall: "
STACKS_WAIT_SECONDS = 3.0
# In a pod (POD_NAME set by the downward API), a line of the local ranks' progress this often:
# `kubeddp status` reads each pod's phase and step from it (no log noise on a laptop).
PROGRESS_LINE = "[kubeddp] progress: "
PROGRESS_EVERY_SECONDS = 60.0


def report_dir(settings: DiagnosticsConfig, checkpoint_dir: str) -> Path | None:
    """diagnostics.report_dir, else `.kubeddp-diagnostics` in a local checkpoint.dir (a name
    the checkpoint directory's safety check knows as kubeddp's); None for object storage
    without a report_dir (the report is then in the log only)."""
    if settings.report_dir:
        return Path(settings.report_dir)
    if not storage_rules.is_directory(checkpoint_dir):
        return None
    return Path(checkpoint_dir) / ".kubeddp-diagnostics"


def read_records(directory: str) -> list[RankRecord]:
    found = (read_record(p) for p in sorted(Path(directory).glob(RECORD_GLOB)))
    return [r for r in found if r is not None]


class StallWatch:
    def __init__(
        self, settings: DiagnosticsConfig, checkpoint_dir: str, log: Callable[[str], None]
    ) -> None:
        self.stall_seconds = settings.stall_seconds
        self.action = settings.on_stall
        self.report_dir = report_dir(settings, checkpoint_dir)
        self.log = log
        self.directory = str(scratch.owned_dir(constants.DIAG_DIR_PREFIX))
        self.acted = False  # on_stall=exit ended the workers
        self.reports: list[StallReport] = []
        self._reported = False  # this stall is reported; re-armed when every rank advances
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubeddp-stall-watch", daemon=True)
        self.interval = min(5.0, max(0.2, self.stall_seconds / 10))
        self.progress_every = (
            PROGRESS_EVERY_SECONDS if os.environ.get(constants.ENV_POD_NAME) else 0
        )
        self._next_progress = 0.0

    @property
    def env(self) -> dict[str, str]:
        """What the workers need: the record directory, and NCCL's flight recorder on."""
        env = {ENV_DIAG_DIR: self.directory}
        env.update(fr_buffer_default(os.environ, installed_torch_version()))
        if "TORCH_NCCL_DUMP_ON_TIMEOUT" not in os.environ and self.report_dir is not None:
            env["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
            env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = str(self.report_dir / "nccl-trace-rank-")
        return env

    def start(self) -> None:
        self._thread.start()

    def finish(self, code: int) -> int:
        """Stop watching; the launch's exit code (STALLED when on_stall=exit acted)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self.acted:
            code = exit_codes.STALLED
        if self.reports and code != exit_codes.OK:
            write_termination_message(STALL_LINE + self.reports[-1].line)
        return code

    def records(self) -> list[RankRecord]:
        """Every local rank's progress record, as read now."""
        return read_records(self.directory)

    def termination_line(self) -> str:
        """The newest stall report's one line (the pod's termination message)."""
        if not self.reports:
            return f"stalled: exit code {exit_codes.describe(exit_codes.STALLED)}"
        return STALL_LINE + self.reports[-1].line

    def remove(self) -> None:
        """Remove the record directory (after the last scrape)."""
        with contextlib.suppress(OSError):
            for path in Path(self.directory).iterdir():
                path.unlink()
            os.rmdir(self.directory)

    # ---- the watch ---------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check(time.monotonic())
            except Exception as exc:  # the watch must never take training down
                self.log(f"[kubeddp] warning: stall watch: {exc!r}")

    def check(self, now: float) -> StallReport | None:
        """One look at the records; the report when this look found a new stall."""
        records = [r for r in read_records(self.directory) if r.step >= 1]
        records = [r for r in records if r.phase not in ("finished",) and _alive(r.pid)]
        if not records:
            return None
        if self.progress_every and now >= self._next_progress:
            self._next_progress = now + self.progress_every
            self.log(PROGRESS_LINE + progress_text(records, now))
        idle = {r.rank: now - r.last_progress for r in records}
        if max(idle.values()) < self.stall_seconds:
            self._reported = False
            return None
        if self._reported:
            return None
        self._reported = True
        report = self.capture(records, now)
        self.reports.append(report)
        self._publish(report)
        if self.action == "exit":
            self._end_workers(records)
        return report

    def capture(self, records: list[RankRecord], now: float) -> StallReport:
        offsets = {}
        for r in records:
            path = stacks_path(self.directory, r.rank)
            offsets[r.rank] = path.stat().st_size if path.exists() else 0
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(r.pid, STACKS_SIGNAL)
        asked = {r.rank for r in records if _ask_flight_recorder(self.directory, r.rank)}
        stacks = _read_new_stacks(self.directory, offsets)
        recorded = _read_flight_recorders(self.directory, asked)
        states = [
            RankState(r, now - r.last_progress, stacks.get(r.rank, ""), recorded.get(r.rank, ""))
            for r in records
        ]
        return build_report(states, this_pod(), self.stall_seconds)

    def _publish(self, report: StallReport) -> None:
        saved = self._save(report)
        where = f" (full report: {saved})" if saved else ""
        self.log(f"{REPORT_BEGIN}\n{report.text}\n{REPORT_END}")
        self.log(f"{STALL_LINE}{report.line}{where}")

    def _save(self, report: StallReport) -> str | None:
        if self.report_dir is None:
            return None
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        pod = (os.environ.get(constants.ENV_POD_NAME) or socket.gethostname()).replace("/", "_")
        path = self.report_dir / f"stall-{pod}-{stamp}.txt"
        try:
            self.report_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(report.text + "\n")
        except OSError as exc:
            self.log(f"[kubeddp] warning: cannot write the stall report to {path}: {exc}")
            return None
        return str(path)

    def _end_workers(self, records: list[RankRecord]) -> None:
        """on_stall=exit: the agent stops (SIGTERM to this process, as a preemption would),
        and the stuck workers, which no SIGTERM handler can reach, are killed."""
        self.acted = True
        self.log(
            f"[kubeddp] stall: ending the workers (diagnostics.on_stall=exit); exit code "
            f"{exit_codes.describe(exit_codes.STALLED)}"
        )
        os.kill(os.getpid(), signal.SIGTERM)
        for r in records:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(r.pid, signal.SIGKILL)


def progress_text(records: list[RankRecord], now: float) -> str:
    """`rank 4 step 120 data 0 s, rank 5 step 120 optimizer 0 s` (seconds since progress)."""
    return ", ".join(
        f"rank {r.rank} step {r.step} {r.phase} {now - r.last_progress:.0f} s" for r in records
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_new_stacks(directory: str, offsets: dict[int, int]) -> dict[int, str]:
    """What each rank's faulthandler wrote after `offsets`, waiting a little for the dumps
    (a handler writes in one go, but the signal may reach a process a moment later)."""
    deadline = time.monotonic() + STACKS_WAIT_SECONDS
    found: dict[int, str] = {}
    while True:
        for rank, offset in offsets.items():
            path = stacks_path(directory, rank)
            with contextlib.suppress(OSError), open(path, errors="replace") as f:
                f.seek(offset)
                text = f.read()
                if text:
                    found[rank] = text
        if len(found) == len(offsets) or time.monotonic() > deadline:
            time.sleep(0.1)  # let a dump in progress finish
            return {rank: _reread(directory, rank, offsets[rank]) for rank in found}
        time.sleep(0.05)


def _ask_flight_recorder(directory: str, rank: int) -> bool:
    path = fr_dump_path(directory, rank)
    with contextlib.suppress(OSError):
        path.unlink()
    return request_flight_recorder(directory, rank)


def _read_flight_recorders(directory: str, ranks: set[int]) -> dict[int, str]:
    """Each asked rank's flight-recorder summary (a rank whose thread cannot run gives none)."""
    deadline = time.monotonic() + STACKS_WAIT_SECONDS
    found: dict[int, str] = {}
    while ranks - set(found) and time.monotonic() < deadline:
        for rank in ranks - set(found):
            with contextlib.suppress(OSError):
                found[rank] = flight_recorder_summary(fr_dump_path(directory, rank).read_text())
        time.sleep(0.05)
    return found


def _reread(directory: str, rank: int, offset: int) -> str:
    with open(stacks_path(directory, rank), errors="replace") as f:
        f.seek(offset)
        return f.read()


def start_diagnostics(
    settings: DiagnosticsConfig, checkpoint_dir: str, metrics: Any, log: Callable[[str], None]
) -> StallWatch | None:
    """The watch (None when diagnostics are off), its progress series on /metrics; its reports
    go beside the checkpoints in `checkpoint_dir` unless diagnostics.report_dir says where."""
    if not settings.enabled:
        return None
    watch = StallWatch(settings, checkpoint_dir, log)
    if metrics is not None:
        # prometheus_client (through diag_metrics), only when /metrics is served: `kubeddp train
        # --help` imports this module
        from kubeddp.trainer.launcher.diag_metrics import ProgressCollector

        metrics.registry.register(ProgressCollector(watch, metrics.cfg.per_rank))
    watch.start()
    return watch
