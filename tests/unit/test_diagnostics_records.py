"""The heartbeat record as another process reads it, the stall report built from records and
faulthandler's own output, and the progress series /metrics serves (as docs/metrics.md says).
"""

from __future__ import annotations

import faulthandler
import os
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from kubeddp.trainer import process_contract
from kubeddp.trainer.config import load_config
from kubeddp.trainer.launcher import stall_report
from kubeddp.trainer.launcher.diag_metrics import ProgressCollector
from kubeddp.trainer.launcher.stall_report import flight_recorder_summary
from kubeddp.trainer.launcher.stall_watch import StallWatch
from kubeddp.trainer.process_contract import PHASE_CODE, read_record, record_path
from kubeddp.trainer.worker.heartbeat import Heartbeat
from tests.helpers.metrics import documented_tables
from tests.helpers.ports import free_port


def _beat(directory: Path, rank: int) -> Heartbeat:
    hb = Heartbeat(str(directory), rank)
    hb.step_done(3, PHASE_CODE["step"], 0.5)
    hb.phase(PHASE_CODE["data"])
    return hb


def test_a_record_reads_back_what_the_rank_wrote(tmp_path: Path) -> None:
    hb = _beat(tmp_path, 2)
    try:
        hb.collective_start(process_contract.COLLECTIVES.index("all_reduce"))
        hb.nonfinite(3, "gradient norm")
        hb.straggler(2.5)
        r = read_record(record_path(tmp_path, 2))
        assert r is not None
        assert (r.rank, r.pid, r.step, r.phase) == (2, os.getpid(), 3, "data")
        assert r.main_thread == threading.main_thread().ident
        assert r.in_collective and r.collective_op == "all_reduce"
        assert r.op_counts[process_contract.COLLECTIVES.index("all_reduce")] == 1
        assert (r.nonfinite_step, r.nonfinite_what) == (3, "gradient norm")
        assert r.busy_seconds == 0.5 and r.straggler_ratio == 2.5
    finally:
        hb.close()
    assert read_record(record_path(tmp_path, 2)).phase == "finished"


def test_a_short_or_foreign_file_is_not_a_record(tmp_path: Path) -> None:
    (tmp_path / "rank-0.hb").write_bytes(b"KDHB")
    (tmp_path / "rank-1.hb").write_bytes(bytes(process_contract.RECORD_SIZE))
    assert read_record(tmp_path / "rank-0.hb") is None
    assert read_record(tmp_path / "rank-1.hb") is None
    assert read_record(tmp_path / "rank-9.hb") is None


def _own_stacks(tmp_path: Path) -> str:
    """faulthandler's dump of this process (the format the report parses)."""
    path = tmp_path / "stacks.txt"
    with open(path, "w") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
    return path.read_text()


def test_the_report_names_the_rank_that_is_not_waiting_and_its_frame(tmp_path: Path) -> None:
    sleeper, waiter = _beat(tmp_path, 1), _beat(tmp_path, 0)
    try:
        waiter.collective_start(0)
        stacks = _own_stacks(tmp_path)
        states = [
            stall_report.RankState(read_record(record_path(tmp_path, 0)), 40.0, ""),
            stall_report.RankState(read_record(record_path(tmp_path, 1)), 41.0, stacks),
        ]
    finally:
        sleeper.close()
        waiter.close()
    report = stall_report.build_report(states, "pod j-worker-1, node n7", 30)
    assert report.lagging_rank == 1
    assert report.line.startswith("rank 1 (pod j-worker-1, node n7) has been in data: ")
    assert "_own_stacks (test_diagnostics_records.py:" in report.line, report.line
    assert report.line.endswith("1 rank waits in all_reduce #1"), report.line
    assert "rank 0 (pid" in report.text and "most recent call first" in report.text


def test_same_total_but_one_all_reduce_fewer_names_that_rank(tmp_path: Path) -> None:
    beats = [_beat(tmp_path, r) for r in range(3)]
    try:
        for r, hb in enumerate(beats):
            for _ in range(4):
                hb.collective_start(0)
                hb.collective_end(0)
            hb.collective_start(
                process_contract.COLLECTIVES.index("barrier" if r == 2 else "all_reduce")
            )
        states = [
            stall_report.RankState(read_record(record_path(tmp_path, r)), 20.0, "")
            for r in range(3)
        ]
    finally:
        for hb in beats:
            hb.close()
    report = stall_report.build_report(states, "pod p", 10)
    assert report.lagging_rank == 2
    assert "barrier #5" in report.line and "it ran 4 all_reduce, the others 5" in report.line
    assert "2 ranks wait in all_reduce #5" in report.line


def test_no_local_rank_lags_when_all_wait_in_the_same_collective(tmp_path: Path) -> None:
    beats = [_beat(tmp_path, r) for r in range(2)]
    try:
        for hb in beats:
            hb.collective_start(0)
        states = [
            stall_report.RankState(read_record(record_path(tmp_path, r)), 20.0, "")
            for r in range(2)
        ]
    finally:
        for hb in beats:
            hb.close()
    report = stall_report.build_report(states, "pod p", 10)
    assert report.lagging_rank is None
    assert "runs in another pod" in report.line and "2 ranks wait in all_reduce #1" in report.line


