"""A program that starts its own DDP workers, run by kubeddp as one of several workers, is named
in one line when it does so.

launch reads a script to tell whether it spawns its workers (script_check/spawn.py) and
then runs it once per node. What reading cannot follow (a start through another library, a
module run with --module, code built at run time) reaches this guard: the runner watches
multiprocessing's Process.start, and the first process the program starts before it has a
process group of its own, while torchrun counts several workers, is said in one line. Without
it such a run ends in gloo tracebacks (every copy's workers meet on the same port, or each node
trains its own copy) with no word of the cause. DataLoader workers start after
init_process_group and are not named.
"""

from __future__ import annotations

import multiprocessing.process
import sys
from typing import Any

_said: list[bool] = []


def _has_process_group() -> bool:
    dist = sys.modules.get("torch.distributed")  # not imported: no process group yet
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:  # a torch too broken to say: do not stand in the program's way
        return True


def line(program: str, world_size: int) -> str:
    return (
        f"[kubeddp] warning: {program} starts a process before it calls init_process_group, "
        "as a program that starts its own workers (mp.spawn, mp.Process) does, but kubeddp "
        f"runs it as one of {world_size} workers, so each copy would train on its own; run it "
        "with --spawns-workers on one node, or convert it to torchrun style "
        "(docs/your-own-script.md)"
    )


def install(program: str, world_size: int) -> None:
    """Watch the program's process starts (a no-op for a world of one)."""
    if world_size <= 1:
        return
    original = multiprocessing.process.BaseProcess.start

    def start(self: Any) -> None:
        if not _said and not _has_process_group():
            _said.append(True)
            print(line(program, world_size), file=sys.stderr, flush=True)
        original(self)

    multiprocessing.process.BaseProcess.start = start  # type: ignore[method-assign]
