"""The torchrun command lines the tutorials teach, with `torchrun` replaced by `kubeddp train`,
run real workers (gloo, 2 processes) of a tutorial-style script: both spellings of the flags,
the positional form (`train.py ARGS`, `-m module ARGS`), --standalone, and two nodes on
loopback; `--script PATH` ends kubeddp's options as torchrun's program word does. Without an
address, --nnodes 2 says why in one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kubeddp.trainer import exit_codes
from tests.helpers import procs
from tests.helpers.ports import free_port

SCRIPT = Path(__file__).with_name("tutorial_torchrun_train.py")
MODULE = "tests.integration.tutorial_torchrun_train"
LINE = re.compile(r"tutorial rank (\d)/(\d) local (\d) steps (\d+) same (True|False)")
RUN_SECONDS = 420  # generous: a shared 2-core CI machine runs this under heavy load

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


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


PROBE = """\
import sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
# one write per line: unbuffered ranks printing at once would interleave message and newline
sys.stdout.write(f"probe rank {dist.get_rank()} sum {total.item():g} args {sys.argv[1:]}\\n")
dist.destroy_process_group()
"""


def test_a_pasted_torchrun_line_with_every_kind_of_option(tmp_path: Path) -> None:
    """torchrun's logging and agent flags with torchrun's meaning; the program's own
    `--log 5 --nproc 4` are its own; a `--` right after the program is the separator; nothing
    warns."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    logs = tmp_path / "logs"
    done = train(
        tmp_path, "--nproc_per_node=2", "--tee", "3", "--log-dir", str(logs),
        "--local-ranks-filter", "1", "--role", "probe", "--monitor-interval", "0.2",
        "--rdzv-conf", "join_timeout=120", "--start-method", "spawn", "--run-path",
        str(probe), "--", "--log", "5", "--nproc", "4",
    )  # fmt: skip
    shown = re.findall(r"^\[probe(\d)\]:probe rank (\d) sum 2 args (.*)$", done.output, re.M)
    assert shown == [("1", "1", "['--log', '5', '--nproc', '4']")], done.output[-3000:]
    teed = sorted(p.relative_to(logs).parts[-2:] for p in logs.rglob("stdout.log"))
    assert teed == [("0", "stdout.log"), ("1", "stdout.log")], teed
    zero = next(logs.rglob("0/stdout.log")).read_text()
    assert "probe rank 0 sum 2 args ['--log', '5', '--nproc', '4']" in zero
    assert "Warning" not in done.output, done.output[-3000:]


def test_everything_after_the_script_is_the_scripts(tmp_path: Path) -> None:
    """The program ends kubeddp's options, as with torchrun: `--nproc 2 --script probe.py 4 2
    --nproc 1 --log-dir DIR` starts 2 workers, and each gets every word after the script (the
    --nproc and --log-dir too: no log directory is made)."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    logs = tmp_path / "tb"
    done = train(tmp_path, "--nproc", "2", "--script", str(probe), "4", "2", "--nproc", "1",
                 "--log-dir", str(logs))  # fmt: skip
    shown = sorted(re.findall(r"^probe rank (\d) sum (\d) args (.*)$", done.output, re.M))
    args = str(["4", "2", "--nproc", "1", "--log-dir", str(logs)])
    assert shown == [("0", "2", args), ("1", "2", args)], done.output[-3000:]
    assert not logs.exists()


def test_no_python_runs_the_program_as_it_is(tmp_path: Path) -> None:
    program = tmp_path / "run.sh"
    program.write_text('#!/bin/sh\necho "sh rank $RANK of $WORLD_SIZE: $*"\n')
    program.chmod(0o755)
    done = train(tmp_path, "--nproc_per_node=2", "--no-python", str(program), "a", "${local_rank}")
    found = sorted(re.findall(r"^sh rank (\d) of 2: a (\d)$", done.output, re.M))
    assert found == [("0", "0"), ("1", "1")], done.output[-3000:]


def test_errors_carry_the_train_command_name(tmp_path: Path) -> None:
    done = procs.run(
        procs.kubeddp_argv("train", "--no-python", str(tmp_path / "missing.sh")),
        tmp_path / "train.log", 60, cwd=procs.REPO,
    )  # fmt: skip
    assert done.code == exit_codes.BAD_INPUT
    lines = done.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kubeddp train: error: "), lines
