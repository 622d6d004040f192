"""Count the collectives this rank enters, in its heartbeat record (the gloo equivalent of
NCCL's flight recorder, at the granularity of torch.distributed's Python calls).

`install` wraps the collective functions of the `torch.distributed` namespace, which the
trainer and user programs call as `dist.all_reduce(...)` (torch's own internal calls go through
`distributed_c10d` and are not counted twice). When every other rank waits in all_reduce #48123
and one rank is still at #48122, or in another op, the stall report says so. DDP's gradient
all-reduces run inside backward (C++), shown as the forward/backward phase instead.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from kubeddp.trainer.process_contract import COLLECTIVES
from kubeddp.trainer.worker.grad_ready import LastGradient
from kubeddp.trainer.worker.heartbeat import Heartbeat

_MARK = "_kubeddp_counted"


# The heartbeat the wrappers write to: this process's, replaced when a new one is installed
# (a process that runs several trainers one after the other, as the benchmark does).
_CURRENT: list[Heartbeat] = []


def _counted(original: Callable[..., Any], op: int) -> Callable[..., Any]:
    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        hb = _CURRENT[0]
        hb.collective_start(op)
        try:
            return original(*args, **kwargs)
        finally:  # an async op ends here too: its wait is the caller's, later
            hb.collective_end(op)

    setattr(counted, _MARK, True)
    return counted


def install(hb: Heartbeat) -> None:
    """Count into `hb` from now on; wrap torch.distributed's collectives once per process
    (not while no heartbeat is enabled)."""
    _CURRENT[:] = [hb]
    if not hb.enabled:
        return
    import torch.distributed as dist

    for op, name in enumerate(COLLECTIVES):
        original = getattr(dist, name, None)
        if original is not None and not getattr(original, _MARK, False):
            setattr(dist, name, _counted(original, op))


def watch_ddp(model: Any, hb: Heartbeat, hook: Any = None) -> LastGradient | None:
    """Register the DDP comm hook (ddp.comm_hook's, else DDP's own all-reduce), noting when this
    rank's gradients are ready for it: the time from there to the end of backward is spent
    waiting for the other ranks, which tells a straggler from the ranks that wait for it. With
    a hook the mark runs first inside it; with DDP's own all-reduce a hook of ours would cost a
    pass over the gradients, so one parameter's gradient hook marks it (grad_ready.py): the
    LastGradient returned is told of every optimizer step."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from kubeddp.trainer.worker import comm_hooks

    def ready() -> None:
        hb.sync_ready = time.monotonic()

    if hook is None and hb.enabled and isinstance(model, DDP):
        return LastGradient(list(model.parameters()), ready)
    comm_hooks.register(model, hook, ready if hb.enabled else None)
    return None
