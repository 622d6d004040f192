"""A program that starts its own workers (mp.spawn, as the tutorials teach first) under
`kubeddp train`, real processes: launch runs it once (even with --nproc 2, the count that made
two copies clash on one port before), its 2 spawned gloo workers train; SIGTERM to launch ends
it with 143, leaving the snapshot the script wrote itself, and a rerun resumes from it. On 2
nodes it is refused in one line, before anything starts."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from kubeddp.trainer import exit_codes
from tests.helpers import procs
from tests.helpers.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SCRIPT = procs.REPO / "tests" / "tutorial_scripts" / "spawn_multigpu.py"
EPOCHS = 8  # a snapshot every 2 epochs


def spawn_argv(snapshot: Path, *extra: str) -> list[str]:
    return procs.kubeddp_argv(
        "train", "--nproc", "2", "--set", "metrics.port=0", *extra, "--script", str(SCRIPT),
        "--", str(EPOCHS), "2", "--world-size", "2", "--snapshot", str(snapshot),
    )  # fmt: skip


def test_spawning_script_trains_is_preempted_and_resumes(tmp_path: Path) -> None:
    snapshot = tmp_path / "snapshot.pt"
    with procs.started([*spawn_argv(snapshot), "--pause", "0.2"], tmp_path / "first.log") as run:
        run.wait_for_output(r"Training snapshot saved", 120)
        run.send_signal(signal.SIGTERM)  # as the kubelet would: the launch process only
        code = run.wait(90)
        # The SIGTERM reached the spawned workers too (the runner's process group).
        procs.wait_until(lambda: not procs.tagged_pids(run.tag), 20, "no process left", run)
    out = run.output()
    assert code == exit_codes.PREEMPTED, run.tail()
    assert "starts its own workers" in out and "1 workers/node" in out, run.tail()
    assert {"[GPU0] Epoch 0", "[GPU1] Epoch 0"} <= set(re.findall(r"\[GPU\d\] Epoch 0", out))
    assert "done:" not in out and snapshot.exists(), run.tail()

    rerun = procs.run(spawn_argv(snapshot), tmp_path / "rerun.log", 180)
    assert rerun.code == 0, rerun.output[-3000:]
    resumed = re.findall(
        r"\[GPU(\d)\] Resuming training from snapshot at Epoch (\d+)", rerun.output
    )
    assert sorted(rank for rank, _ in resumed) == ["0", "1"], rerun.output[-3000:]
    assert all(int(epoch) >= 2 for _, epoch in resumed)
    assert f"done: {EPOCHS} epochs on 2 workers" in rerun.output


def test_spawning_script_on_two_nodes_is_refused_in_one_line(tmp_path: Path) -> None:
    done = procs.run_split(
        procs.kubeddp_argv(
            "train", "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
            "--script", str(SCRIPT), "--", "2", "1",
        ),
        tmp_path,
        60,
    )  # fmt: skip
    assert done.code == exit_codes.BAD_INPUT
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "starts its own workers" in lines[0], done.stderr
    assert "torchrun style" in lines[0] and "one node" in lines[0]


def test_flag_turns_detection_off(tmp_path: Path) -> None:
    """--no-spawns-workers: the user says the program does not spawn; launch plans N workers."""
    done = procs.run_split(
        procs.kubeddp_argv(
            "train", "--nproc", "2", "--dry-run", "--no-spawns-workers", "--script", str(SCRIPT)
        ),
        tmp_path,
        60,
    )
    assert done.code == 0, done.stderr
    assert '"nproc_per_node": 2' in done.stdout


HIDDEN_SPAWN = """\
import datetime, os
import torch.distributed as dist
import torch.multiprocessing as mp

def main(rank, world):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", "{port}"
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=5))
    dist.destroy_process_group()

if __name__ == "__main__":
    getattr(mp, "sp" + "awn")(main, args=(2,), nprocs=2)  # no reading can tell
"""


def test_a_spawn_reading_cannot_see_is_named_when_it_happens(tmp_path: Path) -> None:
    """Run as one of 2 workers, each copy spawns 2 of its own on one port: the run fails, and
    one line ahead of the failures names the cause (it ended in gloo tracebacks alone)."""
    script = tmp_path / "hidden_spawn.py"
    script.write_text(HIDDEN_SPAWN.replace("{port}", str(free_port())))
    done = procs.run(procs.kubeddp_argv("train", "--nproc", "2", "--script", str(script)),
                     tmp_path / "train.log", 180)  # fmt: skip
    named = [line for line in done.output.splitlines()
             if "starts a process before it calls init_process_group" in line]  # fmt: skip
    assert len(named) == 1 and "--spawns-workers" in named[0], done.output[-3000:]
    assert "one of 2 workers" in named[0]
