"""checkpoint.dir on an emptyDir, kept in step with the checkpoint keeper (checkpoint_keeper.py).

Before the workers start, launch fills checkpoint.dir with the newest complete checkpoint
directory the keeper holds and every loose file (a user script's `snapshot.pt`); while they
train, a thread sends back what appears or changes; when they have exited (done, failed, or
stopped by SIGTERM after their save), launch sends the rest. Every pod runs the same code: only
the pod that hosts global rank 0 writes, so the others have nothing to send.

What counts as written:
- a top-level directory holding `COMPLETE` (the built-in trainer renames one into place only
  when it is whole): sent once, staged and committed as a unit;
- any other file (hidden names aside: temporary directories, the writer lock): copied and
  sent when its size and mtime stayed the same for QUIET_SECONDS and during the copy (a
  script's torch.save has finished), and at the end unconditionally;
- a unit or file this pod knew (fetched or sent) that is gone (keep-N pruning, a `.bad`
  rename): removed from the keeper too; so is a checkpoint older than the newest one here.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote, urlsplit

from kubeddp.trainer import constants
from kubeddp.trainer.launcher.checkpoint_keeper import KEPT_HIDDEN, MTIME_HEADER

COMPLETE = "COMPLETE"
CHECKPOINT_NAME = re.compile(r"ckpt-(\d+)$")
DEFAULT_SYNC_SECONDS = 2.0
# After the workers exit: time to send the last files (a SIGTERM save), inside the pod's grace
FINISH_SECONDS = 30.0
# The newest and the one before: a corrupt newest falls back to it, as on a claim
FETCH_CHECKPOINTS = 2
# A file unchanged for this long (and while it is copied) is taken as written whole
QUIET_SECONDS = 0.5
REQUEST_TIMEOUT = 60.0
Log = Callable[[str], None]
Stamp = tuple[int, int]  # (size, mtime_ns)
T = TypeVar("T")


class KeeperError(RuntimeError):
    """The keeper cannot be reached or refused a request; the message names it."""


class KeeperSettingError(ValueError):
    """The keeper's settings in the environment are wrong (a user's mistake, not retried)."""


class KeeperClient:
    def __init__(self, url: str, timeout: float = REQUEST_TIMEOUT) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise KeeperSettingError(
                f"{constants.ENV_CHECKPOINT_KEEPER}={url!r} is not http://HOST:PORT; "
                "fix or unset it"
            )
        self.url = url
        self.host = parts.hostname
        self.port = parts.port or constants.KEEPER_PORT
        self.timeout = timeout

    def _request(
        self,
        method: str,
        path: str,
        body=None,
        length: int = 0,
        sink: Path | None = None,
        mtime_ns: int | None = None,
    ) -> bytes:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            headers = {"Content-Length": str(length)} if body is not None else {}
            if mtime_ns is not None:
                headers[MTIME_HEADER] = str(mtime_ns)
            conn.request(method, path, body=body, headers=headers)
            answer = conn.getresponse()
            if answer.status >= 300:
                text = answer.read(300).decode(errors="replace").strip()
                raise KeeperError(f"{method} {path}: {answer.status} {text}")
            if sink is None:
                return answer.read()
            with open(sink, "wb") as out:
                shutil.copyfileobj(answer, out, 1 << 20)
            return b""
        except (OSError, http.client.HTTPException) as exc:
            raise KeeperError(f"keeper {self.url} unreachable ({exc})") from None
        finally:
            conn.close()

    def healthy(self) -> bool:
        try:
            return self._request("GET", "/healthz") == b"ok\n"
        except KeeperError:
            return False

    def files(self) -> dict[str, Stamp]:
        listing = json.loads(self._request("GET", "/v1/list"))
        return {f["path"]: (f["size"], f["mtime_ns"]) for f in listing["files"]}

    def download(self, rel: str, dest: Path, mtime_ns: int | None = None) -> None:
        """The file, with the time it was written (the retry budget reads progress from it)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        temp = dest.parent / f".kubeddp-sync-{uuid.uuid4().hex}"
        try:
            self._request("GET", f"/v1/file/{quote(rel)}", sink=temp)
            if mtime_ns is not None:
                os.utime(temp, ns=(mtime_ns, mtime_ns))
            os.replace(temp, dest)
        finally:
            temp.unlink(missing_ok=True)

    def _upload(self, path: str, source: Path) -> None:
        with open(source, "rb") as f:
            stat = os.fstat(f.fileno())
            self._request("PUT", path, body=f, length=stat.st_size, mtime_ns=stat.st_mtime_ns)

    def upload(self, rel: str, source: Path) -> None:
        self._upload(f"/v1/file/{quote(rel)}", source)

    def upload_dir(self, name: str, source: Path) -> None:
        txn = uuid.uuid4().hex
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            rel = path.relative_to(source).as_posix()
            self._upload(f"/v1/stage/{txn}/{quote(name)}/{quote(rel)}", path)
        self._request("POST", f"/v1/commit/{txn}/{quote(name)}", body=b"", length=0)

    def delete(self, rel: str) -> None:
        try:
            self._request("DELETE", f"/v1/file/{quote(rel)}")
        except KeeperError as exc:
            if " 404 " not in str(exc):
                raise


