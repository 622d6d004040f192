"""Training metrics each worker records for its pod's /metrics endpoint.

Workers write into prometheus_client's multiprocess files (mmap'd, one per process and type)
in the directory `kubeddp launch` created and exported as PROMETHEUS_MULTIPROC_DIR; the launch
process, which outlives worker restarts, serves the sum (launcher/metrics_server.py). Files
of dead workers stay, so counters keep their totals across restarts. Every gauge uses a
multiprocess mode that drops the `pid` label ("mostrecent" or "max"), so series do not
multiply with each restart. Without that directory (metrics.enabled=false, or a torchrun that
kubeddp launch did not start) every call here is a no-op.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import time
from bisect import bisect_left
from collections.abc import Mapping
from typing import Any

from kubeddp.trainer import __version__, process_contract
from kubeddp.trainer.config import MetricsConfig
from kubeddp.trainer.worker.versions import RuntimeVersions, runtime_versions

# Seconds; from a toy CPU step to a large-model step.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CHECKPOINT_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Values are buffered in memory and written at most this often (a write costs 2-9 us; a scrape
# every second or more never sees the difference).
FLUSH_EVERY_SECONDS = 0.1
GPU_MEMORY_EVERY_SECONDS = 1.0  # torch.cuda.memory_allocated builds a stats dict: not per step

RESTARTS = "kubeddp_worker_restarts"
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


def multiprocess_dir() -> str | None:
    path = os.environ.get(process_contract.ENV_PROMETHEUS_MULTIPROC_DIR)
    return path if path and os.path.isdir(path) else None


def readable_files(files: list[str]) -> list[str]:
    """The multiprocess files that can be read now. Another process creates its file empty
    and then grows it (a worker starting, or killed mid-write): prometheus_client fails on
    such a file (struct.error), and one worker's file must not break the others' metrics."""
    from prometheus_client.mmap_dict import MmapedDict

    readable = []
    for path in files:
        try:
            for key, *_ in MmapedDict.read_all_values_from_file(path):
                json.loads(key)
        except (OSError, ValueError, struct.error, UnicodeDecodeError):
            continue  # read again at the next scrape, once its writer has written it
        readable.append(path)
    return readable


def tolerant_collector(registry: Any, path: str) -> Any:
    """prometheus_client's MultiProcessCollector for `path`, skipping unreadable files."""
    from prometheus_client.multiprocess import MultiProcessCollector

    class TolerantCollector(MultiProcessCollector):
        def collect(self):  # noqa: ANN202 - prometheus_client's own interface
            files = readable_files(glob.glob(os.path.join(self._path, "*.db")))
            return self.merge(files, accumulate=True)

    return TolerantCollector(registry, path=path)


def recorded_restarts(path: str) -> float:
    """The restart total already in the directory (written by earlier worker generations)."""
    from prometheus_client.multiprocess import MultiProcessCollector

    files = readable_files(glob.glob(os.path.join(path, "counter_*.db")))
    for family in MultiProcessCollector.merge(files):
        if family.name == RESTARTS:
            return sum(s.value for s in family.samples if s.name == RESTARTS + "_total")
    return 0.0


