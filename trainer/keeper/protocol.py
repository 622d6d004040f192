"""The checkpoint keeper's protocol: its requests, the paths it accepts and what it lists.

Shared by the keeper (keeper/server.py, keeper/http_handler.py, keeper/store.py) and the pods'
client (keeper/client.py). Every request but /healthz is signed when the job has a keeper
secret (keeper/auth.py).

    GET    /healthz                        ok (the readiness probe; says nothing else)
    GET    /v2/list                        Listing (JSON): checkpoints, files, links
    GET    /v2/file/PATH                   one block of a file: `Range: bytes=A-B`, with the
                                           version the listing gave (X-Kubeddp-Version)
    POST   /v2/txn                         Upload (JSON): begin -> {"txn": ID}
    PUT    /v2/txn/ID/FILE/BLOCK           one block of the upload's FILE-th file (in name
                                           order), checked against its digest on arrival
    POST   /v2/txn/ID/commit               in place, whole; 409 while blocks are missing
    DELETE /v2/txn/ID                      abort: the staged files are removed
    POST   /v2/aside/NAME?as=NEW           rename a checkpoint directory out of the way (kept)
    PUT    /v2/link/PATH                   JSON {"target": T}: a relative symbolic link
    DELETE /v2/file/PATH                   a loose file or link (a checkpoint directory: 403;
                                           only the keeper prunes them, to checkpoint.keep)

An upload is a checkpoint directory (`unit`: committed by one rename, only with its COMPLETE
marker, whose digests its files must match) or one loose file (`file`: replaced by one rename).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from urllib.parse import unquote

from kubeddp.trainer import constants
from kubeddp.trainer.checkpoint_digest import DigestError, FileDigest
from kubeddp.trainer.process_contract import PROGRESS_NOTE

API = "/v2"
HEALTH = "/healthz"
MARKER = constants.CHECKPOINT_MARKER
CHECKPOINT_NAME = re.compile(r"^ckpt-(\d+)$")
# Where a checkpoint directory is set aside by the trainer: resume's `.bad`, keep-apart's
# `.previous-<UTC time>`, each with `-N` when the name is taken (worker/checkpoint/safety.py).
ASIDE_SUFFIX = re.compile(r"^\.(bad|previous-\d{8}T\d{6}Z)(-\d{1,3})?$")
# The keeper's own names on its claim, never listed or accepted from a client
KEEPER_DIR = ".kubeddp-keeper"
UNIT_RECORD = ".kubeddp-keeper.json"
OLD_INCOMING = ".incoming"  # an older keeper's staging folder
RESERVED_TOP = (KEEPER_DIR, OLD_INCOMING)

VERSION_HEADER = "X-Kubeddp-Version"
MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
MAX_DEPTH = 32  # directories below a checkpoint.dir that a pod sends and the keeper lists
MAX_JSON_BYTES = 8 << 20  # a listing or an upload's description; blocks are bounded by BLOCK


class BadPath(ValueError):
    """A path a client may not use; the message names it."""


def relative_path(text: str) -> str:
    """A path below the keeper's directory, from a URL (percent-encoded UTF-8): no `..`, no
    absolute path, no empty part, none of the keeper's own names. Hidden names are fine."""
    try:
        path = unquote(text, errors="strict")
    except UnicodeDecodeError:
        raise BadPath(f"{text[:80]!r} is not UTF-8") from None
    parts = path.split("/")
    if (
        not path
        or len(path.encode()) > MAX_PATH_BYTES
        or any(p in ("", ".", "..") or "\0" in p or len(p.encode()) > MAX_NAME_BYTES for p in parts)
        or parts[0] in RESERVED_TOP
        or parts[-1] == UNIT_RECORD
    ):
        raise BadPath(f"{path[:200]!r} is not a plain relative path of the keeper's directory")
    return path


def link_target_inside(link: str, target: str) -> bool:
    """A link's target is relative and stays inside the directory (judged by its text: a link
    is never followed by the keeper, and a pod recreates it only when this holds)."""
    if not target or target.startswith("/") or "\0" in target or len(target) > MAX_PATH_BYTES:
        return False
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(link), target))
    return joined != ".." and not joined.startswith("../") and joined != "."


def checkpoint_shaped(rel: str) -> bool:
    """Whether `rel` lies under a checkpoint's name (`ckpt-N`, or one set aside: `.bad`,
    `.previous-TIME`): a checkpoint is committed whole, with its COMPLETE marker, and nothing
    is ever added to it, linked into it or removed from it a file at a time."""
    top = rel.split("/", 1)[0]
    found = re.match(r"^ckpt-\d+", top)
    return found is not None and (
        top == found.group(0) or bool(ASIDE_SUFFIX.match(top[found.end() :]))
    )


