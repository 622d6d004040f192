"""Rank 0's progress for Kubeflow Trainer's TrainJob status, handed to the launch process.

On a TrainJob whose controller offers the status endpoint, `kubeddp launch` exports
KUBEDDP_STATUS_FILE to its workers (launcher/trainjob_status.py); the process of global rank
0 keeps its latest progress there: a small JSON object, written whole and renamed (a reader
never sees half of it), at most once a second. The launch process, which outlives worker
restarts, reads it and posts it. Without the variable every call here is a no-op and nothing
is imported.

Trainer keeps each metric as a name and a string value of at most 64 characters, and at most
256 of them (the TrainJob CRD's `status.trainerStatus.metrics`, kubeflow/trainer v2.3.0
pkg/apis/trainer/v1alpha1/trainjob_types.go `Metric`): values are formatted here, once.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kubeddp.trainer.process_contract import ENV_STATUS_FILE

WRITE_EVERY_SECONDS = 1.0


class StatusFeed:
    """The latest progress of this run, kept in `path` for the launch process.

    `update` merges what it is given into what is known (a loss or an eval loss stays until a
    newer one comes; extra metrics stay until replaced) and writes at most every `every`
    seconds; `flush` writes what is not written yet (at the end of a run).
    """

    def __init__(
        self,
        path: str | Path,
        every: float = WRITE_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.every = every
        self.clock, self.wall = clock, wall
        self.known: dict[str, Any] = {}
        self.extra: dict[str, str] = {}
        self._next_write = 0.0
        self._unwritten = False
        self._rate_from: tuple[float, int] | None = None  # (time, step) of the first update

    def update(
        self,
        step: int,
        *,
        total_steps: int | None = None,
        epoch: int | None = None,
        total_epochs: int | None = None,
        loss: float | None = None,
        eval_loss: float | None = None,
        eta_seconds: float | None = None,
        metrics: Mapping[str, str] | None = None,
    ) -> None:
        now = self.clock()
        given = {
            "step": step,
            "total_steps": total_steps,
            "epoch": epoch,
            "total_epochs": total_epochs,
            "loss": loss,
            "eval_loss": eval_loss,
        }
        self.known.update({k: v for k, v in given.items() if v is not None})
        self.known["eta_seconds"] = (
            eta_seconds if eta_seconds is not None else self._estimate_eta(now, step)
        )
        if metrics:
            self.extra.update(metrics)
        self._unwritten = True
        if now >= self._next_write:
            self._write(now)

    def _estimate_eta(self, now: float, step: int) -> float | None:
        """From the steps since the first update (a script's first step, its warm-up, is not
        counted): None until two updates, or without a total."""
        total = self.known.get("total_steps")
        if self._rate_from is None:
            self._rate_from = (now, step)
            return None
        since, from_step = self._rate_from
        if total is None or step <= from_step:
            return None
        return (now - since) / (step - from_step) * max(0, total - step)

    def flush(self) -> None:
        if self._unwritten:
            self._write(self.clock())

    def _write(self, now: float) -> None:
        self._next_write = now + self.every
        self._unwritten = False
        record = {**self.known, "metrics": self.extra, "observed_at": self.wall()}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(record, allow_nan=True))
            os.replace(tmp, self.path)
        except OSError:
            # The launch that made the folder is gone (its workers are being torn down): the
            # status is never worth the run.
            tmp.unlink(missing_ok=True)


def for_rank(rank: int, env: Mapping[str, str] | None = None) -> StatusFeed | None:
    """The feed of global rank 0 under a launch that posts progress, else None."""
    env = os.environ if env is None else env
    path = env.get(ENV_STATUS_FILE)
    if not path or rank != 0:
        return None
    return StatusFeed(path)
