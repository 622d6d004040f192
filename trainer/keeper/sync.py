"""checkpoint.dir on an emptyDir, kept in step with the checkpoint keeper (keeper/server.py).

Before the workers start, launch fills checkpoint.dir from the keeper, and only where it is
read (`reads`): the newest complete checkpoint (an older one only when the newest fails its
digests), a script's loose files and links. Every pod gets its own retry record and the
finished-run record. While the workers train, a thread sends back what appears or changes
(keeper/local_dir.py says what counts); when they have exited, launch sends the rest within a
bound derived from the pod's grace period, and a pod whose last checkpoint or files did not
reach the keeper does not exit 0 (launch: CHECKPOINT_NOT_KEPT, retried).

- a new checkpoint directory is sent once, whole (keeper_client.upload); it counts as sent
  only when the keeper committed it;
- a checkpoint set aside here (resume's `.bad`, keep-apart's `.previous-TIME`) is set aside
  on the keeper too: renamed, never deleted, never sent again; keep-apart sets aside the
  keeper's other checkpoints as well (another run's, which this pod never fetched);
- a checkpoint pruned here to checkpoint.keep stays on the keeper: only the keeper prunes;
- a loose file is sent when its size and time stayed the same for QUIET_SECONDS and while its
  digest was taken; one this pod fetched or sent that is gone here is removed there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from kubeddp.trainer import constants
from kubeddp.trainer.checkpoint_digest import DigestError, digest_file, read_marker
from kubeddp.trainer.keeper import local_dir as keeper_local
from kubeddp.trainer.keeper.auth import secret_from_env
from kubeddp.trainer.keeper.client import (
    Fetch,
    FetchFailed,
    KeeperAuthError,
    KeeperClient,
    KeeperError,
    KeeperRefused,
    KeeperSettingError,
)
from kubeddp.trainer.keeper.local_dir import SYNC_PREFIX, LocalView, Stamp, stamp
from kubeddp.trainer.keeper.protocol import (
    ASIDE_SUFFIX,
    MARKER,
    FileEntry,
    Listing,
    Upload,
    checkpoint_shaped,
    link_target_inside,
    step_of,
)
from kubeddp.trainer.keeper.reach import SAY_EVERY_SECONDS, say_seconds, wait_for_keeper
from kubeddp.trainer.launcher.retry_budget import RECORD_DIR, progress_marker

__all__ = ["KeeperAuthError", "KeeperError", "KeeperSettingError", "CheckpointSync"]

DEFAULT_SYNC_SECONDS = 2.0
QUIET_SECONDS = 0.5  # a file unchanged this long (and while hashed) is taken as written whole
FINISHED_RECORD = f"{RECORD_DIR}/_finished.json"
Log = Callable[[str], None]
T = TypeVar("T")


@dataclass
class SyncSettings:
    reads: bool  # this pod reads checkpoints (and a script's files): it fetches them
    keep: int | None = None  # checkpoint.keep, for the keeper's pruning
    pod: str = ""  # this pod's host name: its own retry record


@dataclass
class CheckpointSync:
    """One pod's view: what it fetched or sent, so it sends only what is new."""

    client: KeeperClient
    root: Path
    log: Log
    settings: SyncSettings = field(default_factory=lambda: SyncSettings(reads=True))
    units: set[str] = field(default_factory=set)  # on the keeper as this pod knows them
    sent: dict[str, Stamp] = field(default_factory=dict)  # loose files as last fetched/sent
    links: dict[str, str] = field(default_factory=dict)  # links as last fetched/sent
    said: set[str] = field(default_factory=set)  # refusals said once
    unsent: set[str] = field(default_factory=set)  # what the last push could not send
    listing: Listing | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _last_failure_said: float = 0.0

    # ---- fetching ----------------------------------------------------------------------------
    def fill(self) -> str | None:
        """Fetch what this pod reads; a line saying what was fetched (None: nothing)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self._lock:
            listing = self.client.listing()
            self.listing = listing
            files = self._fetch_loose(listing, self._wanted(listing), keep_own=False)
            self._fetch_links(listing)
            chosen = self._fetch_newest(listing) if self.settings.reads else None
        if not files and chosen is None:
            return None
        size = sum(listing.files[rel][1].digest.size for rel in files)
        if chosen is not None:
            size += sum(e.digest.size for e in listing.units[chosen][1].values())
        what = f"checkpoint {chosen}" if chosen else "no checkpoint"
        return f"{what} and {len(files)} other file(s), {size / 1e6:.1f} MB"

    def _wanted(self, listing: Listing) -> list[str]:
        """The loose files this pod fetches: its own records always; the rest where read."""
        own = {f"{RECORD_DIR}/{self.settings.pod}.json", FINISHED_RECORD}
        others = (RECORD_DIR, ".kubeddp-diagnostics")  # other pods' records, stall reports
        return sorted(
            rel
            for rel in listing.files
            if rel in own or (self.settings.reads and rel.split("/")[0] not in others)
        )

    def _fetch_loose(self, listing: Listing, wanted: list[str], keep_own: bool) -> list[str]:
        """Fetch the files of `wanted` that differ here (each staged, then renamed in).
        `keep_own` (a pod rejoining without a restart): a file written here since it was last
        sent or fetched is this pod's newer write, kept for the next push, never overwritten
        by the keeper's older copy."""
        done = []
        for rel in wanted:
            version, entry = listing.files[rel]
            there = (entry.digest.size, entry.mtime_ns)
            here = stamp(self.root / rel)
            if here == there:
                self._synced(rel, there)
                continue
            if keep_own and here is not None and here != self.sent.get(rel):
                continue
            staging = self.root / f"{SYNC_PREFIX}{uuid.uuid4().hex}"
            try:
                self.client.fetch([Fetch(rel, version, entry, staging)])
                keeper_local.place(self.root, staging.name, rel)
            except OSError as exc:  # a part of its path is a link or a file here
                self._say_once(f"fetch:{rel}", f"not fetched: {rel}: {exc.strerror or exc} "
                               "(a part of its path here is a link or a file)")  # fmt: skip
                continue
            finally:
                staging.unlink(missing_ok=True)
            self._synced(rel, there)
            done.append(rel)
        return done

    def _synced(self, rel: str, there: Stamp) -> None:
        """The keeper holds what is here: nothing of `rel` is owed."""
        self.sent[rel] = there
        self.unsent.discard(rel)

    def _fetch_links(self, listing: Listing) -> None:
        if not self.settings.reads:
            return
        for rel, target in listing.links.items():
            if not link_target_inside(rel, target) or checkpoint_shaped(rel):
                self._say_once(f"link:{rel}", f"not recreated: the keeper lists {rel} -> "
                               f"{target[:200]!r}, which leaves checkpoint.dir or lies in a "
                               "checkpoint (someone wrote the keeper's volume)")  # fmt: skip
                continue
            path = self.root / rel
            if os.path.islink(path) and os.readlink(path) == target:
                self.links[rel] = target
                continue
            if os.path.lexists(path) and not os.path.islink(path):
                continue  # a file or directory of this pod's has the name: it wins
            try:
                keeper_local.place_link(self.root, rel, target, f"{SYNC_PREFIX}{uuid.uuid4().hex}")
            except OSError as exc:  # a part of its path is a link or a file here
                self._say_once(f"link:{rel}", f"not recreated: {rel}: {exc.strerror or exc}")
                continue
            self.links[rel] = target

    def _fetch_newest(self, listing: Listing) -> str | None:
        """The newest checkpoint whose every file matches its digests (an older one only when
        the newest does not: a corrupt copy on the keeper's disk)."""
        for name in newest_first(listing.units):
            if (self.root / name / MARKER).is_file():
                self.units.add(name)
                return name  # already here (a container restarted in place)
            version, files = listing.units[name]
            try:
                self._fetch_unit(name, version, files)
                return name
            except FetchFailed as exc:
                self.log(f"[kubeddp] checkpoint keeper: {name} failed its check ({exc}); "
                         "trying the previous checkpoint")  # fmt: skip
        return None

    def _fetch_unit(self, name: str, version: str, files: Mapping[str, FileEntry]) -> None:
        """One checkpoint, staged beside and then renamed: never part of a checkpoint in place."""
        staging = self.root / f"{SYNC_PREFIX}{uuid.uuid4().hex}"
        try:
            self.client.fetch([Fetch(rel, version, e, staging / rel) for rel, e in files.items()])
            target = self.root / name
            if os.path.islink(target) or (os.path.lexists(target) and not target.is_dir()):
                target.unlink()  # a link is removed, never followed
            elif os.path.lexists(target):
                shutil.rmtree(target)
            os.replace(staging / name, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self.units.add(name)

    def refresh(self) -> list[str]:
        """Before this pod rejoins a new group without restarting: fetch what the keeper got
        since (another pod's rank 0 wrote it), so the ranks that read start from it."""
        with self._lock:
            listing = self.client.listing()
            self.listing = listing
            done = self._fetch_loose(listing, self._wanted(listing), keep_own=True)
            if self.settings.reads:
                newest = next(iter(newest_first(listing.units)), None)
                if newest and not (self.root / newest / MARKER).is_file():
                    chosen = self._fetch_newest(listing)
                    done += [chosen] if chosen else []
        if done:
            self.log(f"[kubeddp] checkpoint keeper: fetched {', '.join(done)} before rejoining")
        return done

    def progress_ns(self) -> int:
        """The newest time a checkpoint or file was written, here or on the keeper (the retry
        budget's progress: a pod that reads no checkpoint sees the others' progress there)."""
        with contextlib.suppress(KeeperError):  # else the last listing
            self.listing = self.client.listing()
        there = self.listing.newest_mtime_ns() if self.listing else 0
        return max(there, progress_marker(self.root))

    # ---- sending -----------------------------------------------------------------------------
    def push(self, final: bool = False) -> list[str]:
        """Send what is new, remove what is gone; returns what was sent, set aside or removed."""
        with self._lock:
            view = keeper_local.scan(self.root)
            self.unsent &= set(view.units) | set(view.loose)  # what is gone is not owed
            self._say_refused(view)
            done = self._set_aside(view)
            done += self._send_units(view)
            done += self._send_loose(view, final)
            done += self._send_links(view)
            return done

    def _say_refused(self, view: LocalView) -> None:
        for rel, why in sorted(view.refused.items()):
            if rel not in self.said:
                self.said.add(rel)
                self.log(f"[kubeddp] checkpoint keeper: not kept: {self.root}/{rel}: {why}")

    def _say_once(self, key: str, line: str) -> None:
        if key not in self.said:
            self.said.add(key)
            self.log(f"[kubeddp] checkpoint keeper: {line}")

    def _set_aside(self, view: LocalView) -> list[str]:
        """Checkpoints this pod knew that are gone here: set aside here -> set aside there;
        pruned here -> left to the keeper's own pruning."""
        done = []
        for name in sorted(self.units - set(view.units)):
            moved = [
                n for n in view.units if n.startswith(name) and ASIDE_SUFFIX.match(n[len(name) :])
            ]
            self.units.discard(name)
            for new in moved[:1]:
                self.client.aside(name, new)
                self.units.add(new)
                done.append(f"{name} -> {new}")
                if ".previous-" in new:  # keep-apart: the keeper's others are that run's too
                    done += self._keep_apart(view, new[len(name) :])
        return done

    def _keep_apart(self, view: LocalView, suffix: str) -> list[str]:
        done = []
        for other in newest_first(self.client.listing().units):
            if other not in view.units and self.client.aside(other, other + suffix):
                self.units.add(other + suffix)
                done.append(f"{other} -> {other}{suffix}")
        return done

    def _send_units(self, view: LocalView) -> list[str]:
        done = []
        for name in sorted(set(view.units) - self.units, key=lambda n: (step_of(n) or -1, n)):
            try:
                upload = unit_upload(self.root, name, view.units[name], self.settings.keep)
                pruned = self.client.upload(upload, {rel: self.root / rel for rel in upload.files})
            except (KeeperRefused, DigestError, OSError) as exc:
                self.unsent.add(name)
                self._say_once(f"unit:{name}", f"{name} was not kept: {exc}")
                continue
            self.units.add(name)
            self.unsent.discard(name)
            done.append(name)
            done += [f"-{old}" for old in pruned]
        return done

    def _send_loose(self, view: LocalView, final: bool) -> list[str]:
        done = []
        changed = [
            rel
            for rel, st in sorted(view.loose.items())
            if self.sent.get(rel) != st or rel in self.unsent
        ]
        changed.sort(key=lambda rel: rel == FINISHED_RECORD)  # last: see below
        if changed and not final:
            time.sleep(QUIET_SECONDS)  # a file still being written changes meanwhile
        for rel in changed:
            if rel == FINISHED_RECORD and self.unsent:
                continue  # "finished" only once everything else is kept: else a late pod
                # would end at once though the last checkpoint never reached the keeper
            entry = _quiet_entry(self.root / rel, view.loose[rel], final)
            if entry is None:
                self.unsent.add(rel)
                continue  # being written: the next interval tries again
            try:
                self.client.upload(Upload("file", rel, {rel: entry}, None), {rel: self.root / rel})
            except KeeperRefused as exc:  # changed while sent, or the keeper's disk is full
                self.unsent.add(rel)
                self._say_once(f"file:{rel}", f"{rel} was not kept: {exc}")
                continue
            self.sent[rel] = view.loose[rel]
            self.unsent.discard(rel)
            done.append(rel)
        for rel in sorted(set(self.sent) - set(view.loose)):
            self.client.delete(rel)
            del self.sent[rel]
            done.append(f"-{rel}")
        return done

    def _send_links(self, view: LocalView) -> list[str]:
        done = []
        for rel, target in sorted(view.links.items()):
            if self.links.get(rel) != target:
                self.client.link(rel, target)
                self.links[rel] = target
                done.append(f"{rel} -> {target}")
        for rel in sorted(set(self.links) - set(view.links)):
            self.client.delete(rel)
            del self.links[rel]
            done.append(f"-{rel}")
        return done

    def pending_bytes(self) -> int:
        """What a final push would send: new checkpoints and changed files, in bytes."""
        view = keeper_local.scan(self.root)
        new_units = set(view.units) - self.units
        units = sum(size for name in new_units for size, _ in view.units[name].values())
        return units + sum(st[0] for rel, st in view.loose.items() if self.sent.get(rel) != st)

    # ---- the thread and the end --------------------------------------------------------------
    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                for item in self.push():
                    self.log(f"[kubeddp] checkpoint keeper: {_said(item)}")
            except KeeperError as exc:  # the next interval tries again
                self._say_failure(exc)
            except Exception as exc:  # noqa: BLE001 - the sync thread must outlive any file
                self._say_failure(exc)

    def _say_failure(self, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._last_failure_said >= SAY_EVERY_SECONDS:
            self._last_failure_said = now
            self.log(f"[kubeddp] checkpoint keeper: send failed, will retry: {exc}; check "
                     f"{keeper_name(self.client.url)}'s pod and its claim")  # fmt: skip

    def start(self, interval: float) -> None:
        self._thread = threading.Thread(
            target=self._loop, args=(interval,), name="kubeddp-checkpoint-sync", daemon=True
        )
        self._thread.start()

    def finish(self, deadline_seconds: float) -> bool:
        """Stop the thread and send the rest, again until the deadline; False when a checkpoint
        or a file (kubeddp's own records aside) is not on the keeper by then."""
        end = time.monotonic() + deadline_seconds
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=deadline_seconds)
        while True:
            try:
                for item in self.push(final=True):
                    self.log(f"[kubeddp] checkpoint keeper: {_said(item)}")
                missing = sorted(r for r in self.unsent if not r.startswith(".kubeddp"))
                if not missing:
                    return True
                problem: object = f"{', '.join(missing[:3])} not sent"
            except Exception as exc:  # noqa: BLE001 - said in the line below
                problem = exc
            if time.monotonic() > end:
                self.log(f"[kubeddp] checkpoint keeper: the last checkpoint or files did not reach "
                         f"the keeper within {deadline_seconds:.0f} s: {problem}")  # fmt: skip
                return False
            time.sleep(1.0)


def unit_upload(root: Path, name: str, files: Mapping[str, Stamp], keep: int | None) -> Upload:
    """A checkpoint directory as an upload: digests from its COMPLETE marker where it lists
    them (the writer's), taken here for the rest (an older marker, the marker itself)."""
    recorded = read_marker((root / name / MARKER).read_text(errors="replace")) or {}
    entries = {}
    for rel, (size, mtime) in files.items():
        inside = rel[len(name) + 1 :]
        digest = recorded.get(inside)
        if digest is None or digest.size != size:
            digest = digest_file(root / rel)
        entries[rel] = FileEntry(digest, mtime)
    return Upload("unit", name, entries, keep)


def _quiet_entry(path: Path, seen: Stamp, final: bool) -> FileEntry | None:
    """The file's digest when it is not being written: the same size and time at the scan
    (unless final), before and after the digest. A script's torch.save rewrites its file in
    place; the keeper checks every block again, so a change while sending is refused there."""
    before = stamp(path)
    if before is None or (not final and before != seen):
        return None
    try:
        digest = digest_file(path)
    except OSError:
        return None
    return FileEntry(digest, before[1]) if stamp(path) == before else None


def newest_first(units: Mapping[str, object]) -> list[str]:
    """Checkpoint directories (`ckpt-N`; set-aside ones are not) newest first."""
    found = sorted(((step, name) for name in units if (step := step_of(name)) is not None),
                   reverse=True)  # fmt: skip
    return [name for _, name in found]


def _said(item: str) -> str:
    if item.startswith("-"):
        return f"removed {item[1:]}"
    return f"set aside {item}" if " -> " in item else f"sent {item}"


def keeper_name(url: str) -> str:
    return url.split("://", 1)[-1].split(":", 1)[0].split(".", 1)[0]


def within(deadline_seconds: float, log: Log, call: Callable[[], T]) -> T:
    """`call()`, again after a keeper failure until the deadline: a keeper that answered its
    health check can still drop a connection while the pod network settles (seen with 33 pods
    starting at once, and again when they rejoined: "No route to host"), and one lost fetch must
    not cost a pod restart. A refusal of this pod's secret is not retried."""
    end = time.monotonic() + deadline_seconds
    while True:
        try:
            return call()
        except KeeperAuthError:
            raise
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


def client_from_env(env: Mapping[str, str]) -> KeeperClient | None:
    """The keeper's client when the manifest names a keeper (KeeperSettingError for a bad
    address or secret file)."""
    url = env.get(constants.ENV_CHECKPOINT_KEEPER)
    if not url:
        return None
    try:
        secret = secret_from_env(env)
    except ValueError as exc:
        raise KeeperSettingError(str(exc)) from None
    return KeeperClient(url, secret)


def start_from_env(
    env: Mapping[str, str],
    checkpoint_dir: str,
    deadline_seconds: float,
    log: Log,
    settings: SyncSettings,
    unreachable_limit: int = 0,
) -> CheckpointSync | None:
    """None unless the manifest names a keeper; else checkpoint.dir filled and the thread on."""
    client = client_from_env(env)
    if client is None:
        return None
    interval = sync_seconds(env)
    wait_for_keeper(client, deadline_seconds, log, unreachable_limit, say_seconds(env))
    end = time.monotonic() + deadline_seconds
    client.log = log
    sync = CheckpointSync(client, Path(checkpoint_dir), log, settings)
    client.deadline = end  # every exchange of the start ends within the pod's budget
    try:
        fetched = within(max(0.0, end - time.monotonic()), log, sync.fill)
    finally:
        client.deadline = None
    log(
        f"[kubeddp] checkpoint keeper {client.url}: "
        + (f"fetched {fetched} into {checkpoint_dir}" if fetched else "nothing fetched")
        + ("" if settings.reads else " (this pod reads no checkpoint: the pod of rank 0 does)")
    )
    sync.start(interval)
    return sync
