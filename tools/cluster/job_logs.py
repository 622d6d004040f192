"""`kubeddp logs`: the job's pod logs, each line prefixed with its pod; with `follow`, the job
as its pods come and go until the job ends.

Following (like `stern` or `kubectl logs -f -l ... --prefix`, but for the whole life of the
job): the job's pods are listed every few seconds; a pod that is new (a recreated pod has a new
uid, even under its old name), or whose container restarted in place, gets a stream of its
own; a stream ends with its container. When the job has Succeeded or Failed, the streams still
open get END_GRACE_SECONDS to end (a pod whose peers finished may linger), then are closed.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from kubeddp.tools.cluster.job_lookup import NOT_FOUND, FoundJob
from kubeddp.tools.cluster.job_status import mapping, terminal_state
from kubeddp.tools.cluster.kube import Cluster, KubeError, object_path
from kubeddp.tools.cluster.kube_errors import StreamBroken
from kubeddp.tools.cluster.kube_transport import LogStream
from kubeddp.tools.cluster.terminal_text import printable
from kubeddp.tools.manifests.kinds import JobKind
from kubeddp.tools.manifests.resources import POD

POLL_SECONDS = 2.0  # how often a follow looks for new pods and the job's end
END_GRACE_SECONDS = 10.0
RESUME_AFTER_SECONDS = 30.0  # a stream cut after this long while its container runs: resumed
# The API server's `timestamps=true` prefix (RFC 3339, nanoseconds).
_STAMPED = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z (.*)$", re.DOTALL)
StreamKey = tuple[str, int]  # (pod uid, or its name without one; the container's restarts)


@dataclass(frozen=True)
class LogLine:
    pod: str
    text: str  # without terminal control sequences (tools/cluster/terminal_text.py)

    def __str__(self) -> str:
        return f"[{self.pod}] {self.text}"


def selector(kind: JobKind, job: dict, name: str, replica: str | None, rank: int | None) -> str:
    """The label selector of the job's pods, narrowed to a replica type or index, or to the
    pod of one node rank."""
    parts = [f"{kind.job_name_label}={name}"]
    if replica is not None:
        parts.append(kind.replica_selector(replica))
    if rank is not None:
        parts.append(kind.node_rank_selector(job, rank))
    return ",".join(parts)


def read_logs(
    cluster: Cluster, kind: JobKind, pods: list[str], tail: int | None
) -> Iterator[LogLine]:
    """Each pod's log as it is now (the last `tail` lines of each)."""
    for pod in pods:
        for line in cluster.pod_log(pod, kind.container, tail).splitlines():
            yield LogLine(pod, printable(line))


def no_pods(kind: JobKind, name: str, namespace: str) -> KubeError:
    return KubeError(
        f"no pods of {kind.resource.kind} {name!r} in namespace {namespace!r} yet; check "
        f"kubeddp status {name}"
    )


def _stamp(text: str) -> tuple[tuple[str, int] | None, str]:
    """(when, the line): the API server's timestamp, as a sortable pair, taken off the line."""
    found = _STAMPED.match(text)
    if not found:
        return None, text
    nanos = int((found.group(2) or "0").ljust(9, "0"))
    return (found.group(1), nanos), found.group(3)


@dataclass
class _Ended:
    key: StreamKey
    pod: str
    last: tuple[str, int] | None  # the newest line's timestamp
    lasted: float  # seconds the stream was open
    error: KubeError | None = None


class _Stream(threading.Thread):
    """One pod container's followed log, its lines put on the follower's queue."""

    def __init__(
        self, follower: Follower, key: StreamKey, pod: str, query: list, after: tuple | None
    ) -> None:
        super().__init__(daemon=True, name=f"kubeddp-log-{pod}")
        self.follower, self.key, self.pod, self.query, self.after = follower, key, pod, query, after
        self.opened: LogStream | None = None
        self.closing = threading.Event()

    def run(self) -> None:
        cluster, started, last = self.follower.cluster, time.monotonic(), self.after
        error = None
        try:
            path = f"{object_path(POD, cluster.namespace, self.pod)}/log"
            self.opened = stream = cluster.stream(path, self.query)
            if self.closing.is_set():  # closed while it connected
                stream.close()
            for raw in stream:
                for text in raw.decode(errors="replace").splitlines():
                    when, line = _stamp(text)
                    if when is not None and last is not None and when <= last:
                        continue  # already shown before the stream was resumed
                    last = when or last
                    self.follower.lines.put(LogLine(self.pod, printable(line)))
        except KubeError as exc:
            error = exc
        except StreamBroken:
            pass  # resumed at the next look, if the container still runs
        lasted = time.monotonic() - started
        self.follower.lines.put(_Ended(self.key, self.pod, last, lasted, error))

    def close(self) -> None:
        self.closing.set()
        if self.opened is not None:
            self.opened.close()


