"""What the runner observes in a user's program for its heartbeat, without its help.

- every `optimizer.step()` (torch's global optimizer step hooks): the phase `optimizer`,
  then a finished step, numbered 1, 2, ... until the program calls `kubeddp.api.report_step`,
  whose step numbers win from then on;
- the collectives it calls through `torch.distributed` (collectives.py);
- faulthandler on STACKS_SIGNAL (heartbeat.py), so a stalled program's stacks are captured.
"""

from __future__ import annotations

from typing import Any

from kubeddp.trainer.worker import collectives
from kubeddp.trainer.worker.heartbeat import PHASE_CODE, this_rank

_STATE = {"reported": False, "steps": 0}


def reported() -> None:
    """report_step was called: its step numbers replace the optimizer-step count."""
    _STATE["reported"] = True


def install() -> None:
    hb = this_rank()
    if not hb.enabled:
        return
    import torch.optim.optimizer as optim

    collectives.install(hb)
    optimizer, between = PHASE_CODE["optimizer"], PHASE_CODE["step"]

    def before(opt: Any, args: Any, kwargs: Any) -> None:  # noqa: ARG001 - hook signature
        hb.phase(optimizer)

    def after(opt: Any, args: Any, kwargs: Any) -> None:  # noqa: ARG001 - hook signature
        if _STATE["reported"]:
            hb.phase(between)
            return
        _STATE["steps"] += 1
        hb.step_done(_STATE["steps"], between)

    optim.register_optimizer_step_pre_hook(before)
    optim.register_optimizer_step_post_hook(after)
