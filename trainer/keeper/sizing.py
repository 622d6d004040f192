"""How the keeper and the time a pod has to send its last files follow the checkpoint's size and
the grace period: pure functions, for launch and for the manifests, so the pod's
terminationGracePeriodSeconds, the keeper's resources and the training pods' emptyDir sizeLimit
agree with what launch does. The chart computes the same numbers from `constants_for_chart()`
(written into templates/_constants.tpl by `make chart`; templates/_keeper.tpl does the sums);
tests/unit/test_keeper_manifests.py renders every kind against these functions.
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


def final_send_seconds(checkpoint_bytes: float) -> float:
    """Time to send one checkpoint to the keeper at the planned floor rate."""
    return SEND_SLACK_SECONDS + max(0.0, checkpoint_bytes) / FLOOR_BYTES_PER_SECOND


def termination_grace_seconds(preempt_grace: float, checkpoint_bytes: float) -> int:
    """terminationGracePeriodSeconds for a training pod behind a keeper: the save after
    SIGTERM (preempt_grace, plus torchrun's margin), then the send of that checkpoint."""
    total = preempt_grace + SHUTDOWN_MARGIN_SECONDS + final_send_seconds(checkpoint_bytes)
    return math.ceil(total + KILL_MARGIN_SECONDS)


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
    pending bytes need at the floor rate, and never less than that grace."""
    raw = env.get(constants.ENV_TERMINATION_GRACE_SECONDS, "")
    try:
        grace = float(raw) if raw else float(constants.TERMINATION_GRACE_SECONDS)
    except ValueError:
        grace = float(constants.TERMINATION_GRACE_SECONDS)
    if not math.isfinite(grace) or grace <= 0:
        grace = float(constants.TERMINATION_GRACE_SECONDS)
    if signalled:
        return send_after_signal_seconds(grace, preempt_grace)
    return max(grace, final_send_seconds(pending_bytes))


def keeper_resources(checkpoint_bytes: float, bytes_per_second: float = 200e6) -> dict:
    """Requests and limits of the keeper's container: CPU to take checkpoints at
    `bytes_per_second` (its disk's rate), memory for its buffers."""
    del checkpoint_bytes  # the memory does not grow with the checkpoint: blocks stream
    cores = KEEPER_CPU_SECONDS_PER_GIB * bytes_per_second / 2**30
    request = max(100, math.ceil(cores * 1000 / 50) * 50)
    return {
        "requests": {"cpu": f"{request}m", "memory": f"{KEEPER_MEMORY_MIB}Mi"},
        "limits": {"cpu": f"{max(1000, 2 * request)}m", "memory": f"{2 * KEEPER_MEMORY_MIB}Mi"},
    }


def empty_dir_size_limit(checkpoint_bytes: float, keep: int) -> str:
    """The training pods' checkpoint.dir emptyDir: the newest fetched, `keep` written, and one
    being written (the writer prunes after its rename), plus 1 GiB for a script's files."""
    total = (keep + 2) * max(0.0, checkpoint_bytes) + SCRIPT_FILES_BYTES
    return f"{math.ceil(total / 2**20)}Mi"


def checkpoint_bytes_of_claim(claim_bytes: float, keep: int) -> float:
    """The largest checkpoint a claim of `claim_bytes` holds: `keep` of them committed and one
    more being received (the keeper prunes after it commits). The manifests know the claim's
    size (checkpoints.size), not the checkpoint's, and plan with this."""
    return max(0.0, claim_bytes) / (keep + 1)


def constants_for_chart() -> dict:
    """The numbers the chart computes the grace period, the emptyDir's sizeLimit and the
    keeper's resources from (`keeperSizing` in templates/_constants.tpl). The keeper's
    resources do not follow the checkpoint's size (blocks stream), so they are one constant;
    the test that renders several sizes fails if that changes."""
    return {
        "floorBytesPerSecond": FLOOR_BYTES_PER_SECOND,
        "sendSlackSeconds": SEND_SLACK_SECONDS,
        "shutdownMarginSeconds": SHUTDOWN_MARGIN_SECONDS,
        "killMarginSeconds": KILL_MARGIN_SECONDS,
        "scriptFilesBytes": SCRIPT_FILES_BYTES,
        "keeperResources": keeper_resources(0.0),
    }