def _container_state(pod: dict, container: str) -> tuple[int, str]:
    """(restart count, 'running' | 'terminated' | 'waiting') of the job's container; the pod's
    phase says it when the container's state is not given."""
    restarts, state = 0, {}
    for status in mapping(pod.get("status")).get("containerStatuses") or []:
        if isinstance(status, dict) and status.get("name") in (container, None):
            restarts, state = int(status.get("restartCount") or 0), mapping(status.get("state"))
            break
    for now in ("running", "terminated", "waiting"):
        if now in state:
            return restarts, now
    phase = str(mapping(pod.get("status")).get("phase"))
    ended = phase in ("Succeeded", "Failed")
    return restarts, "running" if phase == "Running" else "terminated" if ended else "waiting"


class Follower:
    """`kubeddp logs --follow`: see the module's docstring."""

    def __init__(
        self, cluster: Cluster, found: FoundJob, name: str, pod_selector: str, tail: int | None
    ) -> None:
        self.cluster, self.kind, self.name = cluster, found.kind, name
        self.pod_selector, self.tail = pod_selector, tail
        self.lines: queue.Queue[LogLine | _Ended] = queue.Queue()
        self.open: dict[StreamKey, _Stream] = {}
        self.ended: dict[StreamKey, _Ended] = {}
        self.first_look = True

    def lines_until_the_end(self) -> Iterator[LogLine]:
        ends_at = None
        try:
            while True:
                finished = self._job_finished()
                pods = self.cluster.list_pods(self.pod_selector)
                if self.first_look and not pods and finished:
                    raise no_pods(self.kind, self.name, self.cluster.namespace)
                self._open_streams(pods)
                self.first_look = False
                if finished and ends_at is None:
                    ends_at = time.monotonic() + END_GRACE_SECONDS
                if ends_at is not None and (not self.open or time.monotonic() >= ends_at):
                    self._close_all()
                    yield from self._take(0.0, until_all_ended=True)
                    return
                yield from self._take(POLL_SECONDS, until_idle=ends_at is not None)
        finally:
            self._close_all()

    def _job_finished(self) -> bool:
        try:
            job = self.cluster.get(self.kind.resource, self.name)
        except KubeError as exc:
            if exc.status == NOT_FOUND:
                return True  # deleted: nothing more will come
            raise
        return terminal_state(self.kind, job) is not None

    def _open_streams(self, pods: list[dict]) -> None:
        for pod in pods:
            meta = pod["metadata"]
            restarts, state = _container_state(pod, self.kind.container)
            key = (str(meta.get("uid") or meta["name"]), restarts)
            if state == "waiting" or key in self.open:
                continue
            ended = self.ended.get(key)
            resume = (
                ended is not None
                and state == "running"
                and ended.last is not None
                and ended.lasted >= RESUME_AFTER_SECONDS
            )
            if ended is not None and not resume:
                continue
            self._start(key, meta["name"], ended.last if ended else None)

    def _start(self, key: StreamKey, pod: str, after: tuple[str, int] | None) -> None:
        query: list[tuple[str, object]] = [
            ("container", self.kind.container),
            ("follow", "true"),
            ("timestamps", "true"),
        ]
        if after is not None:
            query.append(("sinceTime", f"{after[0]}Z"))
        elif self.first_look and self.tail is not None:
            query.append(("tailLines", self.tail))  # pods that join later: every line is new
        self.ended.pop(key, None)
        self.open[key] = stream = _Stream(self, key, pod, query, after)
        stream.start()

    def _take(
        self, seconds: float, until_all_ended: bool = False, until_idle: bool = False
    ) -> Iterator[LogLine]:
        """The lines that come within `seconds`, or sooner once no stream is open and
        `until_idle`; `until_all_ended`: until every open stream has ended, waiting at most
        END_GRACE_SECONDS for each next line."""
        deadline = time.monotonic() + seconds
        while True:
            if until_idle and not self.open and self.lines.empty():
                return
            if until_all_ended:
                if not self.open and self.lines.empty():
                    return
                wait = END_GRACE_SECONDS
            else:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    return
            try:
                item = self.lines.get(timeout=wait)
            except queue.Empty:
                return
            if isinstance(item, LogLine):
                yield item
                continue
            self.open.pop(item.key, None)
            if item.error is None:
                self.ended[item.key] = item
            elif item.error.status not in (400, NOT_FOUND):  # 400: not started; 404: gone
                raise item.error  # forbidden, the server gone: following cannot go on

    def _close_all(self) -> None:
        for stream in list(self.open.values()):
            stream.close()
