"""Waiting for the checkpoint keeper at a pod's start: a line every 30 s naming the keeper and
what to check, within a budget this process keeps, then an end every kind of job stops on.

The retry budget's record lives on the keeper (retry_budget.py), so while the keeper cannot be
reached nothing outside this process can count the pod's starts: a PyTorchJob recreates its pod
(a fresh emptyDir) at every retryable exit. So the pod waits here for the starts the budget
would have allowed, the rendezvous wait × (`retries.without_progress` + 1), and then ends with
KEEPER_UNREACHABLE (7, fatal): PyTorchJob's ExitCode policy does not recreate it, and the
Indexed Job's and TrainJob's pod failure policies fail the job. With `retries.without_progress`
0 (no limit) it waits one rendezvous wait and exits 202, retried, as that setting asks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Protocol

from kubeddp.trainer import constants
from kubeddp.trainer.keeper.client import KeeperError, KeeperSettingError

SAY_EVERY_SECONDS = 30.0
POLL_SECONDS = 0.5


class Probed(Protocol):
    url: str

    def probe(self) -> str | None: ...


class KeeperUnreachable(KeeperError):
    """The keeper did not answer within the wait (retried: the operator starts the pod again)."""


class KeeperGaveUp(RuntimeError):
    """The keeper did not answer within the pod's whole budget (fatal: KEEPER_UNREACHABLE)."""


def wait_budget(deadline_seconds: float, limit: int) -> float:
    """Seconds this pod waits for its keeper: one rendezvous wait per start the retry budget
    allows (`limit` = retries.without_progress; 0 = no limit: one wait, then retried)."""
    return deadline_seconds * (limit + 1) if limit > 0 else deadline_seconds


def say_seconds(env: Mapping[str, str]) -> float:
    """How often a waiting pod says so (KUBEDDP_CHECKPOINT_KEEPER_SAY_SECONDS, default 30)."""
    raw = env.get(constants.ENV_CHECKPOINT_KEEPER_SAY_SECONDS)
    try:
        value = float(raw) if raw is not None else SAY_EVERY_SECONDS
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise KeeperSettingError(
            f"{constants.ENV_CHECKPOINT_KEEPER_SAY_SECONDS}={raw!r} must be seconds above 0 "
            "and at most 3600; set a number or unset it"
        )
    return value


def what_to_check(url: str) -> str:
    name = url.split("://", 1)[-1].split(":", 1)[0].split(".", 1)[0]
    return (
        f"check its pod (kubectl get pods -l kubeddp.io/checkpoint-keeper={name}: Pending means "
        "its node selectors, taints or its claim's zone; after a lost node a zonal claim moves "
        f"in 6 to 11 min), its claim (kubectl get pvc), the NetworkPolicy {name} (it must admit "
        f"this pod) and the Secret {name}-token (the same in the keeper and this pod)"
    )


def wait_for_keeper(
    client: Probed,
    deadline_seconds: float,
    log: Callable[[str], None],
    limit: int = 0,
    say_every: float = SAY_EVERY_SECONDS,
) -> None:
    """Return once the keeper answers; after `wait_budget(deadline_seconds, limit)` seconds
    without an answer KeeperGaveUp (limit > 0), else KeeperUnreachable."""
    budget = wait_budget(deadline_seconds, limit)
    start = time.monotonic()
    said = start
    while (problem := client.probe()) is not None:
        now = time.monotonic()
        if now - start > budget:
            _gave_up(client.url, deadline_seconds, limit, problem)
        if now - said >= say_every:
            said = now
            log(f"[kubeddp] checkpoint keeper {client.url} has not answered for {now - start:.0f} "
                f"s of {budget:g} s ({problem}); {what_to_check(client.url)}")  # fmt: skip
        time.sleep(POLL_SECONDS)


def _gave_up(url: str, deadline: float, limit: int, problem: str) -> None:
    waited = wait_budget(deadline, limit)
    line = f"checkpoint keeper {url} did not answer within {waited:g} s ({problem})"
    if limit:
        raise KeeperGaveUp(
            f"{line}, this pod's budget (the rendezvous wait {deadline:g} s × "
            f"(retries.without_progress {limit} + 1)); {what_to_check(url)}"
        )
    raise KeeperUnreachable(f"{line}; {what_to_check(url)}")
