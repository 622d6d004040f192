"""Two PyTorchJob pods as two network namespaces: `kubeddp launch` from the operator's env only.

Node `demo-master-0` and node `demo-worker-0` each run the image's entrypoint command with
exactly the env the Training Operator injects into that pod (tests/emulation/
operator_table.csv: Master 1 + Worker 1, nprocPerNode 1); names resolve through
/etc/netns/<ns>/hosts like the per-replica Services. The second test starts the worker first,
before the master's name even resolves, and the master seconds later: launch's DNS-then-TCP
wait must carry the worker until the master is up. Root only (skipped with the reason
elsewhere, a failure in CI).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import netns, procs

pytestmark = [pytest.mark.netns, pytest.mark.slow]
JOB = "demo"
MASTER, WORKER = f"{JOB}-master-0", f"{JOB}-worker-0"
KUBEDDP = str(Path(sys.executable).parent / "kubeddp")  # `ip netns exec` needs the venv's script
RUN_TIMEOUT_SECONDS = 240


def pod_env(rank: int) -> dict[str, str]:
    """The operator's env for the Master (rank 0) or Worker-0 (rank 1) pod."""
    return {
        "PYTHONUNBUFFERED": "1",
        "MASTER_ADDR": MASTER,
        "PET_MASTER_ADDR": MASTER,
        "MASTER_PORT": "23456",
        "PET_MASTER_PORT": "23456",
        "WORLD_SIZE": "2",
        "RANK": str(rank),
        "PET_NODE_RANK": str(rank),
        "PET_NPROC_PER_NODE": "1",
        "PET_NNODES": "2",
    }


def launch_argv(node: netns.Node, ckpt: Path) -> list[str]:
    settings = [
        "workload.name=regression",
        "workload.samples=512",
        "train.max_steps=8",
        "train.log_every=4",
        f"checkpoint.dir={ckpt}",  # one shared config, like the job's ConfigMap
    ]
    worker_args = [arg for s in settings for arg in ("--set", s)]
    return node.wrap([KUBEDDP, "launch", "--rdzv-wait", "120", "--", *worker_args])


def env_for(rank: int) -> dict[str, str]:
    base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    return {**base, **pod_env(rank)}


def assert_trained(master: procs.Proc, worker: procs.Proc) -> None:
    codes = (master.wait(RUN_TIMEOUT_SECONDS), worker.wait(RUN_TIMEOUT_SECONDS))
    assert codes == (0, 0), f"exit codes {codes}\n{master.tail()}\n{worker.tail()}"
    out = master.output()
    assert "rendezvous: pytorchjob, nodes 2, 1 workers/node" in out
    assert "world size 2 (gloo, cpu)" in out
    assert "done: 8 steps" in out and "[kubeddp] finished" in out


@pytest.mark.timeout(300)
def test_master_and_worker_pods_train_together(tmp_path: Path) -> None:
    with netns.cluster([MASTER, WORKER]) as (master_node, worker_node):
        ckpt = tmp_path / "ckpt"
        argv_m, argv_w = launch_argv(master_node, ckpt), launch_argv(worker_node, ckpt)
        with (
            procs.started(argv_m, tmp_path / "master.log", env_for(0)) as master,
            procs.started(argv_w, tmp_path / "worker.log", env_for(1)) as worker,
        ):
            assert_trained(master, worker)
        assert sorted(p.name for p in ckpt.glob("ckpt-*")) == ["ckpt-00000008"]


@pytest.mark.timeout(300)
def test_worker_waits_for_a_master_that_starts_later(tmp_path: Path) -> None:
    with netns.cluster([MASTER, WORKER]) as (master_node, worker_node):
        hosts = netns.NETNS_ETC / worker_node.namespace / "hosts"
        full = hosts.read_text()
        # No Service record for the master yet. Rewrite in place: `ip netns exec` bind-mounts
        # this very file over /etc/hosts, and glibc reads it again on every lookup.
        with hosts.open("r+") as f:
            f.write("".join(line for line in full.splitlines(True) if MASTER not in line))
            f.truncate()
        ckpt = tmp_path / "ckpt"
        argv_w = launch_argv(worker_node, ckpt)
        with procs.started(argv_w, tmp_path / "worker.log", env_for(1)) as w:
            w.wait_for_output(rf"waiting up to 120s for {MASTER}:23456 \(DNS name\)", 60)
            time.sleep(3)
            with hosts.open("r+") as f:
                f.write(full)
                f.truncate()
            time.sleep(3)  # the name resolves now, the port is still closed
            assert w.poll() is None, w.tail()
            argv_m = launch_argv(master_node, ckpt)
            with procs.started(argv_m, tmp_path / "master.log", env_for(0)) as master:
                assert_trained(master, w)
