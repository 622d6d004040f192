"""A total deadline on a network exchange, not only a timeout per read.

A socket timeout bounds each read: a server that sends one byte every few seconds (a drip-fed
answer, a proxy that trickles, a stalled peer) keeps every read within it and the exchange
going for ever. Every exchange kubeddp makes (the checkpoint keeper's client, S3, the TrainJob
status endpoint, the Kubernetes API) therefore also has a deadline for the whole of it:

- `exchange(seconds, what, cancel)`: the exchange runs in the calling thread; when the deadline
  passes, one watchdog thread calls `cancel` (shut the connection's socket down: the read that
  waits returns at once; `shut_connection` for http.client) and the exchange ends with
  DeadlineExceeded naming `what`;
- `call_within(seconds, what, fn)`: for a library that owns its connections (botocore, the
  kubernetes client's pool): `fn` runs in a daemon thread and the caller stops waiting at the
  deadline (DeadlineExceeded); the abandoned call ends with its connection or its process.

No torch here: the keeper's pod imports this.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


class DeadlineExceeded(TimeoutError):
    """An exchange did not end within its deadline; the message names it and the seconds."""


@dataclass(order=True)
class _Entry:
    at: float
    order: int
    cancel: Callable[[], None] = field(compare=False)
    fired: bool = field(default=False, compare=False)
    done: bool = field(default=False, compare=False)


class _Watchdog:
    """One daemon thread that calls each entry's `cancel` at its time, unless it is done."""

    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._lock = threading.Condition()
        self._count = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, seconds: float, cancel: Callable[[], None]) -> _Entry:
        entry = _Entry(time.monotonic() + max(0.0, seconds), next(self._count), cancel)
        with self._lock:
            heapq.heappush(self._heap, entry)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="kubeddp-deadlines", daemon=True
                )
                self._thread.start()
            self._lock.notify()
        return entry

    def done(self, entry: _Entry) -> None:
        with self._lock:
            entry.done = True

    def _run(self) -> None:
        while True:
            with self._lock:
                while self._heap and self._heap[0].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._lock.wait()
                    continue
                entry = self._heap[0]
                left = entry.at - time.monotonic()
                if left > 0:
                    self._lock.wait(left)
                    continue
                heapq.heappop(self._heap)
                entry.fired = True
            with contextlib.suppress(Exception):  # a cancel that fails leaves the exchange
                entry.cancel()


WATCHDOG = _Watchdog()


def shut(sock: socket.socket | None) -> None:
    """End every read and write on `sock` now, from any thread (the owner closes it)."""
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def shut_connection(connection: Any) -> Callable[[], None]:
    """The cancel of an exchange on an http.client connection: its socket, taken now (the
    connection hands it to the answer, and forgets it, when the server closes after it)."""
    if connection.sock is None:
        connection.connect()
    sock = connection.sock
    return lambda: shut(sock)


@contextlib.contextmanager
def exchange(seconds: float, what: str, cancel: Callable[[], None]) -> Iterator[None]:
    """The block is one exchange that must end within `seconds`: at the deadline `cancel` runs
    (from the watchdog thread) and the block's error, whatever the cut made of it, becomes
    DeadlineExceeded."""
    entry = WATCHDOG.add(seconds, cancel)
    try:
        yield
    except Exception as exc:
        if entry.fired:
            raise DeadlineExceeded(_said(what, seconds)) from exc
        raise
    finally:
        WATCHDOG.done(entry)
    if entry.fired:  # cut as it ended: what it read may be short
        raise DeadlineExceeded(_said(what, seconds))


def call_within(seconds: float, what: str, fn: Callable[[], T]) -> T:
    """`fn()`, or DeadlineExceeded once `seconds` passed (`fn` goes on in its daemon thread)."""
    result: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            failure.append(exc)

    worker = threading.Thread(target=run, name="kubeddp-exchange", daemon=True)
    worker.start()
    worker.join(max(0.0, seconds))
    if worker.is_alive():
        raise DeadlineExceeded(_said(what, seconds))
    if failure:
        raise failure[0]
    return result[0]


def _said(what: str, seconds: float) -> str:
    return f"{what} did not end within {seconds:.3g} s (an answer that never finishes)"
