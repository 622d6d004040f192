"""TrainingMetrics in real worker-like processes writing their metrics files.

Each "worker" is a fresh Python process with PROMETHEUS_MULTIPROC_DIR set, as in a torchrun
worker; the test reads the directory the way the launch process serves it
(launcher/worker_metrics.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from kubeddp.trainer.launcher.worker_metrics import WorkerMetricsCollector
from tests.helpers.metrics import on_step_call

WORKER = textwrap.dedent(
    f"""
    import sys
    from kubeddp.trainer.config import MetricsConfig
    from kubeddp.trainer.worker.metrics import TrainingMetrics

    rank, steps, enabled = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    m = TrainingMetrics(MetricsConfig(enabled=enabled), rank, 2, "gloo")
    for step in range(1, steps + 1):
        {
        on_step_call(
            step="step",
            epoch="step // 10",
            loss="1.0 / step",
            samples=32,
            tokens="32 * 8",
            step_seconds=0.02,
            data_wait_seconds=0.001,
        )
    }
    m.on_checkpoint(duration_seconds=0.3, timestamp=1000.0 + steps)
    m.close()
    """
)


def run_worker(
    directory: Path, rank: int, steps: int, restart_count: int = 0, enabled: bool = True
) -> None:
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(directory),
        "LOCAL_RANK": str(rank),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "KUBEDDP_RDZV_SOURCE": "pytorchjob",
    }
    args = [str(rank), str(steps), "1" if enabled else "0"]
    subprocess.run([sys.executable, "-c", WORKER, *args], env=env, check=True, timeout=60)


def served(directory: Path, per_rank: bool = True) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in WorkerMetricsCollector(str(directory), per_rank).collect()
        for s in family.samples
    }


def test_two_ranks_sum_into_one_pod_view(tmp_path: Path) -> None:
    run_worker(tmp_path, rank=0, steps=25)
    run_worker(tmp_path, rank=1, steps=25)
    out = served(tmp_path)
    assert out[("kubeddp_samples_total", ())] == 2 * 25 * 32
    assert out[("kubeddp_tokens_total", ())] == 2 * 25 * 32 * 8
    assert out[("kubeddp_data_wait_seconds_total", ())] == pytest.approx(2 * 25 * 0.001)
    assert out[("kubeddp_step", ())] == 25
    assert out[("kubeddp_epoch", ())] == 2
    assert out[("kubeddp_loss", ())] == pytest.approx(1 / 25)
    assert out[("kubeddp_world_size", ())] == 2
    for rank in ("0", "1"):
        assert out[("kubeddp_step_duration_seconds_count", (("rank", rank),))] == 25
        assert out[("kubeddp_gpu_memory_allocated_bytes", (("rank", rank),))] == 0
    assert out[("kubeddp_checkpoint_save_duration_seconds_count", ())] == 2
    assert out[("kubeddp_last_checkpoint_timestamp_seconds", ())] == 1025
    info = [dict(labels) for (name, labels) in out if name == "kubeddp_info"]
    # A CPU run: the GPU stack's and NCCL transport's labels are there, empty.
    assert info == [
        {
            "backend": "gloo",
            "rdzv_source": "pytorchjob",
            "version": "0.1.0",
            "torch_version": metadata.version("torch"),
            "cuda_version": "",
            "nccl_version": "",
            "driver_version": "",
            "transport": "",
            "transport_interfaces": "",
            "intra_node_transport": "",
        }
    ]
    assert not [key for key in out if "pid" in dict(key[1])], "a sample carries a pid label"


def test_restarted_workers_add_to_counters_and_restarts(tmp_path: Path) -> None:
    run_worker(tmp_path, rank=0, steps=30)  # generation 0 dies after 30 steps
    run_worker(tmp_path, rank=1, steps=30)
    assert served(tmp_path)[("kubeddp_worker_restarts_total", ())] == 0
    run_worker(tmp_path, rank=0, steps=12, restart_count=1)  # resumed at an earlier step
    run_worker(tmp_path, rank=1, steps=12, restart_count=1)
    out = served(tmp_path)
    assert out[("kubeddp_samples_total", ())] == (30 + 12) * 2 * 32
    assert out[("kubeddp_worker_restarts_total", ())] == 1
    assert out[("kubeddp_step", ())] == 12  # the newest write wins, not the largest
    assert out[("kubeddp_step_duration_seconds_count", (("rank", "0"),))] == 42
    assert out[("kubeddp_last_checkpoint_timestamp_seconds", ())] == 1030  # the latest save


def test_a_generation_that_died_early_is_still_counted(tmp_path: Path) -> None:
    # Generation 1 died before recording anything; generation 2 tops the total up to 2.
    run_worker(tmp_path, rank=0, steps=5)
    run_worker(tmp_path, rank=0, steps=5, restart_count=2)
    run_worker(tmp_path, rank=1, steps=5, restart_count=2)  # not local rank 0: no change
    assert served(tmp_path)[("kubeddp_worker_restarts_total", ())] == 2


def test_disabled_metrics_write_nothing(tmp_path: Path) -> None:
    run_worker(tmp_path, rank=0, steps=5, enabled=False)
    assert not list(tmp_path.iterdir())


def test_no_directory_means_no_op() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, "0", "3", "1"], env=env, timeout=60, capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode()


def test_step_histogram_buckets_are_exact(tmp_path: Path) -> None:
    # Bucketed in memory and written on flush: the result must equal plain observe() calls.
    code = textwrap.dedent(
        f"""
        from kubeddp.trainer.config import MetricsConfig
        from kubeddp.trainer.worker.metrics import TrainingMetrics
        m = TrainingMetrics(MetricsConfig(), 3, 4, "gloo")
        for i, seconds in enumerate([0.004, 0.005, 0.0051, 0.02, 0.3, 0.3, 100.0]):
            {on_step_call(step="i", loss=0.0, lr=0.0, samples=1, step_seconds="seconds")}
        m.close()
        """
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    out = served(tmp_path)

    def bucket(le: str) -> float:
        return out[("kubeddp_step_duration_seconds_bucket", (("le", le), ("rank", "3")))]

    assert bucket("0.005") == 2  # le is inclusive
    assert bucket("0.01") == 3
    assert bucket("0.025") == 4
    assert bucket("0.25") == 4
    assert bucket("0.5") == 6
    assert bucket("60.0") == 6
    assert bucket("+Inf") == 7
    assert out[("kubeddp_step_duration_seconds_count", (("rank", "3"),))] == 7
    assert out[("kubeddp_step_duration_seconds_sum", (("rank", "3"),))] == pytest.approx(100.6341)


USER_PROGRAM = textwrap.dedent(
    """
    from kubeddp import api
    api.report_step(1, samples=8, loss=0.5, tokens=64)
    api.report_step(2, samples=8, loss=0.25, tokens=64)
    """
)


def test_report_step_records_what_the_trainer_records(tmp_path: Path) -> None:
    """kubeddp.api.report_step writes through the same TrainingMetrics.on_step as the loop: a
    metric that on_step now requires and report_step does not pass would be one swallowed
    warning and no user-script metrics at all (report_step never ends a program)."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "RANK": "1"}
    done = subprocess.run(
        [sys.executable, "-c", USER_PROGRAM], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr, done.stderr
    out = served(tmp_path)
    assert out[("kubeddp_step", ())] == 2
    assert out[("kubeddp_samples_total", ())] == 16
    assert out[("kubeddp_tokens_total", ())] == 128
    assert out[("kubeddp_loss", ())] == 0.25
    assert out[("kubeddp_step_duration_seconds_count", (("rank", "1"),))] == 1


REWRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from kubeddp.trainer.process_contract import WorkerMetricsFile
    out = WorkerMetricsFile(Path(sys.argv[1]))
    for i in range(500):  # records that grow and shrink, 100 times a worker's pace
        n = (i * 7919) % 3000
        out.write({"n": n, "fill": "x" * n})
        time.sleep(0.001)
    """
)


def test_a_record_read_while_it_is_rewritten_is_whole_or_left_out(tmp_path: Path) -> None:
    """The worker rewrites its file in place (no rename): a scrape that overlaps a write must
    read the old record, the new one, or nothing, never a mix."""
    from kubeddp.trainer.process_contract import WORKER_METRICS_SUFFIX, read_worker_metrics

    path = tmp_path / f"worker-0-1-ab{WORKER_METRICS_SUFFIX}"
    writer = subprocess.Popen([sys.executable, "-c", REWRITER, str(path)])
    try:
        seen = whole = 0
        while writer.poll() is None:
            if not path.exists() or not path.stat().st_size:
                continue  # not written yet
            for record in read_worker_metrics(tmp_path):
                assert record["fill"] == "x" * record["n"], "a record mixed from two writes"
                whole += 1
            seen += 1
    finally:
        writer.kill()
        writer.wait(timeout=30)
    assert seen > 100 and whole >= 0.9 * seen, f"{whole} of {seen} reads found a whole record"