def step_of(name: str) -> int | None:
    found = CHECKPOINT_NAME.match(name)
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class FileEntry:
    """One file of an upload or a listing: what it holds, and when it was written."""

    digest: FileDigest
    mtime_ns: int = 0

    def to_json(self) -> dict:
        return {**self.digest.to_json(), "mtime_ns": self.mtime_ns}

    @classmethod
    def from_json(cls, data: object) -> FileEntry:
        digest = FileDigest.from_json(data)
        mtime = data.get("mtime_ns", 0) if isinstance(data, dict) else 0
        if not isinstance(mtime, int) or isinstance(mtime, bool) or mtime < 0:
            raise DigestError(f"mtime_ns {mtime!r} is not a time")
        return cls(digest, mtime)


def _entries(data: object, what: str) -> dict[str, FileEntry]:
    if not isinstance(data, dict):
        raise DigestError(f"{what} is not an object")
    return {relative_path(str(rel)): FileEntry.from_json(entry) for rel, entry in data.items()}


@dataclass(frozen=True)
class Upload:
    """What a client is about to send: `kind` unit (a checkpoint directory `name`, its files by
    path from the keeper's directory) or file (one loose file, `name` its path); `keep`: the
    sender's checkpoint.keep, for the keeper's pruning when it was started without --keep."""

    kind: str
    name: str
    files: dict[str, FileEntry]
    keep: int | None = None

    @property
    def order(self) -> list[str]:
        """The files in the order their numbers in PUT /v2/txn/ID/FILE/BLOCK refer to."""
        return sorted(self.files)

    @property
    def size(self) -> int:
        return sum(entry.digest.size for entry in self.files.values())

    def to_json(self) -> dict:
        files = {rel: entry.to_json() for rel, entry in self.files.items()}
        return {"kind": self.kind, "name": self.name, "files": files, "keep": self.keep}

    @classmethod
    def from_json(cls, data: object) -> Upload:
        if not isinstance(data, dict):
            raise DigestError("an upload is a JSON object")
        kind, name, keep = (
            data.get("kind"),
            relative_path(str(data.get("name", ""))),
            data.get("keep"),
        )
        files = _entries(data.get("files"), "files")
        if keep is not None and (not isinstance(keep, int) or isinstance(keep, bool) or keep < 1):
            raise DigestError(f"keep {keep!r} is not a count of checkpoints")
        if kind == "unit":
            if "/" in name or f"{name}/{MARKER}" not in files:
                raise DigestError(f"checkpoint {name!r} must be a top-level name with {MARKER}")
            if any(not rel.startswith(name + "/") for rel in files):
                raise DigestError(f"a file of checkpoint {name!r} lies outside it")
        elif kind == "file":
            if list(files) != [name]:
                raise DigestError(f"a file upload holds exactly {name!r}")
            if checkpoint_shaped(name):
                raise DigestError(f"{name!r} lies in a checkpoint, which is sent whole, never a "
                                  "file at a time")  # fmt: skip
        else:
            raise DigestError(f"kind {kind!r} is neither unit nor file")
        return cls(kind, name, files, keep)


@dataclass
class Listing:
    """What the keeper holds: checkpoint directories (with COMPLETE) and their version and
    files, loose files with theirs, and links with their targets."""

    units: dict[str, tuple[str, dict[str, FileEntry]]] = field(default_factory=dict)
    files: dict[str, tuple[str, FileEntry]] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "units": {
                name: {"version": version, "files": {r: e.to_json() for r, e in files.items()}}
                for name, (version, files) in self.units.items()
            },
            "files": {
                rel: {"version": version, **entry.to_json()}
                for rel, (version, entry) in self.files.items()
            },
            "links": dict(self.links),
        }

    @classmethod
    def from_json(cls, data: object) -> Listing:
        if not isinstance(data, dict):
            raise DigestError("a listing is a JSON object")
        listing = cls()
        for name, unit in dict(data.get("units") or {}).items():
            listing.units[relative_path(name)] = (_version(unit), _entries(unit.get("files"), name))
        for rel, entry in dict(data.get("files") or {}).items():
            listing.files[relative_path(rel)] = (_version(entry), FileEntry.from_json(entry))
        for rel, target in dict(data.get("links") or {}).items():
            listing.links[relative_path(rel)] = str(target)
        return listing

    def newest_mtime_ns(self) -> int:
        """The newest time a file was written, as the retry budget counts progress (hidden
        names left out, as retry_budget.progress_marker does on a disk, but for rank 0's note
        of its newest in-memory snapshot)."""
        times = [
            entry.mtime_ns
            for files in ([*u[1].items()] for u in self.units.values())
            for rel, entry in files
            if not any(part.startswith(".") for part in rel.split("/"))
        ]
        times += [
            entry.mtime_ns
            for rel, (_, entry) in self.files.items()
            if rel == PROGRESS_NOTE or not any(part.startswith(".") for part in rel.split("/"))
        ]
        return max(times, default=0)


def _version(data: object) -> str:
    version = data.get("version") if isinstance(data, dict) else None
    if not isinstance(version, str) or not re.fullmatch(r"[0-9a-zA-Z._-]{1,100}", version):
        raise DigestError(f"version {version!r} is not a keeper's version")
    return version
