"""The in-memory snapshots as an adversary or a careless user would try them (docs/ci-and-
testing.md, round five): a shared /dev/shm where another local user made the directory first,
linked it elsewhere or left it open; slot files that are not what kubeddp wrote; settings of the
wrong type; kubeddp.api.register_state misused; two runs on one directory. Each row is a real
directory, file or process; the answer is one line and snapshots off (training goes on), or the
slot set aside and the next source used: never a write through a link, a read of another
user's files, a traceback or a wrong state. Several ranks (the peer broadcast):
tests/integration/test_snapshot_hostile_peers.py."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from kubeddp.trainer.config import ConfigError, load_config
from kubeddp.trainer.process_contract import remove_snapshot_dir_if_free as remove_if_free
from kubeddp.trainer.process_contract import take_snapshot_lock as take_lock
from kubeddp.trainer.worker import program_state
from kubeddp.trainer.worker.snapshot.restore import load, usable_here
from kubeddp.trainer.worker.snapshot.slots import SnapshotDir
from kubeddp.trainer.worker.snapshot.taker import SnapshotTaker
from tests.helpers.snapshots import equal as _equal
from tests.helpers.snapshots import state as _state
from tests.helpers.snapshots import take as _take

pytestmark = pytest.mark.timeout(120)
OTHER_UID = 65534  # nobody: "another local user"
OFF = "[kubeddp] in-memory snapshots off for this run: "


def _writer(root: Path, logs: list[str], run: dict | None = None) -> SnapshotTaker:
    return SnapshotTaker(root, writer=True, every_steps=1, device=torch.device("cpu"),
                         log=logs.append, run=run if run is not None else {"seed": 1})  # fmt: skip


def _two_takes(root: Path) -> list[str]:
    """What a run's writer says over two snapshot steps in `root` (the second is where the
    ranks agree on a trouble the first found)."""
    logs: list[str] = []
    taker = _writer(root, logs)
    for step in (1, 2):
        if taker.due(step) or step == 1:
            taker.take(step, lambda s=step: _state(s), {}, [])
    taker.close()
    return logs


def _tree(path: Path) -> dict[str, bytes]:
    """Every file under `path` (not following links) and its bytes: what must not change."""
    out = {}
    for dirpath, _, files in os.walk(path):
        for name in files:
            full = Path(dirpath, name)
            out[str(full)] = b"link" if full.is_symlink() else full.read_bytes()
    return out


# ---- 1. a shared /dev/shm ---------------------------------------------------------------
def _planted_foreign(tmp: Path) -> tuple[Path, Path]:
    root = tmp / "snap"
    _take(root, 7, [])  # a whole snapshot, then given to another user (a planted one)
    for path in [root, *root.iterdir()]:
        os.chown(path, OTHER_UID, OTHER_UID)
    return root, root


def _planted_link(tmp: Path) -> tuple[Path, Path]:
    target = tmp / "victim"
    target.mkdir(mode=0o700)
    (target / "notes.txt").write_text("the other user's file\n")
    (tmp / "snap").symlink_to(target)
    return tmp / "snap", target


def _dangling_link(tmp: Path) -> tuple[Path, Path]:
    (tmp / "snap").symlink_to(tmp / "elsewhere")
    return tmp / "snap", tmp


def _mode(mode: int) -> Callable[[Path], tuple[Path, Path]]:
    def plant(tmp: Path) -> tuple[Path, Path]:
        root = tmp / "snap"
        _take(root, 7, [])
        os.chmod(root, mode)
        return root, root

    return plant


def _a_file(tmp: Path) -> tuple[Path, Path]:
    (tmp / "snap").write_text("not a directory\n")
    return tmp / "snap", tmp


def _under_a_file(tmp: Path) -> tuple[Path, Path]:
    (tmp / "file").write_text("x")
    return tmp / "file" / "snap", tmp


def _relative(tmp: Path) -> tuple[Path, Path]:
    return Path("relative/snap"), tmp


DIRECTORY_ROWS = {
    "made first by another user, holding slots": (_planted_foreign, "belongs to uid 65534"),
    "a link to another directory": (_planted_link, "is a symbolic link"),
    "a link to nowhere": (_dangling_link, "is a symbolic link"),
    "ours, open to all (0777)": (_mode(0o777), "open to other users (mode 777)"),
    "ours, sticky and open to all (1777)": (_mode(0o1777), "open to other users (mode 1777)"),
    "ours, group may read (0750)": (_mode(0o750), "open to other users (mode 750)"),
    "ours, others may enter (0701)": (_mode(0o701), "open to other users (mode 701)"),
    "a file at its name": (_a_file, "is not a directory"),
    "under a file (cannot be made)": (_under_a_file, "(Not a directory)"),
    "a relative KUBEDDP_SNAPSHOT_DIR": (_relative, "is not an absolute path"),
}


@pytest.mark.parametrize("row", DIRECTORY_ROWS)
def test_a_directory_another_user_could_touch_is_never_used(tmp_path: Path, row: str) -> None:
    plant, says = DIRECTORY_ROWS[row]
    root, watched = plant(tmp_path)
    before = _tree(watched)
    logs = _two_takes(root)
    assert len(logs) == 1 and logs[0].startswith(OFF) and says in logs[0], logs
    assert "\n" not in logs[0]
    assert _tree(watched) == before, "nothing written, renamed or removed there"
    reader = SnapshotDir(root, print)
    assert reader.held() == [], "nothing read from it either"
    assert not remove_if_free(root) and _tree(watched) == before, "nor removed by launch"


def test_missing_parents_are_made_and_the_directory_is_private(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "snap"
    assert not [line for line in _two_takes(root) if line.startswith(OFF)]
    assert (root.stat().st_mode & 0o777) == 0o700
    assert [h.step for h in SnapshotDir(root, print).held()] == [2, 1]


def _link_meta(root: Path, outside: Path) -> None:
    os.replace(root / "slot-0.meta", outside)
    (root / "slot-0.meta").symlink_to(outside)


def _link_data(root: Path, outside: Path) -> None:
    os.replace(root / "slot-0.data", outside)
    (root / "slot-0.data").symlink_to(outside)


@pytest.mark.parametrize("plant", [_link_meta, _link_data], ids=["meta", "data"])
def test_a_slot_file_that_is_a_link_is_set_aside_not_followed(tmp_path: Path, plant) -> None:
    root, outside = tmp_path / "snap", tmp_path / "outside"
    _take(root, 5, [])
    _take(root, 6, [])  # slot 1: step 6; slot 0: step 5, replaced by a link below
    _take(root, 7, [])  # slot 0 again: step 7
    plant(root, outside)
    kept = outside.read_bytes()
    logs: list[str] = []
    found = usable_here(SnapshotDir(root, logs.append), lambda run: None, logs.append)
    assert found is not None and found.step == 6, "the other slot is used"
    assert len(logs) == 1 and "set aside" in logs[0] and "meta cannot be read" in logs[0]
    assert outside.read_bytes() == kept
    logs.clear()
    taker = _writer(root, logs)  # the next snapshot goes where the link was: a file, not it
    taker.take(8, lambda: _state(8), {}, [])
    taker.close()
    assert outside.read_bytes() == kept and not (root / "slot-0.data").is_symlink()


# ---- 2. slot content that is not what kubeddp wrote ---------------------------------------
def _meta_rewrite(change: Callable[[dict], object]) -> Callable[[Path], None]:
    def plant(meta: Path) -> None:
        record = torch.load(io.BytesIO(meta.read_bytes()), weights_only=True)
        buffer = io.BytesIO()
        torch.save(change(record), buffer)
        meta.write_bytes(buffer.getvalue())

    return plant


def _edit(**fields: object) -> Callable[[Path], None]:
    return _meta_rewrite(lambda record: {**record, **fields})


def _slots(fn: Callable[[list], list]) -> Callable[[Path], None]:
    return _meta_rewrite(lambda record: {**record, "slots": fn(record["slots"])})


def _bytes(data: bytes) -> Callable[[Path], None]:
    return lambda meta: meta.write_bytes(data)


class Foreign:  # a pickled object: never unpickled by a snapshot reader
    pass


def _pickled(meta: Path) -> None:
    buffer = io.BytesIO()
    torch.save({"format": "kubeddp-snapshot-v1", "x": Foreign()}, buffer)
    meta.write_bytes(buffer.getvalue())


def _data(fn: Callable[[Path], None]) -> Callable[[Path], None]:
    return lambda meta: fn(meta.with_suffix(".data"))


def _flip_byte(data: Path) -> None:
    with open(data, "r+b") as f:
        f.seek(65)
        byte = f.read(1)
        f.seek(65)
        f.write(bytes([byte[0] ^ 1]))


CONTENT_ROWS = {
    "empty meta": (_bytes(b""), "meta cannot be read"),
    "garbage meta": (_bytes(os.urandom(512)), "meta cannot be read"),
    "a tensor, not a record": (_meta_rewrite(lambda r: torch.zeros(3)), "not a kubeddp snapshot"),
    "another format": (_edit(format="someone-else-v9"), "not a kubeddp snapshot"),
    "a pickled object": (_pickled, "meta cannot be read"),
    "sizes beyond the data": (_edit(nbytes=1 << 30), "shorter than its meta says"),
    "huge size": (_edit(nbytes=1 << 62), "is not a count"),
    "negative size": (_edit(nbytes=-1), "is not a count"),
    "step as text": (_edit(step="7"), "is not a count"),
    "negative step": (_edit(step=-3), "is not a count"),
    "step as bool": (_edit(step=True), "is not a count"),
    "no run record": (_edit(run=None), "layout is not kubeddp's"),
    "negative offset": (_slots(lambda s: [(-64, *s[0][1:]), *s[1:]]), "is not a count"),
    "offset past the end": (_slots(lambda s: [(1 << 40, *s[0][1:]), *s[1:]]), "runs past"),
    "size unlike its shape": (_slots(lambda s: [(s[0][0], 4, *s[0][2:]), *s[1:]]), "gives 4"),
    "unknown tensor type": (_slots(lambda s: [(*s[0][:2], "load", s[0][3]), *s[1:]]), "type"),
    "a type that is not a dtype": (
        _slots(lambda s: [(*s[0][:2], "Tensor", s[0][3]), *s[1:]]),
        "names no tensor type",
    ),  # fmt: skip
    "negative dimension": (_slots(lambda s: [(*s[0][:3], [-4, -3]), *s[1:]]), "not a count"),
    "a layout entry of 3": (_slots(lambda s: [s[0][:3], *s[1:]]), "layout is not kubeddp's"),
    "a layout that is text": (_edit(slots="0,48,float32"), "layout is not kubeddp's"),
    "a placeholder past the tensors": (
        _meta_rewrite(
            lambda r: {**r, "skeleton": {**r["skeleton"], "w": ("__kubeddp_tensor__", 99)}}
        ),
        "skeleton does not name its tensors",
    ),  # fmt: skip
    "a placeholder with a text index": (
        _meta_rewrite(
            lambda r: {**r, "skeleton": {**r["skeleton"], "empty": ("__kubeddp_tensor__", "4")}}
        ),
        "skeleton does not name its tensors",
    ),  # fmt: skip
    "a skeleton that is a number": (_edit(skeleton=5), "skeleton does not name its tensors"),
    "digest as bytes": (_edit(digest=b"00"), "digest is not kubeddp's"),
    "data changed after the meta": (_data(_flip_byte), "do not match their digest"),
    "data file emptied": (_data(lambda d: d.write_bytes(b"")), "shorter than its meta says"),
    "data file removed": (_data(os.unlink), "FileNotFoundError"),
    "data file a directory": (_data(lambda d: (d.unlink(), d.mkdir())), "Is a directory"),
}


@pytest.mark.parametrize("row", CONTENT_ROWS)
def test_a_slot_that_is_not_what_kubeddp_wrote_is_set_aside(tmp_path: Path, row: str) -> None:
    plant, says = CONTENT_ROWS[row]
    root = tmp_path / "snap"
    for step in (5, 6):
        _take(root, step, [])
    newest = SnapshotDir(root, print).held()[0]
    plant(root / f"slot-{newest.index}.meta")
    logs: list[str] = []
    directory = SnapshotDir(root, logs.append)
    found = usable_here(directory, lambda run: None, logs.append)
    assert found is not None and found.step == 5, "the other slot is the next source"
    assert len(logs) == 1 and "set aside" in logs[0] and says in logs[0], logs
    assert "\n" not in logs[0]
    assert _equal(load(directory, found), _state(5))
    assert [h.step for h in SnapshotDir(root, print).held()] == [5], "never read again"


def test_both_slots_foreign_means_no_snapshot_not_a_crash(tmp_path: Path) -> None:
    root = tmp_path / "snap"
    for step in (5, 6):
        _take(root, step, [])
    for index in (0, 1):
        (root / f"slot-{index}.meta").write_bytes(b"\x80\x02}q\x00.")  # a bare pickle
    logs: list[str] = []
    assert usable_here(SnapshotDir(root, logs.append), lambda run: None, logs.append) is None
    assert len(logs) == 2 and all("set aside" in line for line in logs)


# ---- 3. settings ---------------------------------------------------------------------------
SETTING_ROWS = {
    "checkpoint.memory_every_steps=-1": "must be >= 0",
    "checkpoint.memory_every_steps=99999999999999": "must be >= 0 and <= 2147483647",
    "checkpoint.memory_every_steps=abc": "must be int, got str",
    "checkpoint.memory_every_steps=1.5": "must be int, got float",
    "checkpoint.memory_every_steps=auto": "must be int, got str",
    "checkpoint.memory_every_steps=true": "must be int, got bool",
    "checkpoint.every_seconds=-1": "must be >= 0",
    "checkpoint.every_seconds=x": "must be float, got str",
    "checkpoint.every_seconds=nan": "use a finite number",
    "checkpoint.every_seconds=1e9": "<= 604800",
    "checkpoint.memory_snapshots=maybe": "must be bool, got str",
    "checkpoint.memory_snapshots=0": "must be bool, got int",
    "checkpoint.memory_snapshots=": "must be bool, got str",
}
MEANT_ROWS = {
    "checkpoint.memory_snapshots=no": False,
    "checkpoint.memory_snapshots=false": False,
    "checkpoint.memory_snapshots=off": False,
    "checkpoint.memory_snapshots=yes": True,
}


@pytest.mark.parametrize("override", SETTING_ROWS)
def test_a_wrong_setting_is_one_line_at_launch(override: str) -> None:
    with pytest.raises(ConfigError, match=SETTING_ROWS[override]) as err:
        load_config(None, [override])
    assert "\n" not in str(err.value) and override.split("=")[0] in str(err.value)


@pytest.mark.parametrize("override", MEANT_ROWS)
def test_yaml_words_for_the_switch_mean_what_they_say(override: str) -> None:
    assert load_config(None, [override]).checkpoint.memory_snapshots is MEANT_ROWS[override]


# ---- 4. register_state misused --------------------------------------------------------------
class NoLoad:
    def state_dict(self) -> dict:
        return {}


class Opaque:  # a state_dict with an object no snapshot can keep
    def state_dict(self) -> dict:
        return {"thing": Foreign()}

    def load_state_dict(self, state: dict) -> None:
        pass


class Refuses:
    def state_dict(self) -> dict:
        return {"x": torch.ones(2)}

    def load_state_dict(self, state: dict) -> None:
        raise RuntimeError("this version cannot load\nthat state")


@pytest.mark.parametrize(
    ("parts", "says"),
    [
        ({}, "needs the state to keep"),
        ({"model": object()}, "model=object: give objects with state_dict()"),
        ({"opt": NoLoad()}, "opt=NoLoad: give objects with state_dict()"),
        ({"model": [torch.ones(2)]}, "model=list"),
        ({"rng": {}}, "'rng' is kubeddp's own name"),
        ({"step": {}}, "'step' is kubeddp's own name"),
    ],
    ids=["nothing", "object", "no load", "a list", "rng", "step"],
)
def test_a_part_that_cannot_be_kept_is_refused_by_name(parts: dict, says: str) -> None:
    with pytest.raises(program_state.ProgramStateError, match=says) as err:
        program_state.register(parts)
    assert "\n" not in str(err.value)


API = textwrap.dedent(
    """
    import sys, torch
    from kubeddp import api
    {calls}
    """
)


@pytest.mark.parametrize(
    ("calls", "says"),
    [
        ("api.register_state(x={})\napi.register_state(x={})", "was called already"),
        ("api.report_step(1, 8)\napi.register_state(x={})", "after report_step()"),
        (
            "try:\n    api.register_state(m=object())\nexcept ValueError:\n    pass\n"
            "api.register_state(m=torch.nn.Linear(2, 2))\napi.register_state(m={})",
            "was called already",
        ),
    ],
    ids=["twice", "after the first step", "twice after a refused one"],
)
def test_register_state_at_the_wrong_time_is_refused(tmp_path: Path, calls: str, says: str) -> None:
    done = subprocess.run([sys.executable, "-c", API.format(calls=calls)], capture_output=True,
                          text=True, timeout=90, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"ValueError: register_state() {says}" in done.stderr.splitlines()[-1], done.stderr


def _program(tmp: Path, logs: list[str], **parts: object) -> program_state.ProgramState:
    taker = _writer(tmp / "snap", logs, run={"program": "p"})
    return program_state.ProgramState(dict(parts), taker)


def test_a_state_no_snapshot_can_keep_turns_them_off_in_one_line(tmp_path: Path) -> None:
    logs: list[str] = []
    state = _program(tmp_path, logs, model=torch.nn.Linear(2, 2), extra=Opaque())
    assert state.restore() is None
    for step in range(1, 8):
        state.after_step(step)
    state.close()
    assert len(logs) == 1 and logs[0].startswith(OFF) and "cannot keep" in logs[0], logs
    assert "test_snapshot_hostile.Foreign;" in logs[0] and not list(
        (tmp_path / "snap").glob("*.meta")
    )


def test_a_snapshot_of_another_model_is_set_aside_and_the_model_untouched(
    tmp_path: Path,
) -> None:
    logs: list[str] = []
    first = _program(tmp_path, logs, model=torch.nn.Linear(4, 3), counters={"seen": 1})
    first.restore()
    first.after_step(2)
    first.close()
    changed = torch.nn.Linear(4, 5)  # the user changed the model, same command
    before = {k: v.clone() for k, v in changed.state_dict().items()}
    again = _program(tmp_path, logs, model=changed, counters={"seen": 0})
    assert again.restore() is None
    again.close()
    assert [line for line in logs if "set aside" in line] == [
        "[kubeddp] in-memory snapshot of step 2 set aside: its model.weight has another shape; "
        "the program starts as without it"
    ]
    assert all(torch.equal(before[k], v) for k, v in changed.state_dict().items())
    assert SnapshotDir(tmp_path / "snap", print).held() == [], "never offered again"


def test_a_load_state_dict_that_raises_is_one_line_and_set_aside(tmp_path: Path) -> None:
    logs: list[str] = []
    first = _program(tmp_path, logs, model=torch.nn.Linear(2, 2), other=Refuses())
    first.restore()
    first.after_step(2)
    first.close()
    again = _program(tmp_path, logs, model=torch.nn.Linear(2, 2), other=Refuses())
    with pytest.raises(program_state.ProgramStateError) as err:
        again.restore()
    again.close()
    message = str(err.value)
    assert "\n" not in message and "other=Refuses could not load" in message
    assert "RuntimeError: this version cannot load that state" in message and "run again" in message
    assert SnapshotDir(tmp_path / "snap", print).held() == [], "the next start does not meet it"


# ---- 5. two runs on one directory ------------------------------------------------------------
HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from kubeddp.trainer.process_contract import take_snapshot_lock as take_lock
    fd = take_lock(Path(sys.argv[1]))
    print("held" if fd is not None else "busy", flush=True)
    time.sleep(60)
    """
)


def test_a_second_run_on_the_same_directory_neither_writes_nor_removes(tmp_path: Path) -> None:
    root = tmp_path / "snap"
    _take(root, 5, [])
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(root)], stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = _tree(root)
        logs = _two_takes(root)  # the second run's writer
        assert len(logs) == 1 and logs[0].startswith(OFF) and "another run" in logs[0], logs
        assert not remove_if_free(root), "launch of the second run leaves the first one's"
        assert _tree(root) == before
    finally:
        holder.kill()
        holder.wait(30)
    assert remove_if_free(root) and not root.exists(), "once no one holds it, it goes"


def test_launch_removes_a_link_not_what_it_points_to(tmp_path: Path) -> None:
    root, target = _planted_link(tmp_path)
    assert not remove_if_free(root)
    assert (target / "notes.txt").exists() and root.is_symlink()
    own = tmp_path / "own"
    _take(own, 3, [])
    (own / "link").symlink_to(target / "notes.txt")
    assert remove_if_free(own) and (target / "notes.txt").exists()
    fd = take_lock(tmp_path / "victim")  # the lock file is made without following links
    assert fd is not None
    os.close(fd)
