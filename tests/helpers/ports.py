"""A TCP port for a test's server or rendezvous: one the kernel never hands out on its own.

A port from bind(("127.0.0.1", 0)) lies in the kernel's ephemeral range, from which every
outgoing connection on the machine also takes its local port: between the probe socket's close
and the server's bind, another process's connect could take it (EADDRINUSE in CI, where three
test processes and their workers connect all the time). A port below that range is only ever
taken by a process that asks for it by number.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000  # above the well-known and most registered services' ports
TRIES = 200
# Not the `random` module's own generator: pytest-randomly seeds it alike in every xdist
# process, which would make them all pick the same ports.
_PICK = random.SystemRandom()


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(span: int = 1) -> int:
    """A port free on 127.0.0.1 now, with the `span` - 1 ports above it (a rendezvous that
    opens its rounds on port + 1, port + 2), all below the ephemeral range."""
    top = max(LOWEST + 1, _ephemeral_start() - span)
    for _ in range(TRIES):
        port = _PICK.randrange(LOWEST, top)
        if all(_bindable(port + i) for i in range(span)):
            return port
    raise RuntimeError(f"no {span} free port(s) in a row below {top} after {TRIES} tries")
