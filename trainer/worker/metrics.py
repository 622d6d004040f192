"""Training metrics each worker records for its pod's /metrics endpoint.

Each worker keeps its values in memory and writes them, at most every FLUSH_EVERY_SECONDS, as
one small file of its own in the directory `kubeddp launch` made and exported as
PROMETHEUS_MULTIPROC_DIR (the file and its format: process_contract.WorkerMetricsFile). Launch,
which outlives worker restarts, serves the merge of every file there (launcher/worker_metrics.py,
with prometheus_client's public custom-collector API): the files of dead workers stay, so
counters and histograms keep their totals across restarts, and gauges come from the newest
file, so series never multiply with restarts. Without that directory (metrics.enabled=false, or
a torchrun that kubeddp launch did not start) every call here is a no-op.

FAMILIES is the one list of what a worker records: launch serves each family the way its
`merge` says.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubeddp.trainer import __version__, constants, process_contract
from kubeddp.trainer.config import MetricsConfig
from kubeddp.trainer.worker.versions import RuntimeVersions, gpu_uuid, runtime_versions

# Seconds; from a toy CPU step to a large-model step.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CHECKPOINT_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Values are kept in memory and written at most this often (a write rewrites one small file in
# place, about 16 us; a scrape every second or more never sees the difference).
FLUSH_EVERY_SECONDS = 0.1
GPU_MEMORY_EVERY_SECONDS = 1.0  # torch.cuda.memory_allocated builds a stats dict: not per step

# kubeddp_info's labels: what runs, the GPU stack under it (empty strings on CPU), and the
# transport NCCL chose (empty where NCCL's log was not read: gloo, or NCCL_DEBUG set by you).
INFO_LABELS = (
    "version",
    "backend",
    "rdzv_source",
    "torch_version",
    "cuda_version",
    "nccl_version",
    "driver_version",
    "transport",
    "transport_interfaces",
    "intra_node_transport",
)
TRANSPORT_LABELS = INFO_LABELS[-3:]
# kubeddp_rank_info's labels besides `rank`: `UUID` is spelled as NVIDIA's dcgm-exporter
# spells it, so its GPU series join a rank with `on (UUID)` (docs/metrics.md).
RANK_INFO_LABELS = ("local_rank", "node", "UUID")


@dataclass(frozen=True)
class Family:
    """One metric family. `merge` says how launch serves the workers' files: `newest` (the
    newest file's value), `max`, `sum` (counters and histograms: every file, live or dead),
    `rank` (one series per rank, from its newest file), `labels` (an info series)."""

    name: str  # a counter's without `_total`
    kind: str  # gauge | counter | histogram
    doc: str
    merge: str
    buckets: tuple[float, ...] = ()


INFO = Family("kubeddp_info", "gauge", "Constant 1; labels say what runs", "labels")
RANK_INFO = Family(
    "kubeddp_rank_info",
    "gauge",
    "Constant 1 per rank; labels say where it runs: local rank, node and GPU UUID",
    "labels",
)
STEP = Family("kubeddp_step", "gauge", "Current global optimizer step", "newest")
EPOCH = Family("kubeddp_epoch", "gauge", "Current epoch (0-based)", "newest")
PLANNED_STEPS = Family(
    "kubeddp_planned_steps", "gauge", "The optimizer step this run is planned to end at", "newest"
)
LOSS = Family(
    "kubeddp_loss",
    "gauge",
    "Training loss: mean over all ranks and the steps of the latest log interval",
    "newest",
)
LEARNING_RATE = Family(
    "kubeddp_learning_rate", "gauge", "Learning rate of the latest step", "newest"
)
WORLD_SIZE = Family(
    "kubeddp_world_size", "gauge", "Number of training processes in the job", "newest"
)
SAMPLES = Family("kubeddp_samples", "counter", "Training samples processed by this pod", "sum")
TOKENS = Family("kubeddp_tokens", "counter", "Training tokens processed by this pod", "sum")
DATA_WAIT = Family(
    "kubeddp_data_wait_seconds", "counter", "Time this pod's ranks waited for the next batch", "sum"
)
RESTARTS = Family(
    "kubeddp_worker_restarts", "counter", "torchrun worker-group restarts on this pod", "max"
)
STEP_SECONDS = Family(
    "kubeddp_step_duration_seconds",
    "histogram",
    "Wall time of one optimizer step of this pod's ranks (per rank with metrics.per_rank)",
    "sum",
    STEP_BUCKETS,
)
CHECKPOINT_SECONDS = Family(
    "kubeddp_checkpoint_save_duration_seconds",
    "histogram",
    "Time the training loop spent saving a checkpoint",
    "sum",
    CHECKPOINT_BUCKETS,
)
LAST_CHECKPOINT = Family(
    "kubeddp_last_checkpoint_timestamp_seconds",
    "gauge",
    "Unix time of the latest checkpoint save",
    "max",
)
GPU_MEMORY = Family(
    "kubeddp_gpu_memory_allocated_bytes",
    "gauge",
    "CUDA memory allocated by PyTorch tensors, per rank (0 on CPU)",
    "rank",
)
FAMILIES = (
    INFO,
    RANK_INFO,
    STEP,
    EPOCH,
    PLANNED_STEPS,
    LOSS,
    LEARNING_RATE,
    WORLD_SIZE,
    SAMPLES,
    TOKENS,
    DATA_WAIT,
    RESTARTS,
    STEP_SECONDS,
    CHECKPOINT_SECONDS,
    LAST_CHECKPOINT,
    GPU_MEMORY,
)
_SAMPLES, _TOKENS, _DATA_WAIT, _STEP = SAMPLES.name, TOKENS.name, DATA_WAIT.name, STEP.name
_LOSS, _EPOCH, _LEARNING_RATE = LOSS.name, EPOCH.name, LEARNING_RATE.name


def multiprocess_dir() -> str | None:
    path = os.environ.get(process_contract.ENV_PROMETHEUS_MULTIPROC_DIR)
    return path if path and os.path.isdir(path) else None


class BucketCounts:
    """Observations of one histogram in this process: a count per bucket (not cumulative; the
    last is +Inf) and their sum. An observation costs a bisect."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1  # first bucket with amount <= le
        self.total += amount

    def record(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "sum": self.total}


