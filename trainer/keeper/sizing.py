"""The keeper's sizing, decided once: the constants here, and two places that do the sums.

- The manifests: charts/kubeddp/templates/_keeper.tpl computes a training pod's
  terminationGracePeriodSeconds (the save after SIGTERM, torchrun's margin, the send of the
  largest checkpoint the claim holds at the floor rate, a margin before SIGKILL) and its
  emptyDir's sizeLimit from these constants (`constants_for_chart()`, written into
  templates/_constants.tpl by `make chart`); `kubeddp render` renders the same chart. The
  keeper's own resources do not follow the checkpoint's size, so they are computed here, once,
  and written there as a constant.
- Launch: what a pod's grace period leaves for its last send (`send_seconds`, below).

tests/unit/test_keeper_manifests.py renders every kind and checks that each rendered grace
period leaves the send launch plans, for any size, and that a constant changed here reaches the
chart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from kubeddp.trainer import constants

# The slowest rate a final send is planned for: a keeper on a network disk shared with other
# pods (measured here: docs/checkpoints.md, "The keeper's cost"); faster disks finish sooner.
FLOOR_BYTES_PER_SECOND = 25e6
SEND_SLACK_SECONDS = 30.0  # the listing, connections, a retry after a dropped one
SHUTDOWN_MARGIN_SECONDS = 10  # what torchrun gives the workers beyond their grace (agent.py)
KILL_MARGIN_SECONDS = 5.0  # kept back from the kubelet's SIGKILL
# The keeper's own needs: its memory is the buffers of requests in progress (256 KiB each, 32
# at most) and the listing; its CPU hashes every received byte once (BLAKE3) and sends with
# sendfile(2). Measured CPU-seconds per GiB received: docs/checkpoints.md.
KEEPER_CPU_SECONDS_PER_GIB = 2.0  # 1.9 measured on a loaded 2-core machine
KEEPER_MEMORY_MIB = 256
SCRIPT_FILES_BYTES = 2**30  # a user's program's own files beside the checkpoints (emptyDir)


def final_send_seconds(checkpoint_bytes: float, slack: float = SEND_SLACK_SECONDS) -> float:
    """Time to send one checkpoint to the keeper at the planned floor rate."""
    return slack + max(0.0, checkpoint_bytes) / FLOOR_BYTES_PER_SECOND


def send_after_signal_seconds(termination_grace: float, preempt_grace: float) -> float:
    """What a pod stopped by SIGTERM has left for its last send, at the least: the grace
    period less the workers' save and torchrun's margin (and a margin before SIGKILL)."""
    left = termination_grace - preempt_grace - SHUTDOWN_MARGIN_SECONDS - KILL_MARGIN_SECONDS
    return max(KILL_MARGIN_SECONDS, left)


def send_seconds(
    env: Mapping[str, str], preempt_grace: float, signalled: bool, pending_bytes: float
) -> float:
    """The bound of a pod's last send: after SIGTERM what the grace period leaves (the pod's
    KUBEDDP_TERMINATION_GRACE_SECONDS, else the manifests' default); else the time the
    pending bytes need at the floor rate (plus the slack, KUBEDDP_CHECKPOINT_KEEPER_SEND_SLACK_
    SECONDS or 30 s), and never less than that grace."""
    grace = _seconds(
        env, constants.ENV_TERMINATION_GRACE_SECONDS, constants.TERMINATION_GRACE_SECONDS
    )
    if signalled:
        return send_after_signal_seconds(grace, preempt_grace)
    slack = _seconds(env, constants.ENV_CHECKPOINT_KEEPER_SEND_SLACK_SECONDS, SEND_SLACK_SECONDS)
    return max(grace, final_send_seconds(pending_bytes, slack))


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """A positive number of seconds from `env`, else `default` (unset or not one)."""
    try:
        value = float(env.get(name) or default)
    except ValueError:
        return float(default)
    return value if math.isfinite(value) and value > 0 else float(default)


def keeper_resources(bytes_per_second: float = 200e6) -> dict:
    """Requests and limits of the keeper's container: CPU to take checkpoints at
    `bytes_per_second` (its disk's rate), memory for its buffers (blocks stream: it does not
    grow with the checkpoint)."""
    cores = KEEPER_CPU_SECONDS_PER_GIB * bytes_per_second / 2**30
    request = max(100, math.ceil(cores * 1000 / 50) * 50)
    return {
        "requests": {"cpu": f"{request}m", "memory": f"{KEEPER_MEMORY_MIB}Mi"},
        "limits": {"cpu": f"{max(1000, 2 * request)}m", "memory": f"{2 * KEEPER_MEMORY_MIB}Mi"},
    }


def constants_for_chart() -> dict:
    """The numbers templates/_keeper.tpl computes the grace period and the emptyDir's sizeLimit
    from, and the keeper's resources (`keeperSizing` in templates/_constants.tpl)."""
    return {
        "floorBytesPerSecond": FLOOR_BYTES_PER_SECOND,
        "sendSlackSeconds": SEND_SLACK_SECONDS,
        "shutdownMarginSeconds": SHUTDOWN_MARGIN_SECONDS,
        "killMarginSeconds": KILL_MARGIN_SECONDS,
        "scriptFilesBytes": SCRIPT_FILES_BYTES,
        "keeperResources": keeper_resources(),
    }
