"""The per-pod /metrics endpoint during real 2-process `kubeddp train` runs (gloo, CPU).

Scrapes with urllib and parses with prometheus_client's text parser; promtool lints a live
/metrics; a worker is killed with SIGKILL to prove counters survive torchrun restarts; a real
Prometheus server scrapes a run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers import faults
from tests.helpers.ports import free_port
from tests.helpers.readme import DOCS, doc_section

REPO = Path(__file__).resolve().parents[2]
KUBEDDP = REPO / ".venv" / "bin" / "kubeddp"
LOG_STEP = re.compile(r"^step (\d+)/(\d+) \|", re.MULTILINE)
METRICS_URL = re.compile(r"\[kubeddp\] metrics: (http://\S+/metrics)")
COUNTERS = ("kubeddp_samples_total", "kubeddp_data_wait_seconds_total")
# Served by rank 0's pod from its first checkpoint on (no series before: no sentinel 0)
FROM_FIRST_SAVE = (
    "kubeddp_checkpoint_save_duration_seconds",
    "kubeddp_last_checkpoint_timestamp_seconds",
)
# the in-memory snapshot's gauges, from the first snapshot on (after step 2)
FROM_FIRST_SNAPSHOT = (
    "kubeddp_snapshot_last_timestamp_seconds",
    "kubeddp_snapshot_step",
    "kubeddp_snapshot_size_bytes",
    "kubeddp_snapshot_duration_seconds",
    "kubeddp_snapshot_interval_steps",
)
PROMTOOL = shutil.which("promtool")


def documented_metric_names() -> list[str]:
    """Metric names in the first table of docs/metrics.md (what /metrics must serve)."""
    names: list[str] = []
    in_table = False
    for line in doc_section(DOCS / "metrics.md", "Metrics").splitlines():
        row = re.match(r"^\| `(kubeddp_[a-z0-9_]+)` \|", line)
        if row:
            names.append(row.group(1))
            in_table = True
        elif in_table and not line.startswith("|"):
            break
    assert len(names) >= 14, "docs/metrics.md metrics table not found"
    return names


Scrape = dict[str, list[tuple[str, dict[str, str], float]]]  # family -> samples


def scrape_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def scrape(url: str) -> Scrape:
    text = scrape_text(url)
    out: Scrape = {}
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        out[name] = [(s.name, dict(s.labels), s.value) for s in family.samples]
    return out


def value(snapshot: Scrape, sample: str, **labels: str) -> float:
    for family in snapshot.values():
        for name, sample_labels, val in family:
            if name == sample and sample_labels == labels:
                return val
    raise KeyError(f"{sample}{labels} not in the scrape; it has {sorted(snapshot)}")


def step_of(snapshot: Scrape) -> float:
    # A "mostrecent" gauge no process has set yet is served as a family without samples.
    steps = [val for name, _, val in snapshot.get("kubeddp_step", []) if name == "kubeddp_step"]
    return steps[0] if steps else 0.0


def counter_values(snapshot: Scrape) -> dict[tuple, float]:
    """Every sample that must never decrease: counters and histogram buckets/sums/counts."""
    out = {}
    for family, samples in snapshot.items():
        if family.endswith("_total") or family.endswith("_seconds"):
            for name, labels, val in samples:
                if family.endswith("_total") or name.endswith(("_bucket", "_sum", "_count")):
                    out[(name, tuple(sorted(labels.items())))] = val
    return out


LOG_EVERY = 10


@dataclass
class Run:
    proc: subprocess.Popen
    log: Path
    url: str = ""

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.proc.poll() is not None and text not in self.output():
                raise AssertionError(
                    f"run exited ({self.proc.returncode}) before {text!r}:\n"
                    + self.output()[-3000:]
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} within {timeout}s:\n" + self.output()[-3000:])
            time.sleep(0.1)

    def logged_steps(self) -> list[int]:
        return [int(m.group(1)) for m in LOG_STEP.finditer(self.output())]

    def worker_pids(self) -> list[int]:
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        return [int(pid) for pid in children.split()]


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@contextmanager
def training_run(
    tmp_path: Path,
    epochs: int,
    *,
    max_restarts: int = 0,
    linger: float = 0,
    extra: Sequence[str] = (),
) -> Iterator[Run]:
    log = tmp_path / "train.log"
    cmd = [
        str(KUBEDDP), "train", "--nproc", "2", "--max-restarts", str(max_restarts),
        "--set", "workload.name=regression",
        "--set", f"train.epochs={epochs}",
        "--set", f"train.log_every={LOG_EVERY}",
        "--set", "metrics.port=0",
        "--set", f"checkpoint.dir={tmp_path / 'ckpt'}",
        *extra,
    ]  # fmt: skip
    env = {**os.environ, "KUBEDDP_METRICS_LINGER_SECONDS": str(linger), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": str(REPO)}  # a fault workload's module (tests.helpers.faults)  # fmt: skip
    for name in ("KUBEDDP_METRICS_PORT", "KUBEDDP_METRICS_BIND", "PROMETHEUS_MULTIPROC_DIR"):
        env.pop(name, None)
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
            start_new_session=True,
        )  # fmt: skip
    run = Run(proc, log)
    try:
        run.wait_for("[kubeddp] metrics: http://", timeout=60)
        run.url = METRICS_URL.search(run.output()).group(1)
        yield run
    finally:
        kill_group(proc)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_scrapes_during_a_two_process_run(tmp_path: Path) -> None:
    expected = documented_metric_names()
    with training_run(tmp_path, epochs=12, linger=20) as run:
        assert run.url.startswith("http://127.0.0.1:")
        scrapes: list[Scrape] = []
        training_text = ""  # a whole /metrics while the ranks train: every family is there
        while "[kubeddp] metrics: serving" not in run.output():
            assert run.proc.poll() is None, run.output()[-3000:]
            text = scrape_text(run.url)
            if "kubeddp_rank_last_progress_timestamp_seconds{" in text:
                training_text = text
            scrapes.append(scrape(run.url))
            time.sleep(0.2)
        final = scrape(run.url)  # workers have exited; the values are their last ones
        logged = run.logged_steps()
        assert run.proc.wait(timeout=60) == 0, run.output()[-3000:]

    total_steps = int(LOG_STEP.search(run.output()).group(2))
    assert logged[-1] == total_steps
    assert value(final, "kubeddp_step") == total_steps
    assert value(final, "kubeddp_epoch") == 11
    assert value(final, "kubeddp_world_size") == 2
    samples = value(final, "kubeddp_samples_total")
    # 2 ranks x batch 32 per step; each epoch's last step may be short.
    assert 64 * (total_steps - 12) < samples <= 64 * total_steps
    assert value(final, "kubeddp_worker_restarts_total") == 0
    # one histogram for the pod (metrics.per_rank is off): both ranks' steps
    assert value(final, "kubeddp_step_duration_seconds_count") == 2 * total_steps
    assert value(final, "kubeddp_last_checkpoint_timestamp_seconds") > 0
    assert value(final, "kubeddp_gpu_memory_allocated_bytes", rank="0") == 0  # CPU
    info = final["kubeddp_info"][0][1]
    assert info["backend"] == "gloo" and info["rdzv_source"] == "standalone"

    mid_run = [s for s in scrapes if step_of(s) > 0]
    assert len(mid_run) >= 3, "too few scrapes saw training"
    seen_samples = [value(s, "kubeddp_samples_total") for s in mid_run]
    assert seen_samples == sorted(seen_samples) and seen_samples[-1] > seen_samples[0]
    steps = [value(s, "kubeddp_step") for s in mid_run]
    assert steps == sorted(steps) and steps[-1] <= total_steps
    for snapshot in [*mid_run, final]:
        missing = [name for name in expected if not snapshot.get(name)]
        if step_of(snapshot) < LOG_EVERY:  # the loss is read (a host sync) at log steps only
            missing = [name for name in missing if name != "kubeddp_loss"]
        if "kubeddp_last_checkpoint_timestamp_seconds" not in snapshot:  # before the first save
            missing = [name for name in missing if name not in FROM_FIRST_SAVE]
        if "kubeddp_snapshot_step" not in snapshot and snapshot is not final:
            missing = [name for name in missing if name not in FROM_FIRST_SNAPSHOT]
        assert not missing, f"metrics in the docs/metrics.md table but not served: {missing}"
        for samples_of_family in snapshot.values():
            for name, labels, _ in samples_of_family:
                assert "pid" not in labels, f"{name} has a pid label: {labels}"
    # Prometheus' own lint of a live /metrics (Debian's prometheus package): names, units, types
    assert training_text, "no scrape saw the ranks train"
    if PROMTOOL:
        done = subprocess.run([PROMTOOL, "check", "metrics"], input=training_text,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_counters_survive_a_killed_worker(tmp_path: Path) -> None:
    """...and the TensorBoard curves of the killed and resumed run show each step once."""
    with training_run(tmp_path, epochs=25, max_restarts=1, linger=20) as run:
        scrapes: list[Scrape] = []
        while not scrapes or step_of(scrapes[-1]) < 150:
            assert run.proc.poll() is None, run.output()[-3000:]
            scrapes.append(scrape(run.url))
            time.sleep(0.2)
        assert value(scrapes[-1], "kubeddp_worker_restarts_total") == 0
        victims = run.worker_pids()
        assert len(victims) == 2, f"expected 2 workers under launch, got {victims}"
        os.kill(victims[1], signal.SIGKILL)
        while "[kubeddp] metrics: serving" not in run.output():
            assert run.proc.poll() is None, run.output()[-3000:]
            scrapes.append(scrape(run.url))
            time.sleep(0.2)
        scrapes.append(scrape(run.url))
        assert run.proc.wait(timeout=60) == 0, run.output()[-3000:]

    assert "resumed from" in run.output()
    assert value(scrapes[-1], "kubeddp_worker_restarts_total") == 1
    restarts = [value(s, "kubeddp_worker_restarts_total") for s in scrapes if s]
    assert restarts == sorted(restarts)
    previous = counter_values(scrapes[0])
    for snapshot in scrapes[1:]:
        current = counter_values(snapshot)
        for key, before in previous.items():
            assert current[key] >= before, f"{key} went from {before} to {current[key]}"
        previous = current
    # The work done before the kill is still counted after it.
    total_steps = int(LOG_STEP.search(run.output()).group(2))
    assert value(scrapes[-1], "kubeddp_step") == total_steps
    assert value(scrapes[-1], "kubeddp_step_duration_seconds_count") >= 2 * total_steps
    # The TensorBoard curves beside the checkpoints: one event file per worker generation, and
    # TensorBoard's own readers show each log step once, up to the last.
    curves = tmp_path / "ckpt" / "tensorboard"
    assert len(list(curves.glob("events.out.tfevents.*"))) >= 2, sorted(curves.iterdir())
    expected = list(range(LOG_EVERY, total_steps + 1, LOG_EVERY))
    if total_steps % LOG_EVERY:
        expected.append(total_steps)  # the last step is a log step too
    board = EventAccumulator(str(curves))
    board.Reload()
    assert [p.step for p in board.Scalars("train/loss")] == expected
    assert [p.step for p in tensorboard_scalars(tmp_path / "ckpt", "train/loss")] == expected


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_killed_right_after_a_snapshot_keeps_the_counts_of_what_it_holds(
    tmp_path: Path,
) -> None:
    """A snapshot at every step, and rank 1 SIGKILLed in a forward mid-run: the restarted group
    resumes from the step before in memory, so the steps up to it never run again: their
    durations must already be counted. A worker writes its metrics every 0.1 s, and the steps
    since its last write were lost until a snapshot flushed them first (CI counted 2898 step
    durations where at least 2900 were due)."""
    extra = [*faults.settings("die", 1, 100, samples=2048),
             "--set", "checkpoint.memory_every_steps=1"]  # fmt: skip
    with training_run(tmp_path, epochs=6, max_restarts=1, linger=20, extra=extra) as run:
        run.wait_for("[kubeddp] metrics: serving", timeout=180)
        final = scrape(run.url)
        assert run.proc.wait(timeout=60) == 0, run.output()[-3000:]
    output = run.output()
    resumed = re.search(r"resumed from memory://\S+ \(step (\d+)", output)
    assert resumed and int(resumed.group(1)) > 50, output[-3000:]
    total_steps = int(LOG_STEP.findall(output)[-1][1])
    assert value(final, "kubeddp_worker_restarts_total") == 1
    assert value(final, "kubeddp_step") == total_steps
    assert value(final, "kubeddp_step_duration_seconds_count") >= 2 * total_steps


def tensorboard_scalars(logdir: Path, tag: str) -> list[Any]:
    """`tensorboard --logdir` (its Rust data server, TensorBoard's default reader) over
    `logdir`, asked for the run's points of `tag` through its HTTP API."""
    port = free_port()
    log = (logdir.parent / "tensorboard.log").open("wb")
    server = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "tensorboard"), "--logdir", str(logdir), "--host",
         "127.0.0.1", "--port", str(port), "--load_fast=true"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?run=tensorboard&tag={tag}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert server.poll() is None, (logdir.parent / "tensorboard.log").read_text()
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    points = json.load(resp)
            except (OSError, ValueError):
                points = []  # not up yet, or the run not loaded yet
            if points:
                return [TensorBoardPoint(int(step), value) for _, step, value in points]
            time.sleep(1)
        raise AssertionError("tensorboard showed no points: " + url)
    finally:
        kill_group(server)
        log.close()