class TrainingMetrics:
    """What the training loop reports; cheap enough to call on every step."""

    def __init__(
        self,
        cfg: MetricsConfig,
        rank: int,
        world_size: int,
        backend: str,
        *,
        device: Any = None,
        versions: RuntimeVersions | None = None,
        transport: Mapping[str, str] | None = None,
    ) -> None:
        directory = multiprocess_dir() if cfg.enabled else None
        self.enabled = directory is not None
        if directory is None:
            return
        self._file = process_contract.WorkerMetricsFile(
            process_contract.worker_metrics_path(directory, rank)
        )
        if versions is None:
            versions = runtime_versions(getattr(device, "type", "cpu"))
        info = {
            "version": __version__,
            "backend": backend,
            "rdzv_source": os.environ.get(process_contract.ENV_RDZV_SOURCE, "standalone"),
            **versions.labels(),
            **{name: (transport or {}).get(name, "") for name in TRANSPORT_LABELS},
        }
        where = {
            "local_rank": os.environ.get("LOCAL_RANK", "0"),
            "node": os.environ.get(constants.ENV_NODE_NAME) or socket.gethostname(),
            "UUID": gpu_uuid(device),
        }
        # The restart count of this worker generation: launch serves the largest, so a
        # generation that dies before its first step is still counted by the next one.
        restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        self._values: dict[str, float] = {WORLD_SIZE.name: world_size, RESTARTS.name: restarts}
        self._values.update({SAMPLES.name: 0, TOKENS.name: 0, DATA_WAIT.name: 0.0})
        self._rank_values: dict[str, float] = {GPU_MEMORY.name: 0}
        self._record = {"rank": rank, "info": info, "rank_info": where}
        self._step_seconds = BucketCounts(STEP_BUCKETS)
        self._checkpoint_seconds = BucketCounts(CHECKPOINT_BUCKETS)
        self._cuda_device = device if getattr(device, "type", None) == "cuda" else None
        self._next_gpu_sample = 0.0
        self._next_flush = 0.0
        self._write()  # the restart count and what runs, before the first step

    def on_plan(self, total_steps: int) -> None:
        """The step the run ends at (planned at its start): `kubeddp status` shows the percent
        done and the time left from it."""
        if self.enabled:
            self._values[PLANNED_STEPS.name] = total_steps

    def on_step(
        self,
        *,
        step: int,
        epoch: int | None,
        loss: float | None,
        lr: float | None,
        samples: int,
        tokens: int,
        step_seconds: float | None,
        data_wait_seconds: float,
    ) -> None:
        if not self.enabled:
            return
        if step_seconds is not None:  # None: a user program's first report_step
            self._step_seconds.observe(step_seconds)
        values = self._values  # names as constants: this runs every step
        values[_SAMPLES] += samples
        values[_TOKENS] += tokens
        values[_DATA_WAIT] += data_wait_seconds
        values[_STEP] = step
        if loss is not None:  # only log steps read the loss (a host sync)
            values[_LOSS] = loss
        if epoch is not None:  # a user program may give neither epoch nor lr
            values[_EPOCH] = epoch
        if lr is not None:
            values[_LEARNING_RATE] = lr
        now = time.monotonic()
        if now >= self._next_flush:
            self._next_flush = now + FLUSH_EVERY_SECONDS
            if self._cuda_device is not None and now >= self._next_gpu_sample:
                self._next_gpu_sample = now + GPU_MEMORY_EVERY_SECONDS
                self._sample_gpu_memory()
            self._write()

    def flush(self) -> None:
        """Write what on_step recorded into this worker's file."""
        if self.enabled:
            self._write()

    def _write(self) -> None:
        histograms = {STEP_SECONDS.name: self._step_seconds.record()}
        if self._checkpoint_seconds.total or any(self._checkpoint_seconds.counts):
            histograms[CHECKPOINT_SECONDS.name] = self._checkpoint_seconds.record()
        record = {
            **self._record,
            "written": time.time(),
            "values": self._values,
            "rank_values": self._rank_values,
            "histograms": histograms,
        }
        # A directory that went away (launch is ending) or is full never ends a run.
        with contextlib.suppress(OSError):
            self._file.write(record)

    def _sample_gpu_memory(self) -> None:
        import torch

        self._rank_values[GPU_MEMORY.name] = torch.cuda.memory_allocated(self._cuda_device)

    def on_checkpoint(self, *, duration_seconds: float, timestamp: float) -> None:
        if not self.enabled:
            return
        self._checkpoint_seconds.observe(duration_seconds)
        self._values[LAST_CHECKPOINT.name] = timestamp
        self._write()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._cuda_device is not None:
            self._sample_gpu_memory()
        self._write()
        self._file.close()
        self.enabled = False  # a later call writes nothing (the descriptor may be another's)