class _Instruments:
    """The prometheus_client objects; created only in a process that has the directory."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        def gauge(name: str, doc: str, mode: str = "mostrecent", labels: tuple = ()) -> Gauge:
            return Gauge(name, doc, labels, registry=None, multiprocess_mode=mode)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, registry=None)

        self.info = gauge("kubeddp_info", "Constant 1; labels say what runs", labels=INFO_LABELS)
        self.step = gauge("kubeddp_step", "Current global optimizer step")
        self.epoch = gauge("kubeddp_epoch", "Current epoch (0-based)")
        self.planned_steps = gauge(
            "kubeddp_planned_steps", "The optimizer step this run is planned to end at"
        )
        self.loss = gauge(
            "kubeddp_loss",
            "Training loss: mean over all ranks and the steps of the latest log interval",
        )
        self.lr = gauge("kubeddp_learning_rate", "Learning rate of the latest step")
        self.world_size = gauge("kubeddp_world_size", "Number of training processes in the job")
        self.samples = counter("kubeddp_samples", "Training samples processed by this pod")
        self.tokens = counter("kubeddp_tokens", "Training tokens processed by this pod")
        self.data_wait = counter(
            "kubeddp_data_wait_seconds", "Time this pod's ranks waited for the next batch"
        )
        self.restarts = counter(RESTARTS, "torchrun worker-group restarts on this pod")
        self.step_seconds = Histogram(
            "kubeddp_step_duration_seconds",
            "Wall time of one optimizer step, per rank",
            ("rank",),
            buckets=STEP_BUCKETS,
            registry=None,
        )
        self.checkpoint_seconds = Histogram(
            "kubeddp_checkpoint_save_duration_seconds",
            "Time the training loop spent saving a checkpoint",
            buckets=CHECKPOINT_BUCKETS,
            registry=None,
        )
        self.last_checkpoint = gauge(
            "kubeddp_last_checkpoint_timestamp_seconds",
            "Unix time of the latest checkpoint save (0 = none yet)",
            mode="max",
        )
        self.gpu_memory = gauge(
            "kubeddp_gpu_memory_allocated_bytes",
            "CUDA memory allocated by PyTorch tensors, per rank (0 on CPU)",
            labels=("rank",),
        )


class _BufferedHistogram:
    """Observations of one histogram child, bucketed in memory and written on flush().

    A multiprocess observe() costs two locked mmap writes and two getpid() calls: ~9 us with
    the cache cold from a training step, 1% of a 1 ms step. This costs a bisect. flush() adds
    the counts to the child's own values (prometheus_client's `_sum`/`_buckets`/`_upper_bounds`:
    not public API, so tests check the exact counts and sums).
    """

    def __init__(self, child: Any) -> None:
        self.child = child
        self.bounds = list(child._upper_bounds)  # ascending, ends with +Inf
        self.counts = [0] * len(self.bounds)
        self.total = 0.0
        self.pending = False

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1  # first bucket with amount <= le
        self.total += amount
        self.pending = True

    def flush(self) -> None:
        if not self.pending:
            return
        self.child._sum.inc(self.total)
        for i, count in enumerate(self.counts):
            if count:
                self.child._buckets[i].inc(count)
                self.counts[i] = 0
        self.total = 0.0
        self.pending = False


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
        path = multiprocess_dir() if cfg.enabled else None
        self.enabled = path is not None
        if not self.enabled:
            return
        m = self.m = _Instruments()
        source = os.environ.get(process_contract.ENV_RDZV_SOURCE, "standalone")
        if versions is None:
            versions = runtime_versions(getattr(device, "type", "cpu"))
        labels = {name: (transport or {}).get(name, "") for name in TRANSPORT_LABELS}
        m.info.labels(
            version=__version__,
            backend=backend,
            rdzv_source=source,
            **versions.labels(),
            **labels,
        ).set(1)
        m.world_size.set(world_size)
        self._step_seconds = _BufferedHistogram(m.step_seconds.labels(str(rank)))
        self._gpu_memory = m.gpu_memory.labels(str(rank))
        self._gpu_memory.set(0)
        self._cuda_device = device if getattr(device, "type", None) == "cuda" else None
        self._next_gpu_sample = 0.0
        self._next_flush = 0.0
        # step, epoch, lr; a user program's report_step leaves epoch and lr None
        self._latest: tuple[int, int | None, float | None] | None = None
        self._loss: float | None = None
        self._pending_samples = 0
        self._pending_tokens = 0
        self._pending_wait = 0.0
        self._count_restarts(path)

    def _count_restarts(self, path: str) -> None:
        # One process per pod (local rank 0) tops the total up to torchrun's restart count, so a
        # generation that died before reaching here is still counted by the next one.
        if os.environ.get("LOCAL_RANK", "0") != "0":
            return
        target = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        missing = target - recorded_restarts(path)
        if missing > 0:
            self.m.restarts.inc(missing)

    def on_plan(self, total_steps: int) -> None:
        """The step the run ends at (planned at its start): `kubeddp status` shows the percent
        done and the time left from it."""
        if self.enabled:
            self.m.planned_steps.set(total_steps)

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
        self._pending_samples += samples
        self._pending_tokens += tokens
        self._pending_wait += data_wait_seconds
        if loss is not None:  # only log steps read the loss (a host sync); others keep it
            self._loss = loss
        self._latest = (step, epoch, lr)
        now = time.monotonic()
        if now >= self._next_flush:
            self._next_flush = now + FLUSH_EVERY_SECONDS
            self.flush()
            if self._cuda_device is not None and now >= self._next_gpu_sample:
                self._next_gpu_sample = now + GPU_MEMORY_EVERY_SECONDS
                self._sample_gpu_memory()

    def flush(self) -> None:
        """Write what on_step buffered into the shared files."""
        if not self.enabled:
            return
        m = self.m
        self._step_seconds.flush()
        if self._latest is not None:
            step, epoch, lr = self._latest
            m.step.set(step)
            if epoch is not None:
                m.epoch.set(epoch)
            if lr is not None:
                m.lr.set(lr)
            self._latest = None
        if self._loss is not None:
            m.loss.set(self._loss)
            self._loss = None
        if self._pending_samples:
            m.samples.inc(self._pending_samples)
            self._pending_samples = 0
        if self._pending_tokens:
            m.tokens.inc(self._pending_tokens)
            self._pending_tokens = 0
        if self._pending_wait:
            m.data_wait.inc(self._pending_wait)
            self._pending_wait = 0.0

    def _sample_gpu_memory(self) -> None:
        import torch

        self._gpu_memory.set(torch.cuda.memory_allocated(self._cuda_device))

    def on_checkpoint(self, *, duration_seconds: float, timestamp: float) -> None:
        if not self.enabled:
            return
        self.flush()
        self.m.checkpoint_seconds.observe(duration_seconds)
        self.m.last_checkpoint.set(timestamp)

    def close(self) -> None:
        self.flush()
        if self.enabled and self._cuda_device is not None:
            self._sample_gpu_memory()
