"""The checkpoint keeper's directory (the claim): what it lists, how it reads, renames, prunes.

Layout on the claim:

    ckpt-NNNNNNNN/                checkpoint directories: COMPLETE, their files, and the
                                  keeper's record `.kubeddp-keeper.json` (version, digests)
    snapshot.pt, .kubeddp-retries/POD.json, latest -> ckpt-...   loose files and links
    .kubeddp-keeper/incoming/ID/  uploads being staged (keeper/uploads.py; emptied at start)
    .kubeddp-keeper/aside/NAME    the previous copy of NAME while a new one takes its name: put
                                  back at start when NAME is missing (killed between renames)
    .kubeddp-keeper/trash/ID      pruned or replaced directories on their way out

Every path a client names is opened one part at a time from the directory's own descriptor with
O_NOFOLLOW: a link on the claim is listed and kept, never followed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

from kubeddp.trainer.checkpoint_digest import DigestError, digest_fd
from kubeddp.trainer.fault_points import reached
from kubeddp.trainer.keeper.nofollow import DIR_FLAGS, descend
from kubeddp.trainer.keeper.protocol import (
    ASIDE_SUFFIX,
    KEEPER_DIR,
    MARKER,
    MAX_DEPTH,
    OLD_INCOMING,
    RESERVED_TOP,
    UNIT_RECORD,
    FileEntry,
    Listing,
    checkpoint_shaped,
    link_target_inside,
    step_of,
)


class StoreError(Exception):
    """A request the directory cannot do; `status` is the HTTP answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def fsync_dir(fd_or_path: int | Path) -> None:
    fd = fd_or_path if isinstance(fd_or_path, int) else os.open(fd_or_path, DIR_FLAGS)
    try:
        os.fsync(fd)
    finally:
        if not isinstance(fd_or_path, int):
            os.close(fd)


def storage_error(exc: OSError, what: str) -> StoreError:
    """A full disk or quota is 507 (the client says so); anything else of the disk is 500."""
    if exc.errno in (28, 122):  # ENOSPC, EDQUOT
        return StoreError(507, f"{what}: the keeper's disk is full ({exc.strerror})")
    return StoreError(500, f"{what}: {exc.strerror or exc}")


