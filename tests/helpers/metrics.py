"""What a worker exports: record one step in a child process, merge its multiprocess files."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

RECORD_ONE_STEP = textwrap.dedent(
    """
    from kubeddp.trainer.config import MetricsConfig
    from kubeddp.trainer.worker.metrics import TrainingMetrics
    m = TrainingMetrics(MetricsConfig(), 0, 1, "gloo")
    m.on_step(step=1, epoch=0, loss=1.0, lr=0.1, samples=2, tokens=0, step_seconds=0.1,
              data_wait_seconds=0.0)
    m.on_checkpoint(duration_seconds=1.0, timestamp=1.0)
    m.close()
    """
)


def exported_families(directory: Path) -> list[Metric]:
    """Metric families a worker writes after one step and one checkpoint."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    subprocess.run([sys.executable, "-c", RECORD_ONE_STEP], env=env, check=True, timeout=60)
    return list(MultiProcessCollector.merge(glob.glob(os.path.join(directory, "*.db"))))


def exposition(directory: Path, record: str) -> str:
    """The /metrics text a pod's launch serves once a worker has run `record` (Python that
    makes `TrainingMetrics` and reports with it) into its multiprocess files."""
    from prometheus_client import CollectorRegistry, generate_latest

    from kubeddp.trainer.worker.metrics import tolerant_collector

    directory.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    subprocess.run([sys.executable, "-c", textwrap.dedent(record)], env=env, check=True,
                   timeout=60)  # fmt: skip
    registry = CollectorRegistry()
    tolerant_collector(registry, str(directory))  # as trainer/launcher/metrics_server.py
    return generate_latest(registry).decode()
