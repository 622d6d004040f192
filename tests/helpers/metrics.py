"""What a worker exports (record one step in a child process, merge its files as launch
does), and what docs/metrics.md says it exports."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from prometheus_client.metrics_core import Metric

from kubeddp.trainer.launcher.worker_metrics import WorkerMetricsCollector
from tests.helpers.readme import DOCS, doc_section

# Every keyword TrainingMetrics.on_step takes, as source text: a test names only what it
# varies (on_step_call), so a new metric's keyword is added here once, not in every test.
ON_STEP_DEFAULTS = dict(
    step="1",
    epoch="0",
    loss="1.0",
    lr="0.1",
    samples="2",
    tokens="0",
    step_seconds="0.1",
    data_wait_seconds="0.0",
)


def on_step_values(**given: object) -> dict[str, object]:
    """The keywords of one in-process on_step call: `given` over ON_STEP_DEFAULTS."""
    return {**{name: ast.literal_eval(v) for name, v in ON_STEP_DEFAULTS.items()}, **given}


def on_step_call(target: str = "m", **given: object) -> str:
    """The source of one `target.on_step(...)` call: `given` (source text or a number) over
    ON_STEP_DEFAULTS, for the worker-like child processes the metrics tests run."""
    values = {**ON_STEP_DEFAULTS, **{name: str(value) for name, value in given.items()}}
    return f"{target}.on_step(" + ", ".join(f"{k}={v}" for k, v in values.items()) + ")"


RECORD_ONE_STEP = textwrap.dedent(
    f"""
    from kubeddp.trainer.config import MetricsConfig
    from kubeddp.trainer.worker.metrics import TrainingMetrics
    m = TrainingMetrics(MetricsConfig(), 0, 1, "gloo")
    m.on_plan(10)
    {on_step_call()}
    m.on_checkpoint(duration_seconds=1.0, timestamp=1.0)
    m.close()
    """
)


def exported_families(directory: Path, per_rank: bool = False) -> list[Metric]:
    """Metric families a worker writes after one step and one checkpoint, as launch serves
    them."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    subprocess.run([sys.executable, "-c", RECORD_ONE_STEP], env=env, check=True, timeout=60)
    return list(WorkerMetricsCollector(str(directory), per_rank).collect())


METRICS_PAGE = DOCS / "metrics.md"
ROW = re.compile(r"^\| `(kubeddp_[a-z0-9_]+)` \| (\w+) \| ([^|]*) \|")


def documented_tables() -> list[dict[str, tuple[str, set[str]]]]:
    """Each metrics table: name -> (type, label names)."""
    tables: list[dict[str, tuple[str, set[str]]]] = []
    current: dict[str, tuple[str, set[str]]] = {}
    for line in doc_section(METRICS_PAGE, "Metrics").splitlines():
        row = ROW.match(line)
        if row:
            labels = set(re.findall(r"`(\w+)`", row.group(3)))
            current[row.group(1)] = (row.group(2), labels)
        elif current and not line.startswith("|"):
            tables.append(current)
            current = {}
    if current:
        tables.append(current)
    return tables


def metric_rows(section: str) -> dict[str, tuple[str, set[str]]]:
    """Every table row under the heading `section`: name -> (type, label names)."""
    rows = {}
    for line in doc_section(METRICS_PAGE, section).splitlines():
        row = ROW.match(line)
        if row:
            rows[row.group(1)] = (row.group(2), set(re.findall(r"`(\w+)`", row.group(3))))
    return rows


def exported(tmp_path: Path) -> dict[str, tuple[str, set[str]]]:
    """Name -> (type, label names) of what a worker exports, every label metrics.per_rank
    adds included."""
    out = {}
    for family in exported_families(tmp_path, per_rank=True):
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        out[name] = (family.type, labels)
    return out


def exposition(directory: Path, record: str) -> str:
    """The /metrics text a pod's launch serves once a worker has run `record` (Python that
    makes `TrainingMetrics` and reports with it) into its multiprocess files."""
    from prometheus_client import CollectorRegistry, generate_latest

    directory.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    subprocess.run([sys.executable, "-c", textwrap.dedent(record)], env=env, check=True,
                   timeout=60)  # fmt: skip
    registry = CollectorRegistry()
    registry.register(WorkerMetricsCollector(str(directory)))  # as launch's metrics_server.py
    return generate_latest(registry).decode()
