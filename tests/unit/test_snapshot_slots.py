"""In-memory snapshots on one node, at unit speed: the flat layout round-trips every kind of
tensor, the newest whole slot is the one read, a slot whose bytes do not match their digest is
set aside with one line, a kill at each phase of writing leaves the previous snapshot or the
new one whole, and memory that cannot hold a snapshot is said in one line. Several ranks and
the peer broadcast: tests/integration/test_snapshot_recovery.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kubeddp.trainer.constants import ENV_TEST_KILL_AT
from kubeddp.trainer.worker.snapshot import flatten, memory
from kubeddp.trainer.worker.snapshot.restore import load, usable_here
from kubeddp.trainer.worker.snapshot.slots import SnapshotDir, SnapshotSpaceError
from kubeddp.trainer.worker.snapshot.taker import SnapshotTaker
from tests.helpers.snapshots import equal as _equal
from tests.helpers.snapshots import state as _state
from tests.helpers.snapshots import take as _take

pytestmark = pytest.mark.timeout(120)


def test_a_state_round_trips_through_the_flat_layout() -> None:
    state = _state(3)
    skeleton, tensors = flatten.split(state)
    slots, nbytes = flatten.layout(tensors)
    assert all(s.offset % flatten.ALIGN == 0 for s in slots)
    buffer = bytearray(nbytes)
    for slot, tensor in zip(slots, tensors, strict=True):
        if slot.nbytes:
            flatten.from_buffer(buffer, flatten.as_byte_slot(slot)).copy_(flatten.as_bytes(tensor))
    back = flatten.join(skeleton, [flatten.from_buffer(buffer, s).clone() for s in slots])
    assert _equal(state, back)
    with pytest.raises(ValueError, match="not a tensor type"):
        flatten.from_buffer(buffer, flatten.TensorSlot(0, 4, "load", (1,)))


def test_the_newest_whole_snapshot_is_read_and_slots_alternate(tmp_path: Path) -> None:
    logs: list[str] = []
    taker = SnapshotTaker(tmp_path, writer=True, every_steps=1, device=torch.device("cpu"),
                          log=logs.append, run={"seed": 1})  # fmt: skip
    for step in (5, 6, 7):
        _take(tmp_path, step, logs, taker)
    held = taker.directory.held()
    assert [h.step for h in held] == [7, 6] and {h.index for h in held} == {0, 1}
    found = usable_here(taker.directory, lambda run: None, logs.append)
    assert found is not None and found.step == 7
    assert _equal(load(taker.directory, found), _state(7))
    assert usable_here(taker.directory, lambda run: "another run", logs.append) is None
    assert any("not used: another run" in line for line in logs)
    taker.close()


def test_damaged_bytes_are_set_aside_in_one_line(tmp_path: Path) -> None:
    logs: list[str] = []
    _take(tmp_path, 5, logs)
    _take(tmp_path, 6, logs)
    directory = SnapshotDir(tmp_path, logs.append)
    newest = directory.held()[0]
    with open(directory.data_path(newest.index), "r+b") as f:
        f.seek(3)
        f.write(b"\xff")
    found = usable_here(directory, lambda run: None, logs.append)
    assert found is not None and found.step == 5, "the damaged one is skipped for the other"
    assert [line for line in logs if "set aside" in line] == [
        f"[kubeddp] in-memory snapshot in {tmp_path} set aside: step 6: its bytes do not "
        "match their digest"
    ]
    assert list(tmp_path.glob(f"slot-{newest.index}.meta.bad-*")), "kept for inspection"
    assert [h.step for h in directory.held()] == [5]


WRITER = textwrap.dedent(
    """
    import sys, torch
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from tests.helpers.snapshots import take as _take
    root = Path(sys.argv[1])
    for step in (10, 20):
        _take(root, step, [])
    """
)


@pytest.mark.parametrize(
    "point", ["snapshot-emptied", "snapshot-copied", "snapshot-digested", "snapshot-published"]
)
def test_a_kill_at_any_phase_leaves_the_old_or_the_new_snapshot_whole(
    tmp_path: Path, point: str
) -> None:
    env = {**__import__("os").environ, ENV_TEST_KILL_AT: f"{point}:2"}
    repo = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", WRITER, str(tmp_path), repo], env=env,
                          timeout=90, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == -9, done.stderr
    directory = SnapshotDir(tmp_path, print)
    found = usable_here(directory, lambda run: None, print)
    expected = 20 if point == "snapshot-published" else 10
    assert found is not None and found.step == expected
    assert _equal(load(directory, found), _state(expected))


def test_a_volume_too_small_is_one_line_and_snapshots_stop(tmp_path: Path) -> None:
    logs: list[str] = []
    taker = SnapshotTaker(tmp_path, writer=True, every_steps=1, device=torch.device("cpu"),
                          log=logs.append, run={})  # fmt: skip
    taker._slot = lambda nbytes: (_ for _ in ()).throw(SnapshotSpaceError("no room"))
    taker.take(1, lambda: _state(1), {}, [])  # the writer's trouble: the ranks agree next time
    taker.take(2, lambda: _state(2), {}, [])
    assert not taker.enabled and logs == ["[kubeddp] in-memory snapshots off for this run: no room"]
    assert not taker.due(3)  # no rank takes part any more: no second line, nothing written
    assert len(logs) == 1 and not list(tmp_path.glob("*.meta"))
    taker.close()


def _cgroup(root: Path, limit: str, current: int, file: int, shmem: int) -> Path:
    (root / "memory.max").write_text(limit + "\n")
    (root / "memory.current").write_text(f"{current}\n")
    (root / "memory.stat").write_text(f"anon 1\nfile {file}\nshmem {shmem}\n")
    return root


def test_the_memory_limit_decides_before_a_byte_is_written(tmp_path: Path) -> None:
    mib = 1 << 20
    no_limit = _cgroup(tmp_path, "max", 900 * mib, 0, 0)
    assert memory.cgroup_headroom(no_limit) is None
    assert memory.space_problem(tmp_path, 10 * mib, no_limit) is None
    # 1 GiB limit, 900 MiB used of which 500 MiB page cache (200 of it tmpfs): 700 MiB usable
    tight = _cgroup(tmp_path, str(1024 * mib), 900 * mib, 500 * mib, 200 * mib)
    assert memory.cgroup_headroom(tight) == (424 * mib, 1024 * mib)
    assert memory.space_problem(tmp_path, 200 * mib, tight) is None
    problem = memory.space_problem(tmp_path, 400 * mib, tight)
    assert problem is not None and "memory limit (1024 MiB) leaves 424 MiB" in problem
    assert "\n" not in problem


def test_a_full_tmpfs_is_a_space_error_not_a_bus_error(tmp_path: Path) -> None:
    mount = tmp_path / "shm"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                      capture_output=True).returncode:  # fmt: skip
        pytest.skip("cannot mount a tmpfs here (needs root)")
    directory = SnapshotDir(mount / "snap", print)
    try:
        with pytest.raises(SnapshotSpaceError, match="cannot hold 4.0 MiB"):
            directory.begin(4 << 20, None)
        assert "has 1 MiB free" in (memory.space_problem(mount, 4 << 20) or "")
    finally:
        directory.close()  # its maps hold the mount busy
        subprocess.run(["umount", "--lazy", str(mount)], check=False)
