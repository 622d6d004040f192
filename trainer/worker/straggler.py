"""The straggler verdict: a rank whose own work per step (its step time less the time it
waited for its peers' gradients, heartbeat.py) is over `straggler_factor` x the median of the
other ranks' over the last `straggler_window_seconds`.

In DDP every rank's wall-clock step time is the same (the gradient all-reduce waits for the
slowest), so the wall time cannot name the slow rank; the time each rank works before it waits
can. At log steps (which already read the loss) the ranks all-gather their busy totals in one
small collective; every rank keeps the same history, so all reach the same verdict, and each
writes its own into its heartbeat record (launch exports it on /metrics).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kubeddp.trainer.common import this_pod
from kubeddp.trainer.worker.distributed import DistContext, gather_objects
from kubeddp.trainer.worker.heartbeat import Heartbeat
from kubeddp.trainer.worker.versions import gpu_uuid

# Before a verdict the history must span this many steps and half the window: the first
# steps after a start or a restart (warm-up, a checkpoint read) are not a node's speed.
MIN_STEPS = 20


@dataclass(frozen=True)
class Straggler:
    rank: int
    ratio: float  # its busy time per step over the median
    where: str  # "pod P, node N" (", GPU GPU-..." on CUDA)

    def describe(self, window: float) -> str:
        return (
            f"straggler: rank {self.rank} ({self.where}) works {self.ratio:.1f}x the median "
            f"of the other ranks per step over the last {window:g} s"
        )


class StragglerWatch:
    def __init__(
        self, ctx: DistContext, hb: Heartbeat, factor: float, window: float,
        log: Callable[[str], None],
    ) -> None:  # fmt: skip
        self.ctx, self.hb, self.factor, self.window, self.log = ctx, hb, factor, window, log
        self.enabled = hb.enabled and ctx.distributed and ctx.world_size > 1
        self._history: deque[tuple[float, int, list[float]]] = deque()
        self._where: list[str] | None = None
        self._named: set[int] = set()  # ranks whose verdict is out (logged once per episode)
        self.current: list[Straggler] = []
        self._started = time.monotonic()

    def at_log_step(self, step: int) -> None:
        """Collective (every rank, at the same log step)."""
        if not self.enabled:
            return
        import torch.distributed as dist

        if self._where is None:  # `pod P, node N`, and the GPU a health panel knows it by
            uuid = gpu_uuid(self.ctx.device)
            self._where = gather_objects(this_pod() + (f", GPU {uuid}" if uuid else ""))
        mine = torch.tensor([self.hb.busy], dtype=torch.float64, device=self.ctx.device)
        out = torch.empty(self.ctx.world_size, dtype=torch.float64, device=self.ctx.device)
        # all_gather_single where torch has it (all_gather_into_tensor is deprecated there)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, mine)
        now = time.monotonic()
        self._history.append((now, step, out.tolist()))  # a log step: the read is allowed
        while self._history and now - self._history[0][0] > self.window:
            self._history.popleft()
        self._judge()

    def _judge(self) -> None:
        (_, first_step, first), (end, last_step, last) = self._history[0], self._history[-1]
        steps = last_step - first_step
        if steps < MIN_STEPS or end - self._started < self.window / 2:
            return
        per_step = [(b - a) / steps for a, b in zip(first, last, strict=True)]
        assert self._where is not None
        self.current = []
        for rank, value in enumerate(per_step):
            # the median of the others: with two ranks, the median of both would be the mean
            median = statistics.median(per_step[:rank] + per_step[rank + 1 :])
            if median > 0 and value > self.factor * median:
                self.current.append(Straggler(rank, value / median, self._where[rank]))
        ratio = next((s.ratio for s in self.current if s.rank == self.ctx.rank), 0.0)
        self.hb.straggler(ratio)
        named = {s.rank for s in self.current}
        if self.ctx.is_main:
            for s in self.current:
                if s.rank not in self._named:
                    self.log(f"[kubeddp] {s.describe(self.window)}")
            for rank in self._named - named:
                self.log(f"[kubeddp] rank {rank} is no longer a straggler")
        self._named = named
