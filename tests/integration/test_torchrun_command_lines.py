"""The torchrun command lines the tutorials teach, with `torchrun` replaced by `kubeddp train`,
run real workers (gloo, 2 processes) of a tutorial-style script: both spellings of the flags,
the positional form (`train.py ARGS`, `-m module ARGS`), --standalone, and two nodes on
loopback. Without an address, --nnodes 2 says why in one line."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from kubeddp.trainer import exit_codes
from tests.helpers import procs

SCRIPT = Path(__file__).with_name("tutorial_torchrun_train.py")
MODULE = "tests.integration.tutorial_torchrun_train"
LINE = re.compile(r"tutorial rank (\d)/(\d) local (\d) steps (\d+) same (True|False)")
RUN_SECONDS = 420  # generous: a shared 2-core CI machine runs this under heavy load

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ranks(output: str) -> dict[int, tuple]:
    found = {int(r): (int(w), int(local), int(steps), same) for r, w, local, steps, same in
             LINE.findall(output)}  # fmt: skip
    assert found, output[-3000:]
    return found


def train(tmp_path: Path, *args: str) -> procs.Finished:
    done = procs.run(
        procs.kubeddp_argv("train", *args), tmp_path / "train.log", RUN_SECONDS, cwd=procs.REPO
    )
    assert done.code == 0, done.output[-3000:]
    return done


COMMAND_LINES = {
    # 001: torchrun --standalone --nproc_per_node=2 script.py 50 10
    "standalone": ["--standalone", "--nproc_per_node=2", str(SCRIPT), "2", "1"],
    # 000: --nproc_per_node=N --nnodes=1 --node_rank=0 --master_addr="localhost" --master_port=P
    "static one node": [
        "--nproc_per_node=2", "--nnodes=1", "--node_rank=0", "--master_addr=localhost",
        "--master_port={port}", str(SCRIPT), "2", "1", "--batch_size", "4",
    ],
    # 003: the dashed spellings, one value per word
    "dashed": ["--nproc-per-node", "2", "--max-restarts", "0", str(SCRIPT), "1", "1"],
    # torchrun -m module args
    "module": ["--nproc_per_node", "2", "-m", MODULE, "2", "1"],
}  # fmt: skip


@pytest.mark.parametrize("case", COMMAND_LINES)
def test_tutorial_command_line_runs(case: str, tmp_path: Path) -> None:
    port = str(free_port())
    argv = [arg.replace("{port}", port) for arg in COMMAND_LINES[case]]
    done = train(tmp_path, *argv)
    found = ranks(done.output)
    assert sorted(found) == [0, 1]
    assert all(world == 2 and same == "True" for world, _, _, same in found.values())
    assert sorted(local for _, local, _, _ in found.values()) == [0, 1]


def test_two_nodes_on_loopback(tmp_path: Path) -> None:
    """001's multinode line, one process per node, node rank 0 the master (127.0.0.1)."""
    port = str(free_port())
    common = ["--nproc_per_node=1", "--nnodes=2", "--master_addr=127.0.0.1"]
    common.append(f"--master_port={port}")
    argv = {
        rank: procs.kubeddp_argv("train", *common, f"--node_rank={rank}", str(SCRIPT), "2", "1")
        for rank in (0, 1)
    }
    with (
        procs.started(argv[0], tmp_path / "node0.log", cwd=procs.REPO) as node0,
        procs.started(argv[1], tmp_path / "node1.log", cwd=procs.REPO) as node1,
    ):
        assert node0.wait(RUN_SECONDS) == 0, node0.output()[-3000:]
        assert node1.wait(RUN_SECONDS) == 0, node1.output()[-3000:]
        found = {**ranks(node0.output()), **ranks(node1.output())}
    assert sorted(found) == [0, 1]
    assert all(world == 2 and same == "True" for world, _, _, same in found.values())


def test_two_nodes_without_an_address_say_why(tmp_path: Path) -> None:
    done = procs.run(
        procs.kubeddp_argv("train", "--nproc_per_node=1", "--nnode=2", "--node_rank=0",
                           str(SCRIPT), "2", "1"),
        tmp_path / "train.log", 60, cwd=procs.REPO,
    )  # fmt: skip
    assert done.code == exit_codes.BAD_INPUT
    lines = done.output.strip().splitlines()
    assert len(lines) == 1 and "needs the rendezvous host: --master-addr" in lines[0], lines
