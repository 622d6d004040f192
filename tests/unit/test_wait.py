"""The wait for the rendezvous host, with real sockets on loopback."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from kubeddp.trainer.launcher.wait import RendezvousHostUnreachable, wait_for_host
from tests.helpers.ports import free_port

pytestmark = pytest.mark.timeout(60)
UNRESOLVABLE = "demo-master-0.kubeddp-test.invalid"  # .invalid never resolves (RFC 6761)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        yield s
    finally:
        s.close()


def test_open_port_returns_at_once(listener: socket.socket) -> None:
    logged: list[str] = []
    port = listener.getsockname()[1]
    wait_for_host("127.0.0.1", port, deadline_seconds=10, log=logged.append)
    assert logged == []  # nothing to wait for, nothing printed


def test_port_that_opens_later_is_waited_for() -> None:
    port = free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    timer = threading.Timer(1.0, lambda: (server.bind(("127.0.0.1", port)), server.listen()))
    timer.start()
    logged: list[str] = []
    try:
        wait_for_host("localhost", port, 30, log=logged.append, poll_seconds=0.1)
    finally:
        timer.cancel()
        server.close()
    assert len(logged) == 1 and f"localhost:{port} (TCP port)" in logged[0]


def test_closed_port_fails_naming_host_and_port() -> None:
    port = free_port()
    with pytest.raises(RendezvousHostUnreachable) as err:
        wait_for_host("127.0.0.1", port, 1, log=lambda _: None, poll_seconds=0.1)
    message = str(err.value)
    assert f"127.0.0.1:{port} does not accept on port {port} after 1s" in message
    assert "\n" not in message and "KUBEDDP_RDZV_WAIT_SECONDS" in message


def test_unresolvable_name_fails_at_the_dns_step() -> None:
    with pytest.raises(RendezvousHostUnreachable, match=f"{UNRESOLVABLE}:23456 does not resolve"):
        wait_for_host(UNRESOLVABLE, 23456, 1, log=lambda _: None, poll_seconds=0.1)


def test_dns_only_when_port_is_not_checked() -> None:
    # The node that hosts the store only needs its own name to resolve.
    wait_for_host("localhost", free_port(), 5, check_port=False, log=lambda _: None)
