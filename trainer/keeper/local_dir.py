"""What a pod's checkpoint.dir holds, as the checkpoint keeper keeps it.

- a top-level directory holding a regular COMPLETE file is a checkpoint (a unit): sent once,
  whole, committed by one rename (the built-in trainer renames one into place only when it is
  whole). Its COMPLETE marker lists its files' digests (trainer/checkpoint_digest.py);
- every other regular file is a loose file (a script's `snapshot.pt`, a user's `.env`, the
  retry budget's record, the stall reports), sent when it stopped changing;
- a link whose target is relative and stays inside checkpoint.dir is kept as a link;
- kubeddp's own passing files are not sent: the writer's temporaries and lock, the sync's
  staging, this pod's own records (`.kubeddp-pod/`);
- anything else (a link out of checkpoint.dir, a FIFO, a name that is not UTF-8, files under
  a checkpoint's name without its COMPLETE marker) is refused with one line, once: never
  dropped silently, never a failure of the sync.

What a pod fetches is placed a folder at a time without following links (`place`,
`place_link`): a link in checkpoint.dir, wherever it points, is never written through.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from kubeddp.trainer import constants
from kubeddp.trainer.keeper.nofollow import descend
from kubeddp.trainer.keeper.protocol import (
    MARKER,
    MAX_DEPTH,
    MAX_NAME_BYTES,
    RESERVED_TOP,
    UNIT_RECORD,
    checkpoint_shaped,
    link_target_inside,
)

POD_DIR = ".kubeddp-pod"  # this pod's own records, never sent
SYNC_PREFIX = ".kubeddp-sync-"  # staging of fetches
# kubeddp's passing files at the top of checkpoint.dir: never worth keeping
PASSING_PREFIXES = (
    constants.CHECKPOINT_TMP_PREFIX, SYNC_PREFIX, constants.CHECKPOINT_NOTE_PREFIX,
    constants.CHECKPOINT_ASIDE_PREFIX, POD_DIR,
)  # fmt: skip
PASSING_NAMES = (
    constants.CHECKPOINT_LOCK_FILE, constants.CHECKPOINT_PROBE, "lost+found", *RESERVED_TOP
)  # fmt: skip
Stamp = tuple[int, int]  # (size, mtime_ns)


@dataclass
class LocalView:
    units: dict[str, dict[str, Stamp]] = field(default_factory=dict)  # name -> its files
    loose: dict[str, Stamp] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # path -> why it is not kept


def passing(rel: str) -> bool:
    """kubeddp's own passing files (not the retry records or stall reports: those are kept)."""
    parts = rel.split("/")
    if parts[-1].startswith(SYNC_PREFIX) or parts[-1].startswith(UNIT_RECORD):
        return True
    if len(parts) > 1 and parts[0] == ".kubeddp-retries" and parts[-1].endswith(".tmp"):
        return True
    return parts[0] in PASSING_NAMES or parts[0].startswith(PASSING_PREFIXES)


def _named(name: str) -> str | None:
    """Why a name cannot travel, or None."""
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not UTF-8; rename it"
    if len(encoded) > MAX_NAME_BYTES:
        return "its name is too long"
    return None


def scan(root: Path) -> LocalView:
    view = LocalView()
    for entry in _entries(root):
        rel = entry.name
        if passing(rel):
            continue
        why = _named(entry.name)
        if why:
            view.refused[_shown(rel)] = why
            continue
        if entry.is_dir(follow_symlinks=False) and _is_unit(Path(entry.path)):
            files: dict[str, Stamp] = {}
            _walk(Path(entry.path), rel, view, files, 0, unit=True)
            view.units[rel] = files
        elif checkpoint_shaped(rel):
            view.refused[rel] = (
                "a checkpoint's name without its COMPLETE marker (checkpoints are sent whole)"
            )
        else:
            _walk(Path(entry.path), rel, view, view.loose, 0, unit=False)
    return view


def _is_unit(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path / MARKER).st_mode)
    except OSError:
        return False


def _walk(path: Path, rel: str, view: LocalView, into: dict, depth: int, unit: bool) -> None:
    try:
        info = os.lstat(path)
    except OSError:  # removed meanwhile
        return
    if stat.S_ISREG(info.st_mode):
        into[rel] = (info.st_size, info.st_mtime_ns)
    elif stat.S_ISLNK(info.st_mode):
        target = os.readlink(path)
        if unit:
            view.refused[rel] = "a link inside a checkpoint is not kept"
        elif _named(target) or not link_target_inside(rel, target):
            view.refused[rel] = f"a link to {target!r}, outside checkpoint.dir, is not kept"
        else:
            view.links[rel] = target
    elif stat.S_ISDIR(info.st_mode) and depth < MAX_DEPTH:
        for entry in _entries(path):
            child = f"{rel}/{entry.name}"
            if passing(child):
                continue
            why = _named(entry.name)
            if why:
                view.refused[f"{rel}/{_shown(entry.name)}"] = why
                continue
            _walk(Path(entry.path), child, view, into, depth + 1, unit)
    elif not stat.S_ISDIR(info.st_mode):
        view.refused[rel] = "not a regular file (a FIFO, socket or device) is not kept"


def _shown(name: str) -> str:
    """A name as a line can show it (undecodable bytes as \\xNN)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _entries(path: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as found:
            return sorted(found, key=lambda e: e.name)
    except OSError:
        return []


def stamp(path: Path) -> Stamp | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return (info.st_size, info.st_mtime_ns) if stat.S_ISREG(info.st_mode) else None


def parent_fd(root: Path, rel: str) -> int:
    """A descriptor of the folder that holds `rel` under `root`, made where missing and walked a
    part at a time without following a link (OSError where a part is a link or a file): what a
    pod fetches is never written through a link, wherever a link in checkpoint.dir points."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    return descend(fd, rel.split("/")[:-1], create=True)


def place(root: Path, staged: str, rel: str) -> None:
    """The top-level file `staged` takes the name `rel` under `root` (one rename, never
    through a link; a link at `rel` itself is replaced, not followed)."""
    parent = parent_fd(root, rel)
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.replace(staged, rel.rsplit("/", 1)[-1], src_dir_fd=top, dst_dir_fd=parent)
    finally:
        os.close(top)
        os.close(parent)


def place_link(root: Path, rel: str, target: str, temp: str) -> None:
    """A link at `rel` to `target` (made as `temp` beside it, then renamed over)."""
    parent = parent_fd(root, rel)
    try:
        os.symlink(target, temp, dir_fd=parent)
        os.replace(temp, rel.rsplit("/", 1)[-1], src_dir_fd=parent, dst_dir_fd=parent)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=parent)
        os.close(parent)