@pytest.fixture
def watch(tmp_path: Path) -> StallWatch:
    cfg = load_config(None, [f"checkpoint.dir={tmp_path}"])
    w = StallWatch(cfg.diagnostics, cfg.checkpoint.dir, print)
    yield w
    w.finish(0)
    w.remove()


def _progress_series(watch: StallWatch, per_rank: bool) -> dict[str, tuple[str, set[str]]]:
    registry = CollectorRegistry()
    registry.register(ProgressCollector(watch, per_rank))
    served = {}
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        served[name] = (family.type, {k for s in family.samples for k in s.labels})
    return {name: found for name, found in served.items() if found[1] or name.endswith("_total")}


def test_the_progress_series_are_the_documented_ones(watch: StallWatch) -> None:
    hb, idle = _beat(Path(watch.directory), 0), Heartbeat(watch.directory, 1)  # 1: starting
    try:
        hb.straggler(2.5)
        hb.nonfinite(3, "loss")
        detailed = _progress_series(watch, per_rank=True)
        registry = CollectorRegistry()
        registry.register(ProgressCollector(watch, per_rank=True))
        value = registry.get_sample_value("kubeddp_rank_phase", {"rank": "0", "phase": "data"})
        idle_progress = registry.get_sample_value(
            "kubeddp_rank_last_progress_timestamp_seconds", {"rank": "1"}
        )
        hb.straggler(0.0)
        default = _progress_series(watch, per_rank=False)
    finally:
        hb.close()
        idle.close()
    assert detailed == documented_tables()[2]
    assert value == 1.0
    assert idle_progress is None  # a rank still starting is not watched: no series
    # by default: no per-rank detail, and no verdict series once the verdict is gone
    assert set(default) == {
        "kubeddp_rank_last_progress_timestamp_seconds", "kubeddp_nonfinite_step",
        "kubeddp_stalls_total",
    }  # fmt: skip


def test_the_watch_reports_a_stall_once_and_rearms(watch: StallWatch) -> None:
    directory = Path(watch.directory)
    hb = _beat(directory, 0)
    try:
        now = read_record(record_path(directory, 0)).last_progress
        assert watch.check(now + 1) is None
        watch.action = "wait"
        first = watch.check(now + watch.stall_seconds + 1)
        assert first is not None and first.lagging_rank == 0
        assert "most recent call first" in first.text  # this process answered the signal
        assert watch.check(now + watch.stall_seconds + 2) is None  # once per stall
        hb.step_done(4, PHASE_CODE["step"])
        assert watch.check(time_after(directory)) is None
    finally:
        hb.close()
    assert len(watch.reports) == 1


def time_after(directory: Path) -> float:
    return read_record(record_path(directory, 0)).last_progress + 1


FR_WORKER = """
import os, sys, time, torch, torch.distributed as dist
from kubeddp.trainer.worker import flight_recorder
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0?", rank=0, world_size=1)
for _ in range(3):
    dist.all_reduce(torch.ones(2))
flight_recorder.start_responder(sys.argv[1], 0)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_rank_dumps_its_flight_recorder_when_asked(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    env = {**os.environ, process_contract.ENV_FR_BUFFER: "100"}
    script = FR_WORKER.replace("tcp://127.0.0.1:0?", "env://")
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 30
        # the responder thread opens its FIFO a moment after "ready"
        while not process_contract.request_flight_recorder(tmp_path, 0):
            assert time.monotonic() < deadline, "the rank never listened"
            time.sleep(0.05)
        dump = process_contract.fr_dump_path(tmp_path, 0)
        while not dump.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        line = flight_recorder_summary(dump.read_text())
    finally:
        proc.kill()
        proc.wait(10)
    assert line == "flight recorder: default_pg (0): all_reduce #3 (finished)", line
    assert not process_contract.request_flight_recorder(tmp_path, 1)  # nobody listens there


def test_in_a_pod_the_watch_logs_the_ranks_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAME", "demo-worker-1")
    lines: list[str] = []
    cfg = load_config(None, [f"checkpoint.dir={tmp_path}"])
    watch = StallWatch(cfg.diagnostics, cfg.checkpoint.dir, lines.append)
    hb = _beat(Path(watch.directory), 4)
    try:
        now = read_record(record_path(watch.directory, 4)).last_progress
        watch.check(now + 2)
        watch.check(now + 3)  # once a minute, not at every look
    finally:
        hb.close()
        watch.finish(0)
        watch.remove()
    assert lines == ["[kubeddp] progress: rank 4 step 3 data 2 s"]


def test_reports_beside_the_checkpoints_never_make_the_directory_foreign(tmp_path: Path) -> None:
    from kubeddp.trainer.launcher.stall_watch import report_dir
    from kubeddp.trainer.worker.checkpoint.storage import is_own_name

    def of(*overrides: str) -> Path | None:
        cfg = load_config(None, list(overrides))
        return report_dir(cfg.diagnostics, cfg.checkpoint.dir)

    local = of(f"checkpoint.dir={tmp_path}")
    assert local is not None and local.parent == tmp_path and is_own_name(local.name)
    assert of("checkpoint.dir=s3://bucket/run") is None
    chosen = of(f"diagnostics.report_dir={tmp_path / 'r'}")
    assert chosen == tmp_path / "r"
