"""Waiting for the checkpoint keeper at a pod's start: a line every 30 s naming the keeper and
what to check, and a pod-local count of starts that never reached it.

The retry budget's record lives on the keeper (retry_budget.py), so while the keeper cannot be
reached it cannot count these starts. This count lives in checkpoint.dir (an emptyDir, which a
container restarted in place keeps) under `.kubeddp-pod/`, never sent: after
`retries.without_progress` starts that waited in vain, the pod ends with RETRIES_EXHAUSTED (5)
instead of being retried forever. A pod that reaches the keeper forgets the count.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from kubeddp.trainer.launcher.keeper_client import KeeperError
from kubeddp.trainer.launcher.keeper_local import POD_DIR

SAY_EVERY_SECONDS = 30.0
POLL_SECONDS = 0.5
RECORD = f"{POD_DIR}/keeper-unreachable.json"


class Probed(Protocol):
    url: str

    def probe(self) -> str | None: ...


class KeeperUnreachable(KeeperError):
    """The keeper did not answer within the wait (retried: the operator starts the pod again)."""


class KeeperGaveUp(RuntimeError):
    """The keeper did not answer at this many starts of this pod (fatal: 5)."""


def what_to_check(url: str) -> str:
    name = url.split("://", 1)[-1].split(":", 1)[0].split(".", 1)[0]
    return (
        f"check its pod (kubectl get pods -l kubeddp.io/checkpoint-keeper={name}: Pending means "
        "its node selectors, taints or its claim's zone; after a lost node a zonal claim moves "
        "in 6 to 11 min) and its claim (kubectl get pvc)"
    )


def wait_for_keeper(
    client: Probed,
    deadline_seconds: float,
    log: Callable[[str], None],
    checkpoint_dir: Path | None = None,
    limit: int = 0,
    say_every: float = SAY_EVERY_SECONDS,
) -> None:
    """Return once the keeper answers; KeeperUnreachable after `deadline_seconds`, or
    KeeperGaveUp when this is the pod's start number `limit` + 1 without an answer."""
    start = time.monotonic()
    said = start
    while (problem := client.probe()) is not None:
        now = time.monotonic()
        if now - start > deadline_seconds:
            _gave_up(client.url, deadline_seconds, problem, checkpoint_dir, limit)
        if now - said >= say_every:
            said = now
            log(f"[kubeddp] checkpoint keeper {client.url} has not answered for {now - start:.0f} "
                f"s ({problem}); {what_to_check(client.url)}")  # fmt: skip
        time.sleep(POLL_SECONDS)
    if checkpoint_dir is not None:
        (checkpoint_dir / RECORD).unlink(missing_ok=True)


def _gave_up(url: str, waited: float, problem: str, where: Path | None, limit: int) -> None:
    starts = _count(where) if where is not None else 0
    line = (
        f"checkpoint keeper {url} did not answer within {waited:g} s ({problem}); "
        f"{what_to_check(url)}"
    )
    if limit and starts > limit:
        raise KeeperGaveUp(f"{line}; this pod started {starts} times without reaching it")
    raise KeeperUnreachable(line)


def _count(checkpoint_dir: Path) -> int:
    """This start counted in the pod's own record; the count so far (best effort: 0)."""
    path = checkpoint_dir / RECORD
    try:
        starts = int(json.loads(path.read_text()).get("starts", 0)) + 1
    except (OSError, ValueError, AttributeError):
        starts = 1
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_suffix(".tmp")
        temp.write_text(json.dumps({"starts": starts}))
        os.replace(temp, path)
    except OSError:
        return 0
    return starts