class Store:
    """The keeper's directory (see the module docstring). Thread-safe."""

    def __init__(self, root: Path, keep: int | None = None) -> None:
        self.root = Path(os.path.realpath(root))
        self.keep = keep
        self.own = self.root / KEEPER_DIR
        self.lock = threading.Lock()  # renames and removals of top-level names, one at a time
        self._digests: dict[tuple[str, int, int, int], FileEntry] = {}
        self._record_locks: dict[str, threading.Lock] = {}

    # ---- start -------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Create the layout; put back what a keeper killed mid-commit left aside; remove
        uploads it left half done and what it was throwing away."""
        self.root.mkdir(parents=True, exist_ok=True)
        for sub in ("incoming", "aside", "trash"):
            (self.own / sub).mkdir(parents=True, exist_ok=True)
        for aside in sorted((self.own / "aside").iterdir()):
            final = self.root / aside.name
            if os.path.lexists(final):
                self.throw_away(aside)
            else:
                os.rename(aside, final)  # the new copy never took the name: the old one is back
        fsync_dir(self.root)
        for sub in ("incoming", "trash"):
            for entry in (self.own / sub).iterdir():
                shutil.rmtree(entry, ignore_errors=True)
        shutil.rmtree(self.root / OLD_INCOMING, ignore_errors=True)

    def throw_away(self, path: Path) -> None:
        """Gone at once for readers (one rename), removed after."""
        trash = self.own / "trash" / uuid.uuid4().hex
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)

    # ---- paths -------------------------------------------------------------------------------
    def dir_fd(self, parts: list[str], create: bool = False) -> int:
        """A descriptor of root/parts, opened a part at a time without following links."""
        return walk_dirs(os.open(self.root, DIR_FLAGS), parts, create)

    def open_read(self, rel: str, version: str) -> tuple[int, int]:
        """(descriptor, size) of a regular file at `rel` if it is still `version` (409 if
        replaced since the listing: list again). A checkpoint directory's file is opened
        through the descriptor its version was read from: one version, even mid re-commit."""
        parts = rel.split("/")
        top = self.dir_fd(parts[:1]) if len(parts) > 1 else None
        unit_version = self._unit_version(top) if top is not None else None
        parent = (
            walk_dirs(top, parts[1:-1]) if top is not None else self.dir_fd([])
        )  # walk_dirs closes `top` (it hands back a new descriptor, or `top` itself)
        try:
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(parts[-1], flags, dir_fd=parent)
        except OSError as exc:
            raise StoreError(404, f"{rel} cannot be read ({exc.strerror})") from None
        finally:
            os.close(parent)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise StoreError(404, f"{rel} is not a regular file")
            if (unit_version or file_version(info)) != version:
                raise StoreError(409, f"{rel} changed since it was listed; list again")
            os.set_blocking(fd, True)
            return fd, info.st_size
        except BaseException:
            os.close(fd)
            raise

    def _unit_version(self, unit_fd: int) -> str | None:
        """The version of the checkpoint directory open as `unit_fd` (None: not a checkpoint
        directory). Read through the same descriptor as its files: one version."""
        try:
            os.stat(MARKER, dir_fd=unit_fd, follow_symlinks=False)
        except OSError:
            return None
        record = read_record(unit_fd, "")
        return record[0] if record else None

    def is_unit(self, name: str) -> bool:
        try:
            return stat.S_ISREG(os.lstat(self.root / name / MARKER).st_mode) and not os.path.islink(
                self.root / name
            )
        except OSError:
            return False

    # ---- listing -----------------------------------------------------------------------------
    def listing(self) -> Listing:
        listing = Listing()
        for entry in _entries(self.root):
            if entry.name in RESERVED_TOP:
                continue
            if entry.is_dir(follow_symlinks=False) and self.is_unit(entry.name):
                record = self.unit_record(entry.name)
                if record is not None:
                    listing.units[entry.name] = record
                continue
            self._walk(Path(entry.path), entry.name, listing, 0)
        return listing

    def _walk(self, path: Path, rel: str, listing: Listing, depth: int) -> None:
        try:
            info = os.lstat(path)
        except OSError:
            return
        if stat.S_ISLNK(info.st_mode):
            with contextlib.suppress(OSError):
                listing.links[rel] = os.readlink(path)
        elif stat.S_ISREG(info.st_mode):
            entry = self.loose_entry(rel, path, info)
            if entry is not None:
                listing.files[rel] = (file_version(info), entry)
        elif stat.S_ISDIR(info.st_mode) and depth < MAX_DEPTH:
            for child in _entries(path):
                self._walk(Path(child.path), f"{rel}/{child.name}", listing, depth + 1)

    def loose_entry(self, rel: str, path: Path, info: os.stat_result) -> FileEntry | None:
        """A loose file's digest: remembered since its upload, else computed once."""
        key = (rel, info.st_ino, info.st_mtime_ns, info.st_size)
        known = self._digests.get(key)
        if known is not None:
            return known
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            os.set_blocking(fd, True)
            entry = FileEntry(digest_fd(fd), info.st_mtime_ns)
        finally:
            os.close(fd)
        self.remember(rel, info, entry)
        return entry

    def remember(self, rel: str, info: os.stat_result, entry: FileEntry) -> None:
        for key in [k for k in self._digests if k[0] == rel]:
            self._digests.pop(key, None)
        self._digests[(rel, info.st_ino, info.st_mtime_ns, info.st_size)] = entry

    def unit_record(self, name: str) -> tuple[str, dict[str, FileEntry]] | None:
        """The version and files of checkpoint directory `name`: its record, or (a directory
        the keeper did not commit: the claim was mounted by a job before) computed once."""
        with self.lock:
            guard = self._record_locks.setdefault(name, threading.Lock())
        with guard:
            try:
                fd = self.dir_fd([name])
            except StoreError:
                return None
            try:
                found = read_record(fd, name)
                return found if found is not None else self._record_unit(name, fd)
            finally:
                os.close(fd)

    def _record_unit(self, name: str, fd: int) -> tuple[str, dict[str, FileEntry]] | None:
        files: dict[str, FileEntry] = {}
        for rel, file_fd in _unit_files(fd):
            try:
                files[rel] = FileEntry(digest_fd(file_fd), os.fstat(file_fd).st_mtime_ns)
            finally:
                os.close(file_fd)
        version = "k" + uuid.uuid4().hex
        with contextlib.suppress(OSError):
            write_record(fd, version, files)  # a full disk: computed again next time
        return version, {f"{name}/{rel}": entry for rel, entry in files.items()}

    # ---- changes -----------------------------------------------------------------------------
    def delete(self, rel: str) -> bool:
        """Remove a loose file or link; a checkpoint directory is the keeper's to prune."""
        parts = rel.split("/")
        if self.is_unit(parts[0]) or checkpoint_shaped(rel):
            raise StoreError(403, f"{parts[0]} is a checkpoint; the keeper prunes checkpoints "
                             "to checkpoint.keep, pods never delete them")  # fmt: skip
        try:
            parent = self.dir_fd(parts[:-1])
        except StoreError:
            return False
        try:
            with self.lock:
                os.unlink(parts[-1], dir_fd=parent)
            fsync_dir(parent)
            return True
        except FileNotFoundError:
            return False
        except IsADirectoryError:
            raise StoreError(409, f"{rel} is a directory; delete its files") from None
        except OSError as exc:
            raise storage_error(exc, f"deleting {rel}") from None
        finally:
            os.close(parent)

    def aside(self, name: str, new: str) -> None:
        """Rename checkpoint `name` to `new` (`name.bad`, `name.previous-...`): kept, never
        fetched, never pruned."""
        if not new.startswith(name) or not ASIDE_SUFFIX.match(new[len(name) :]) or "/" in name:
            raise StoreError(400, f"{new!r} is not {name} set aside (.bad, .previous-TIME)")
        with self.lock:
            if not self.is_unit(name):
                raise StoreError(404, f"{name} is not a checkpoint here")
            if os.path.lexists(self.root / new):
                raise StoreError(409, f"{new} exists already")
            os.rename(self.root / name, self.root / new)
            fsync_dir(self.root)

    def link(self, rel: str, target: str, incoming_fd: int) -> None:
        """A symbolic link at `rel` to `target` (relative, inside): made beside, renamed in."""
        if not link_target_inside(rel, target):
            raise StoreError(400, f"link {rel} -> {target!r} points outside the directory")
        if checkpoint_shaped(rel) or self.is_unit(rel.split("/")[0]):
            raise StoreError(403, f"link {rel} lies in a checkpoint, which is committed whole")
        parts = rel.split("/")
        temp = f"link-{uuid.uuid4().hex}"
        parent = self.dir_fd(parts[:-1], create=True)
        try:
            os.symlink(target, temp, dir_fd=incoming_fd)
            with self.lock:
                os.rename(temp, parts[-1], src_dir_fd=incoming_fd, dst_dir_fd=parent)
            fsync_dir(parent)
        except IsADirectoryError:
            raise StoreError(409, f"{rel} is a directory") from None
        except OSError as exc:
            raise storage_error(exc, f"linking {rel}") from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=incoming_fd)
            os.close(parent)

    def prune(self, keep: int | None) -> list[str]:
        """Keep the newest `keep` checkpoints (by step; `.bad` and `.previous-` ones are not
        counted and never removed)."""
        if not keep:
            return []
        with self.lock:
            found = sorted(
                (step, e.name)
                for e in _entries(self.root)
                if (step := step_of(e.name)) is not None and self.is_unit(e.name)
            )
            victims = [name for _, name in found[:-keep]]
            for name in victims:
                reached("keeper-prune")
                self.throw_away(self.root / name)
            if victims:
                fsync_dir(self.root)
        return victims


