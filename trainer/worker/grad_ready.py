"""The moment this rank's gradients are all computed in a backward pass, with one Python call per
step, for the straggler measurement (heartbeat.py: from then until backward returns the rank
waits for its peers' all-reduce).

With DDP's own all-reduce (no ddp.comm_hook) a Python comm hook just for this mark would cost a
pass over every gradient per step: DDP divides by the world size while it copies gradients into
its buckets, and only without a hook (0.27 ms of a 22 ms step on the benchmarks' small model, 1.2%
of its CPU). Instead a hook on each parameter's accumulated gradient learns, over the first
LEARN_PASSES backward passes, whose gradient comes last; then only that parameter keeps its hook.
A model whose last gradient changes from step to step (one that skips parameters) then marks
some steps late or not at all: those steps count their wait as work, nothing else changes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the launcher's --help path imports this module
    import torch

LEARN_PASSES = 2


class LastGradient:
    """Calls `mark` when the gradient that comes last in backward has been accumulated."""

    def __init__(self, parameters: list[torch.nn.Parameter], mark: Callable[[], None]) -> None:
        self.mark = mark
        self.parameters = [p for p in parameters if p.requires_grad]
        self.latest = -1  # the parameter whose gradient came last so far
        self.passes = 0
        self.lock = threading.Lock()  # autograd may run hooks of one pass on several threads
        self.handles = [
            p.register_post_accumulate_grad_hook(self._learning(i))
            for i, p in enumerate(self.parameters)
        ]

    def _learning(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            self.mark()
            with self.lock:
                self.latest = index

        return hook

    def _settled(self, _: torch.Tensor) -> None:
        self.mark()

    def step_done(self) -> None:
        """After each optimizer step: once LEARN_PASSES have shown the last gradient, only its
        parameter keeps a hook."""
        if self.passes >= LEARN_PASSES:
            return
        self.passes += 1
        if self.passes < LEARN_PASSES or self.latest < 0:
            return
        for handle in self.handles:
            handle.remove()
        last = self.parameters[self.latest]
        self.handles = [last.register_post_accumulate_grad_hook(self._settled)]

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
