"""The node's in-memory snapshots when the run ends: removed when no retry will resume from them
(the run finished, or failed in a way a retry would repeat); kept after an exit a retry follows
(preempted, a peer lost, killed), so the next start resumes from memory. A pod's memory volume
goes with the pod anyway; on a laptop or bare host this is what frees /dev/shm."""

from __future__ import annotations

import shutil
from collections.abc import Mapping

from kubeddp.trainer import constants, exit_codes, process_contract
from kubeddp.trainer.launcher.rendezvous_plan import RendezvousPlan


def remove_when_done(
    checkpoint_dir: str,
    plan: RendezvousPlan,
    env: Mapping[str, str],
    code: int,
) -> None:
    if code >= exit_codes.RETRYABLE_FROM:
        return
    if env.get(constants.ENV_SNAPSHOT_DIR) or plan.rdzv_backend == "static" or plan.standalone:
        node = plan.node_rank if isinstance(plan.node_rank, int) else 0
        roots = [process_contract.snapshot_root(checkpoint_dir, node, env)]
    else:  # elastic: node ranks come from the rendezvous; this host's for this run, any node
        own = process_contract.snapshot_root(checkpoint_dir, 0, env)
        roots = sorted(own.parent.glob(own.name.removesuffix("node0") + "node*"))
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)