def _step(name: str) -> int | None:
    found = CHECKPOINT_NAME.match(name)
    return int(found.group(1)) if found else None


def split_listing(files: Mapping[str, Stamp]) -> tuple[dict[str, list[str]], list[str]]:
    """(units: top-level directory -> its files, for directories holding COMPLETE; loose files)."""
    units: dict[str, list[str]] = {}
    for rel in files:
        top, sep, rest = rel.partition("/")
        if sep and rest == COMPLETE:
            units[top] = []
    loose = []
    for rel in files:
        top, sep, _ = rel.partition("/")
        if sep and top in units:
            units[top].append(rel)
        else:
            loose.append(rel)
    return units, loose


def newest_checkpoints(units: Mapping[str, object], count: int) -> list[str]:
    """The `count` newest checkpoint directories, newest first (`.bad` ones are not)."""
    found = sorted((_step(name), name) for name in units if _step(name) is not None)
    return [name for _, name in reversed(found[-count:])]


def _stamp(path: Path) -> Stamp:
    stat = path.stat()
    return (stat.st_size, stat.st_mtime_ns)


def scan(root: Path) -> tuple[set[str], dict[str, Stamp]]:
    """The complete units and the loose files under `root` (hidden names skipped)."""
    units: set[str] = set()
    loose: dict[str, Stamp] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == root:
            for name in list(dirnames):
                if (here / name / COMPLETE).is_file():
                    units.add(name)
        dirnames[:] = [
            d
            for d in dirnames
            if (not d.startswith(".") or (here == root and d in KEPT_HIDDEN)) and d not in units
        ]
        for name in filenames:
            if name.startswith("."):
                continue
            try:
                stat = (here / name).stat()
            except FileNotFoundError:
                continue
            loose[(here / name).relative_to(root).as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return units, loose


@dataclass
class CheckpointSync:
    """One pod's view: what it fetched or sent, so it sends only what is new."""

    client: KeeperClient
    root: Path
    log: Log
    units: set[str] = field(default_factory=set)  # on the keeper as this pod knows it
    sent: dict[str, Stamp] = field(default_factory=dict)  # loose files as last fetched/sent
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fill(self) -> str | None:
        """Fetch the newest checkpoints and the loose files; returns what was fetched (a line)."""
        self.root.mkdir(parents=True, exist_ok=True)
        files = self.client.files()
        units, loose = split_listing(files)
        chosen = newest_checkpoints(units, FETCH_CHECKPOINTS)
        fetched = list(loose) + [rel for name in chosen for rel in units[name]]
        for rel in loose:
            self.client.download(rel, self.root / rel, files[rel][1])
        for name in chosen:
            self._fetch_unit(name, units[name], files)
        _, here = scan(self.root)
        self.sent = {rel: here[rel] for rel in loose if rel in here}
        if not fetched:
            return None
        size = sum(files[rel][0] for rel in fetched)
        what = f"checkpoint {chosen[0]}" if chosen else "no checkpoint"
        if len(chosen) > 1:
            what += f" (and {len(chosen) - 1} older)"
        return f"{what} and {len(loose)} other file(s), {size / 1e6:.1f} MB"

    def _fetch_unit(self, name: str, rels: list[str], files: Mapping[str, Stamp]) -> None:
        """One checkpoint, staged beside and then renamed: never part of a checkpoint in place."""
        staging = self.root / f".kubeddp-sync-{uuid.uuid4().hex}"
        try:
            for rel in rels:
                self.client.download(rel, staging / rel, files[rel][1])
            target = self.root / name
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging / name, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self.units.add(name)

    def refresh(self) -> list[str]:
        """Before this pod rejoins a new group without restarting: fetch what the keeper got
        since (another pod's rank 0 wrote it), so every rank starts from the same files."""
        with self._lock:
            files = self.client.files()
            units, loose = split_listing(files)
            _, here = scan(self.root)
            done = []
            for rel in loose:
                if here.get(rel) != files[rel]:
                    self.client.download(rel, self.root / rel, files[rel][1])
                    self.sent[rel] = _stamp(self.root / rel)
                    done.append(rel)
            for name in newest_checkpoints(units, FETCH_CHECKPOINTS):
                if not (self.root / name / COMPLETE).is_file():
                    self._fetch_unit(name, units[name], files)
                    done.append(name)
            if done:
                self.log(f"[kubeddp] checkpoint keeper: fetched {', '.join(done)} before rejoining")
            return done

    def push(self, final: bool = False) -> list[str]:
        """Send what is new, remove what is gone; returns what was sent or removed."""
        with self._lock:
            done: list[str] = []
            units, loose = scan(self.root)
            new_units = sorted(units - self.units, key=lambda n: (_step(n) or -1, n))
            for name in new_units:
                self.client.upload_dir(name, self.root / name)
                self.units.add(name)
                done.append(name)
            steps = [s for s in (_step(n) for n in units) if s is not None]
            newest_here = max(steps, default=None)
            for name in sorted(self.units - units):
                self.client.delete(name)
                self.units.discard(name)
                done.append(f"-{name}")
            if new_units and newest_here is not None:  # older than this pod's, past keep-N
                units_there, _ = split_listing(self.client.files())
                for name in units_there:
                    step = _step(name)
                    if step is not None and step < newest_here and name not in units:
                        self.client.delete(name)
                        done.append(f"-{name}")
            changed = [rel for rel, stamp in sorted(loose.items()) if self.sent.get(rel) != stamp]
            if changed and not final:
                time.sleep(QUIET_SECONDS)  # a file still being written changes meanwhile
            for rel in changed:
                copied = self._copy_if_quiet(rel, loose[rel], final)
                if copied is None:
                    continue  # being written: the next interval tries again
                try:
                    self.client.upload(rel, copied)
                finally:
                    copied.unlink(missing_ok=True)
                self.sent[rel] = loose[rel]
                done.append(rel)
            for rel in sorted(set(self.sent) - set(loose)):
                self.client.delete(rel)
                del self.sent[rel]
                done.append(f"-{rel}")
            return done

    def _copy_if_quiet(self, rel: str, stamp: Stamp, final: bool) -> Path | None:
        """A private copy of the file when it is not being written (same size and time before
        and after the copy, and, unless final, as at the scan): a script's torch.save rewrites
        its file in place, so sending the file itself could send half of each version."""
        source = self.root / rel
        copy = self.root / f".kubeddp-sync-{uuid.uuid4().hex}"
        try:
            before = _stamp(source)
            if not final and before != stamp:
                return None
            shutil.copy2(source, copy)  # with its time: progress for the retry budget
            if _stamp(source) == before:
                return copy
        except FileNotFoundError:
            pass
        copy.unlink(missing_ok=True)
        return None

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                for item in self.push():
                    self.log(f"[kubeddp] checkpoint keeper: {_said(item)}")
            except (KeeperError, OSError) as exc:  # the next interval tries again
                self.log(f"[kubeddp] checkpoint keeper: send failed, will retry: {exc}")

    def start(self, interval: float) -> None:
        self._thread = threading.Thread(
            target=self._loop, args=(interval,), name="kubeddp-checkpoint-sync", daemon=True
        )
        self._thread.start()

    def finish(self, deadline_seconds: float) -> bool:
        """Stop the thread and send the rest, retrying until the deadline; False if it failed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=deadline_seconds)
        end = time.monotonic() + deadline_seconds
        while True:
            try:
                for item in self.push(final=True):
                    self.log(f"[kubeddp] checkpoint keeper: {_said(item)}")
                return True
            except (KeeperError, OSError) as exc:
                if time.monotonic() > end:
                    self.log(f"[kubeddp] checkpoint keeper: the last files were not sent: {exc}")
                    return False
                time.sleep(1.0)


def _said(item: str) -> str:
    return f"removed {item[1:]}" if item.startswith("-") else f"sent {item}"


def wait_for_keeper(client: KeeperClient, deadline_seconds: float) -> None:
    end = time.monotonic() + deadline_seconds
    while not client.healthy():
        if time.monotonic() > end:
            raise KeeperError(
                f"checkpoint keeper {client.url} did not answer within {deadline_seconds:g} s; "
                "check its pod (kubectl get pods -l app.kubernetes.io/component=checkpoints) and "
                "that its claim is Bound"
            )
        time.sleep(0.5)


def within(deadline_seconds: float, log: Log, call: Callable[[], T]) -> T:
    """`call()`, again after a keeper failure until the deadline: a keeper that answered its
    health check can still drop a connection while the pod network settles (seen with 33 pods
    starting at once, and again when they rejoined: "No route to host"), and one lost fetch must
    not cost a pod restart."""
    end = time.monotonic() + deadline_seconds
    while True:
        try:
            return call()
        except KeeperError as exc:
            if time.monotonic() > end:
                raise
            log(f"[kubeddp] checkpoint keeper: fetching again after: {exc}")
            time.sleep(1.0)


def sync_seconds(env: Mapping[str, str]) -> float:
    raw = env.get(constants.ENV_CHECKPOINT_SYNC_SECONDS)
    try:
        value = float(raw) if raw is not None else DEFAULT_SYNC_SECONDS
    except ValueError:
        value = -1.0
    if not 0 < value < 3600:
        raise KeeperSettingError(
            f"{constants.ENV_CHECKPOINT_SYNC_SECONDS}={raw!r} must be seconds between 0 and "
            "3600; set a number or unset it"
        )
    return value


def start_from_env(
    env: Mapping[str, str], checkpoint_dir: str, deadline_seconds: float, log: Log
) -> CheckpointSync | None:
    """None unless the manifest names a keeper; else checkpoint.dir filled and the thread on."""
    url = env.get(constants.ENV_CHECKPOINT_KEEPER)
    if not url:
        return None
    client = KeeperClient(url)
    interval = sync_seconds(env)
    end = time.monotonic() + deadline_seconds
    wait_for_keeper(client, deadline_seconds)
    sync = CheckpointSync(client, Path(checkpoint_dir), log)
    fetched = within(max(0.0, end - time.monotonic()), log, sync.fill)
    log(
        f"[kubeddp] checkpoint keeper {url}: "
        + (f"fetched {fetched} into {checkpoint_dir}" if fetched else "nothing saved yet")
    )
    sync.start(interval)
    return sync