def file_version(info: os.stat_result) -> str:
    """A loose file's version: a replaced file is a new inode."""
    return f"f{info.st_ino}-{info.st_mtime_ns}-{info.st_size}"


def read_record(unit_fd: int, name: str) -> tuple[str, dict[str, FileEntry]] | None:
    """(version, files by path from the claim's root) of checkpoint directory `name` from its
    record; None without a readable one."""
    try:
        fd = os.open(UNIT_RECORD, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=unit_fd)
    except OSError:
        return None
    try:
        data = json.loads(os.read(fd, 16 << 20))
        version, files = data["version"], data["files"]
        if not isinstance(version, str) or not isinstance(files, dict):
            return None
        return version, {f"{name}/{rel}": FileEntry.from_json(e) for rel, e in files.items()}
    except (ValueError, KeyError, TypeError, DigestError, OSError):
        return None
    finally:
        os.close(fd)


def write_record(unit_fd: int, version: str, files: dict[str, FileEntry]) -> None:
    """The record of a checkpoint directory (`files` by path inside it), replaced atomically."""
    body = {"version": version, "files": {r: e.to_json() for r, e in sorted(files.items())}}
    temp = f"{UNIT_RECORD}.tmp-{uuid.uuid4().hex}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=unit_fd)
    try:
        os.write(fd, json.dumps(body).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temp, UNIT_RECORD, src_dir_fd=unit_fd, dst_dir_fd=unit_fd)


def walk_dirs(fd: int, parts: list[str], create: bool = False) -> int:
    """From directory descriptor `fd` (taken over: closed unless handed back) down `parts`,
    without following links; the last directory's descriptor."""
    try:
        return descend(fd, parts, create)
    except FileNotFoundError:
        raise StoreError(404, f"{'/'.join(parts)} does not exist") from None
    except OSError as exc:
        raise StoreError(409, f"{'/'.join(parts)}: a link or a file where a directory should "
                         f"be ({exc.strerror})") from None  # fmt: skip


def _entries(path: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as found:
            return sorted(found, key=lambda e: e.name)
    except OSError:  # unreadable (lost+found), or gone meanwhile
        return []


def _unit_files(unit_fd: int, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, int]]:
    """(path inside, open descriptor) of every regular file of a checkpoint directory."""
    for name in sorted(os.listdir(unit_fd)):
        if name.startswith(UNIT_RECORD):
            continue
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=unit_fd)  # fmt: skip
        except OSError:
            continue  # a link or a special file: not part of what the keeper serves
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):
            os.set_blocking(fd, True)
            yield prefix + name, fd
        elif stat.S_ISDIR(mode) and depth < MAX_DEPTH:
            try:
                yield from _unit_files(fd, f"{prefix}{name}/", depth + 1)
            finally:
                os.close(fd)
        else:
            os.close(fd)
