"""What the runner observes in a user's program for its heartbeat, without its help.

- every `optimizer.step()` (torch's global optimizer step hooks): the phase `optimizer`,
  then a finished step, numbered 1, 2, ... until the program calls `kubeddp.api.report_step`,
  whose step numbers win from then on;
- the collectives it calls through `torch.distributed` (collectives.py);
- faulthandler on STACKS_SIGNAL (heartbeat.py), so a stalled program's stacks are captured.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from kubeddp.trainer.process_contract import PHASE_CODE
from kubeddp.trainer.worker import collectives
from kubeddp.trainer.worker.heartbeat import this_rank

_STATE = {"reported": False, "steps": 0}


def reported() -> None:
    """report_step was called: its step numbers replace the optimizer-step count."""
    _STATE["reported"] = True


def install() -> None:
    """Watch the program (no-op without diagnostics). torch is not imported here: a program
    that fails at once fails as fast as under `python`. The hooks go in the moment the
    program's own `import torch` has finished (an import hook on the `torch` package), before
    any line of it can call a collective."""
    hb = this_rank()
    if not hb.enabled:
        return
    if "torch" in sys.modules:
        _hook(hb)
    else:
        sys.meta_path.insert(0, _AfterTorchImport(lambda: _hook(hb)))


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when `torch` is imported, lets the usual finder find it and
    calls `then` once its module has been executed."""

    def __init__(self, then: Callable[[], None]) -> None:
        self.then = then

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once; and the search below must not find us again
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        execute, then = spec.loader.exec_module, self.then

        def exec_then_hook(module: Any) -> None:
            execute(module)
            then()

        spec.loader.exec_module = exec_then_hook  # type: ignore[method-assign]
        return spec


def _hook(hb: Any) -> None:
    # torch: `kubeddp train --help` imports this module (through program.py) and must not import
    # torch
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
