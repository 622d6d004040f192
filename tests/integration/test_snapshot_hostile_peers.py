"""The peer broadcast as an adversary would try it, with two real gloo processes, each a "pod"
with its own snapshot directory (docs/ci-and-testing.md, round five): pods that hold the same
step with different bytes agree on one; a pod whose directory belongs to another user, or whose
memory cannot hold the newest snapshot, turns snapshots off for the run on every rank (one line)
and leaves no half slot; a pod that cannot take a snapshot stops them on every rank at the same
step, so no rank waits in a collective for it. Single-directory rows:
tests/unit/test_snapshot_hostile.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kubeddp.trainer.worker.snapshot.taker import SnapshotTaker
from tests.helpers.ports import free_port
from tests.helpers.snapshots import state as _state
from tests.helpers.snapshots import take as _take

pytestmark = [pytest.mark.timeout(240)]
REPO = Path(__file__).resolve().parents[2]
BIG = 600_000  # float32s: 2.3 MiB, more than the 1 MiB tmpfs below

POD = textwrap.dedent(
    """
    import json, sys
    from datetime import timedelta
    from pathlib import Path
    import torch, torch.distributed as dist
    sys.path.insert(0, sys.argv[3])
    from tests.helpers.snapshots import equal as _equal, state as _state
    from kubeddp.trainer.worker.snapshot.taker import SnapshotTaker
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, row = dist.get_rank(), sys.argv[2]
    logs = []
    taker = SnapshotTaker(Path(sys.argv[1]) / f"pod-{rank}", writer=True, every_steps=1,
                          device=torch.device("cpu"), log=logs.append, run={"seed": 1})
    restored = taker.restore(None, lambda run: None)
    taken = []
    if row == "take":
        for step in range(1, 5):
            if taker.due(step) or step == 1:
                taker.take(step, lambda: {"w": torch.zeros(BIG)}, {}, [])
                taken.append(step)
    taker.close()
    state = restored.state if restored else None
    print(json.dumps({"rank": rank, "step": restored.step if restored else None,
                      "key": list(taker.newest.key) if taker.newest else None,
                      "is6": _equal(state, _state(6)) if state else None,
                      "is7": _equal(state, _state(7)) if state else None,
                      "logs": logs, "enabled": taker.enabled, "taken": taken}), flush=True)
    # both end together, and as a worker does (kubeddp.trainer.worker.leave): torch's C++
    # teardown at the interpreter's exit may abort ("terminate called without an active
    # exception", once in CI)
    dist.barrier()
    from kubeddp.trainer.worker.leave import leave
    leave(0)
    """
).replace("BIG", str(BIG))


def _pods(work: Path, row: str) -> list[dict]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": "2", "PYTHONPATH": str(REPO)}  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", POD, str(work), row, str(REPO)],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in (0, 1)
    ]
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait(30)
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def _tmpfs(path: Path) -> None:
    path.mkdir(mode=0o700)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(path)],
                      capture_output=True).returncode:  # fmt: skip
        pytest.skip("cannot mount a tmpfs here (needs root)")


def test_pods_holding_one_step_with_other_bytes_agree_on_one(tmp_path: Path) -> None:
    _take(tmp_path / "pod-0", 5, [])
    _take(tmp_path / "pod-0", 6, [])
    other = SnapshotTaker(tmp_path / "pod-1", writer=True, every_steps=1,
                          device=torch.device("cpu"), log=print, run={"seed": 1})  # fmt: skip
    other.take(6, lambda: _state(7), {}, [])  # step 6, other bytes (a rank that diverged)
    other.close()
    pods = _pods(tmp_path, "restore")
    assert [p["step"] for p in pods] == [6, 6] and pods[0]["key"] == pods[1]["key"]
    assert pods[0]["is6"] == pods[1]["is6"] and pods[0]["is7"] == pods[1]["is7"]
    assert pods[0]["is6"] != pods[0]["is7"], "one of the two, whole, on both"


def test_a_pod_whose_directory_is_another_users_turns_them_off_everywhere(tmp_path: Path) -> None:
    _take(tmp_path / "pod-0", 6, [])
    foreign = tmp_path / "pod-1"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 65534, 65534)
    pods = _pods(tmp_path, "restore")
    assert [p["step"] for p in pods] == [None, None] and not any(p["enabled"] for p in pods)
    for pod in pods:
        assert len(pod["logs"]) == 1 and "belongs to uid 65534" in pod["logs"][0], pod
    assert list(foreign.iterdir()) == [], "nothing sent into it"


def test_a_pod_too_small_for_the_newest_snapshot_receives_no_half_of_it(tmp_path: Path) -> None:
    big = SnapshotTaker(tmp_path / "pod-0", writer=True, every_steps=1,
                        device=torch.device("cpu"), log=print, run={"seed": 1})  # fmt: skip
    big.take(9, lambda: {"w": torch.ones(BIG)}, {}, [])
    big.close()
    _tmpfs(tmp_path / "pod-1")
    try:
        pods = _pods(tmp_path, "restore")
        left = sorted(p.name for p in (tmp_path / "pod-1").iterdir())
    finally:
        subprocess.run(["umount", str(tmp_path / "pod-1")], check=False)
    assert [p["step"] for p in pods] == [None, None] and not any(p["enabled"] for p in pods)
    assert all(len(p["logs"]) == 1 and "has 1 MiB free for a snapshot of 2 MiB" in p["logs"][0]
               for p in pods), pods  # fmt: skip
    assert left == [".lock"], "no slot, whole or half"


def test_a_pod_that_cannot_take_one_stops_them_on_every_rank_at_once(tmp_path: Path) -> None:
    _tmpfs(tmp_path / "pod-1")
    try:
        pods = _pods(tmp_path, "take")  # before: rank 0 waited in the next gather, alone
    finally:
        subprocess.run(["umount", str(tmp_path / "pod-1")], check=False)
    assert pods[0]["taken"] == pods[1]["taken"] == [1, 2], "both stop at the same step"
    assert not any(p["enabled"] for p in pods)
    for pod in pods:
        assert len(pod["logs"]) == 1 and "in-memory snapshots off for this run" in pod["logs"][0]
        assert "has 1 MiB free and a snapshot takes 2 MiB" in pod["logs"][0], pod
