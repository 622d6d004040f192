"""Run as a script by tests/integration/test_install.py inside a clean venv (kubeddp from the
wheel, whatever prometheus-client pip resolved there, no torch): a worker's metrics recorded,
served the way launch serves them (prometheus_client's custom-collector API and its text
exposition) and read the way `kubeddp status` reads them (its text parser): the exact histogram
counts and sums, and the progress line. Prints `ok VERSION`."""

from __future__ import annotations

import inspect
import os
import sys
import tempfile
from importlib import metadata

STEPS = (0.004, 0.2, 0.2, 3.0)  # seconds: the first bucket, twice the 0.25 one, the 5.0 one


def step_keywords(recorder: object, **given: object) -> dict[str, object]:
    """Every keyword on_step takes (zero unless given): this script runs from a clean venv
    without the tests package, so it reads the keywords from the signature."""
    params = inspect.signature(recorder.on_step).parameters  # type: ignore[attr-defined]
    return {name: given.get(name, 0) for name in params}


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
        from prometheus_client import CollectorRegistry, generate_latest

        from kubeddp.tools.cluster import pod_metrics
        from kubeddp.trainer.config import MetricsConfig
        from kubeddp.trainer.launcher.worker_metrics import WorkerMetricsCollector
        from kubeddp.trainer.worker.metrics import TrainingMetrics

        recorder = TrainingMetrics(MetricsConfig(), 0, 1, "gloo")
        recorder.on_plan(40)
        for step, seconds in enumerate(STEPS, start=1):
            recorder.on_step(**step_keywords(recorder, step=step, loss=0.5, step_seconds=seconds))
        recorder.close()
        registry = CollectorRegistry()
        registry.register(WorkerMetricsCollector(folder))
        text = generate_latest(registry).decode()
    read = pod_metrics.parse("probe", text)
    buckets = {
        labels["le"]: value
        for name, labels, value in read.samples
        if name == "kubeddp_step_duration_seconds_bucket"
    }
    found = {
        "count": read.value("kubeddp_step_duration_seconds_count"),
        "sum": round(read.value("kubeddp_step_duration_seconds_sum") or 0, 6),
        "le 0.005": buckets.get("0.005"),
        "le 0.25": buckets.get("0.25"),
        "le 5.0": buckets.get("5.0"),
        "progress": pod_metrics.progress_text(pod_metrics.progress(read) or {}),
    }
    expected = {
        "count": 4.0, "sum": 3.404, "le 0.005": 1.0, "le 0.25": 3.0, "le 5.0": 4.0,
        "progress": "step 4/40 (10%), eta 0:00:31, loss 0.5000",
    }  # fmt: skip
    if found != expected:
        print(f"metrics differ: {found} != {expected}", file=sys.stderr)
        return 1
    print(f"ok {metadata.version('prometheus-client')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
