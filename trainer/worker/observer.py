"""Step observers: what benchmarks and tests record of a run, told by the loop at each step end.

The Trainer builds only the observers a run asks for ($KUBEDDP_SUMMARY_FILE,
train.record_sample_ids); a run that asks for none pays nothing.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from kubeddp.trainer import constants
from kubeddp.trainer.config import TrainConfig
from kubeddp.trainer.worker.sampler import ResumableDistributedSampler


@dataclass
class StepEnd:
    step: int  # optimizer steps taken, this one included
    epoch: int
    samples: int  # this rank's samples in the step


class StepObserver:
    def on_epoch_start(self, epoch: int, sampler: ResumableDistributedSampler) -> None:
        """The sampler is set to this epoch (at the resumed position, after a resume)."""

    def on_step_end(self, end: StepEnd) -> None:
        """An optimizer step has run."""

    def on_fit_end(self) -> None:
        """Training ended normally (not preempted or stopped)."""


_IMPORTED_UNIX = time.time()


def process_start_unix() -> float:
    """When this process started, as unix time (Linux: /proc, to 10 ms; elsewhere: when this
    module was imported, which a worker does within its first second)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        started_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _IMPORTED_UNIX


def max_memory_allocated(device: torch.device) -> int:
    """Peak bytes PyTorch's CUDA allocator handed to tensors on `device`; 0 on CPU."""
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else 0


class StepTimesFile(StepObserver):
    """Rank 0's per-step wall-clock (unix) and process CPU times (all threads), written as JSON
    to $KUBEDDP_SUMMARY_FILE at the end (tests/bench reads it).

    Also: when the worker process started and how long after that its first step ended
    (`first_step_end_seconds`: start-up plus, with torch.compile, compiling), when training
    began (`train_start_unix`: model built, checkpoint resumed), and the peak CUDA memory
    (`max_memory_allocated`, bytes; 0 on CPU). Times are host times: without a sync per step
    a single step's time is when the host queued it, so compare spans of many steps.
    """

    def __init__(
        self,
        path: Path,
        world_size: int,
        samples_per_step: int,
        tokens_per_sample: int,
        device: torch.device | None = None,
    ) -> None:
        self.path = path
        self.device = device or torch.device("cpu")
        self.header = {
            "world_size": world_size,
            "samples_per_step": samples_per_step,
            "tokens_per_sample": tokens_per_sample,
        }
        self.worker_start_unix = process_start_unix()
        self.train_start_unix: float | None = None
        self.step_end_unix: list[float] = []
        self.step_end_cpu: list[float] = []

    def on_epoch_start(self, epoch: int, sampler: ResumableDistributedSampler) -> None:
        if self.train_start_unix is None:
            self.train_start_unix = time.time()

    def on_step_end(self, end: StepEnd) -> None:
        self.step_end_unix.append(time.time())
        self.step_end_cpu.append(time.process_time())

    def on_fit_end(self) -> None:
        first_end = self.step_end_unix[0] - self.worker_start_unix if self.step_end_unix else None
        summary = {
            **self.header,
            "step_end_unix": self.step_end_unix,
            "step_end_cpu": self.step_end_cpu,
            "worker_start_unix": self.worker_start_unix,
            "train_start_unix": self.train_start_unix,
            "first_step_end_seconds": first_end,
            "max_memory_allocated": max_memory_allocated(self.device),
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(summary))
        tmp.replace(self.path)


class SampleIdRecorder(StepObserver):
    """train.record_sample_ids: the sample ids this rank trained, per epoch. Checkpoints keep
    every rank's record, so tests can prove each sample is trained once across restarts."""

    def __init__(self) -> None:
        self.record: dict[int, list[int]] = {}
        self._order: list[int] = []
        self._next = 0

    def on_epoch_start(self, epoch: int, sampler: ResumableDistributedSampler) -> None:
        self._order = list(sampler)
        self._next = 0

    def on_step_end(self, end: StepEnd) -> None:
        ids = self._order[self._next : self._next + end.samples]
        self._next += end.samples
        self.record.setdefault(end.epoch, []).extend(ids)

    def restore(self, records: list[dict[int, list[int]]], rank: int, world_size: int) -> None:
        """Take over saved records: old rank i's go to rank i % world_size, so none is lost
        when the world shrinks."""
        for old_rank, record in enumerate(records):
            if old_rank % world_size == rank:
                for epoch, ids in record.items():
                    self.record.setdefault(int(epoch), []).extend(ids)


def step_times_file(
    train: TrainConfig,
    rank: int,
    world_size: int,
    tokens_per_sample: int,
    device: torch.device | None = None,
) -> StepTimesFile | None:
    """The StepTimesFile $KUBEDDP_SUMMARY_FILE asks for (rank 0 only), else None."""
    path = os.environ.get(constants.ENV_SUMMARY_FILE, "")
    if rank != 0 or not path:
        return None
    samples_per_step = train.batch_size * train.grad_accum_steps * world_size
    return StepTimesFile(Path(path), world_size, samples_per_step, tokens_per_sample, device)
