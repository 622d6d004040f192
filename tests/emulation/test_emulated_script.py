"""The example user script (examples/ddp_train.py) as a PyTorchJob, a TrainJob and an Indexed
Job, rendered by `kubeddp render KIND --script ... -- ARGS` and run by the emulated operators
(one network namespace per pod). Each ends with the same parameters as a direct `torchrun` run
of the script with the same world size.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from cluster import EmulatedCluster
from rendered_jobs import JOB_SECONDS, render

from tests.helpers import procs, user_script

pytestmark = [pytest.mark.netns, pytest.mark.slow]
# Where examples/Dockerfile puts the script in the image; the emulator maps it to the file.
IMAGE_SCRIPT = "/app/ddp_train.py"
# In the pod the snapshot goes to the checkpoint claim (the emulator maps it to a folder).
SCRIPT_ARGS = ["--script", IMAGE_SCRIPT, "--", *user_script.ARGS,
               "--snapshot", "/checkpoints/snapshot.pt"]  # fmt: skip
CASES = {
    # kind: (name, nodes, workers per node, the pod that logs rank 0, the pod to check, the
    # rendezvous source launch detects)
    "pytorchjob": ("us", 2, 2, "us-worker-0", "us-worker-1", "pytorchjob-workers"),
    "trainjob": ("ut", 2, 1, "ut-node-0-0", "ut-node-0-1", "trainjob"),
    "indexedjob": ("ui", 2, 1, "ui-0", "ui-1", "indexedjob"),
}


@pytest.mark.timeout(JOB_SECONDS + user_script.RUN_SECONDS + 60)
@pytest.mark.parametrize("kind", CASES)
def test_user_script_trains_like_torchrun(
    cluster_factory: Callable[..., EmulatedCluster], kind: str
) -> None:
    name, nodes, nproc, first, other, source = CASES[kind]
    cluster = cluster_factory(image_files={IMAGE_SCRIPT: user_script.SCRIPT})
    expected = user_script.torchrun_digest(nodes * nproc)
    plan = render(kind, "--name", name, "--nodes", str(nodes), "--nproc-per-node", str(nproc),
                  *SCRIPT_ARGS)  # fmt: skip
    cluster.start(plan)
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    assert f"rendezvous: {source}, nodes {nodes}, {nproc} workers/node" in cluster.logs(other)
    assert f"program: {user_script.SCRIPT}" in cluster.logs(other)
    assert user_script.digest(cluster.logs(first)) == expected, cluster.log_tails()
    assert any(cluster.volume("pvc-").glob("snapshot.pt"))  # the job's checkpoint claim


SPAWN_SCRIPT = procs.REPO / "tests" / "tutorial_scripts" / "spawn_multigpu.py"
IMAGE_SPAWN_SCRIPT = "/app/spawn_multigpu.py"


@pytest.mark.timeout(2 * JOB_SECONDS + 60)
def test_spawning_script_in_a_one_pod_pytorchjob_is_preempted_and_resumes(
    cluster_factory: Callable[..., EmulatedCluster],
) -> None:
    """An mp.spawn script (the tutorials' first style) as a one-pod PyTorchJob: launch runs it
    once and it spawns its 2 workers; a preemption (SIGTERM) ends the pod with 143, the
    operator recreates it, and the script resumes from the snapshot it wrote on the claim."""
    cluster = cluster_factory(image_files={IMAGE_SPAWN_SCRIPT: SPAWN_SCRIPT})
    plan = render("pytorchjob", "--name", "sp", "--nodes", "1", "--nproc-per-node", "2",
                  "--script", IMAGE_SPAWN_SCRIPT, "--", "8", "2", "--world-size", "2",
                  "--snapshot", "/checkpoints/snapshot.pt", "--pause", "0.2")  # fmt: skip
    cluster.start(plan)
    cluster.run_until(
        lambda: cluster.search_logs(r"Training snapshot saved"), JOB_SECONDS, "a snapshot"
    )
    cluster.preempt_pod("sp-worker-0", grace_seconds=60)
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    assert any(e.startswith("sp-worker-0: exit 143") for e in status.events), status.events
    logs = cluster.logs("sp-worker-0")
    assert "starts its own workers" in logs and "1 workers/node" in logs, cluster.log_tails()
    assert re.search(r"\[GPU[01]\] Resuming training from snapshot at Epoch [2-8]", logs), logs
    assert "done: 8 epochs on 2 workers" in logs, cluster.log_tails()