@dataclass
class TensorBoardPoint:
    step: int
    value: float


PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def prometheus_query(base: str, query: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="needs Debian's prometheus package")
def test_prometheus_server_scrapes_a_run(tmp_path: Path) -> None:
    with training_run(tmp_path, epochs=60, linger=5) as run:
        target = run.url.removeprefix("http://").removesuffix("/metrics")
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: kubeddp\n    static_configs: [{{targets: ['{target}']}}]\n"
        )
        web = f"127.0.0.1:{free_port()}"
        server_log = (tmp_path / "prometheus.log").open("wb")
        server = subprocess.Popen(
            [
                PROMETHEUS, f"--config.file={config}", f"--web.listen-address={web}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            ],
            stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            rate: list[dict] = []
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                assert server.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
                try:
                    rate = prometheus_query(
                        f"http://{web}", 'rate(kubeddp_samples_total{job="kubeddp"}[15s])'
                    )
                except OSError:
                    rate = []  # not listening yet
                if rate and float(rate[0]["value"][1]) > 0:
                    break
                assert run.proc.poll() is None, "training ended before Prometheus saw it"
                time.sleep(1)
            assert rate and float(rate[0]["value"][1]) > 0, rate
            up = prometheus_query(f"http://{web}", 'up{job="kubeddp"}')
            assert float(up[0]["value"][1]) == 1
            quantile = prometheus_query(
                f"http://{web}",
                "histogram_quantile(0.5, sum by (instance, le) "
                "(rate(kubeddp_step_duration_seconds_bucket[15s])))",
            )
            assert [r["metric"]["instance"] for r in quantile] == [target]
        finally:
            kill_group(server)
            server_log.close()
