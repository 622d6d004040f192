"""Two hosts without Kubernetes, as torchrun runs them: `kubeddp train --nnodes 2 --node-rank R
--master-addr HOST` (and the elastic `--nnodes MIN:MAX --rdzv-endpoint HOST:PORT`), one network
namespace per host, nothing in the environment.

The user script ends with the same parameters as a direct 2-worker `torchrun` run; the
built-in trainer trains through the elastic form. Node 1 starts first: launch's DNS+port wait
carries it until node 0's rendezvous is up.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import netns, procs, user_script

pytestmark = [pytest.mark.netns, pytest.mark.slow]
HOSTS = ["gpu-host-0", "gpu-host-1"]
KUBEDDP = str(Path(sys.executable).parent / "kubeddp")  # `ip netns exec` needs the venv's script
RUN_SECONDS = 240


def host_env() -> dict[str, str]:
    """A bare host: no launcher variables at all."""
    base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    return {**base, "PYTHONPATH": str(procs.REPO), "PYTHONUNBUFFERED": "1"}


def run_on_both(nodes: list[netns.Node], argv_for, tmp_path: Path) -> list[procs.Proc]:
    """Start node 1 first, node 0 a little later; wait for both; their processes."""
    with procs.started(nodes[1].wrap(argv_for(1)), tmp_path / "host1.log", host_env()) as one:
        time.sleep(2)
        with procs.started(nodes[0].wrap(argv_for(0)), tmp_path / "host0.log", host_env()) as zero:
            codes = (zero.wait(RUN_SECONDS), one.wait(RUN_SECONDS))
            assert codes == (0, 0), f"exit codes {codes}\n{zero.tail()}\n{one.tail()}"
            return [zero, one]


@pytest.mark.timeout(RUN_SECONDS + user_script.RUN_SECONDS + 60)
def test_static_flags_run_the_user_script_like_torchrun(tmp_path: Path) -> None:
    expected = user_script.torchrun_digest(2)

    def argv(rank: int) -> list[str]:
        return [
            KUBEDDP, "train", "--nproc", "1", "--nnodes", "2", "--node-rank", str(rank),
            "--master-addr", HOSTS[0], "--master-port", "29512", "--set", "metrics.port=0",
            "--script", str(user_script.SCRIPT), "--", *user_script.ARGS,
            "--snapshot", str(tmp_path / f"snapshot-{rank}.pt"),
        ]  # fmt: skip

    with netns.cluster(HOSTS) as nodes:
        zero, one = run_on_both(nodes, argv, tmp_path)
    assert "rendezvous: flags, nodes 2, 1 workers/node" in one.output()
    assert user_script.digest(zero.output()) == expected


@pytest.mark.timeout(RUN_SECONDS + 60)
def test_elastic_flags_run_the_built_in_trainer(tmp_path: Path) -> None:
    def argv(rank: int) -> list[str]:
        return [
            KUBEDDP, "train", "--nproc", "1", "--nnodes", "1:2",
            "--rdzv-endpoint", f"{HOSTS[0]}:29513", "--rdzv-id", "bare",
            "--set", "metrics.port=0", "--set", "workload.name=regression",
            "--set", "workload.samples=512", "--set", "train.max_steps=6",
            "--set", f"checkpoint.dir={tmp_path / 'ckpt'}",
        ]  # fmt: skip

    with netns.cluster(HOSTS) as nodes:
        zero, one = run_on_both(nodes, argv, tmp_path)
    for host in (zero, one):
        assert "rendezvous: flags, nodes 1:2, 1 workers/node" in host.output()
    assert "world size 2 (gloo" in zero.output() + one.output()
    assert "done: 6 steps" in zero.output() + one.output()
