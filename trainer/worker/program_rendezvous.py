"""A user's program meets torchrun's rendezvous store only where torchrun put it.

torchrun's agent shares its TCPStore with the workers (it sets TORCHELASTIC_USE_AGENT_STORE=True
for them): every rank's init_process_group then connects to the store's address as a client,
and no rank serves one. A program that names its own rendezvous, as the tutorials teach it
(`init_method="tcp://127.0.0.1:23456"`, or a MASTER_PORT it sets itself), then waits for a
server nobody starts until its init timeout (30 minutes by default), even on one node. The
runner wraps init_process_group: a call whose port is not the agent store's runs with
TORCHELASTIC_USE_AGENT_STORE=False, so the program's rank 0 serves its own store there, as it
does under `python` or a torchrun that shares no store. A call on the agent's port (env://, the
default) is left as it is.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

# Imported in functions: torch.distributed: `kubeddp train --help` imports this module and must not
# import torch (tests/unit/test_torchrun_args.py).

AGENT_STORE_VAR = "TORCHELASTIC_USE_AGENT_STORE"


def store_port(init_method: object, store: object, env: dict[str, str]) -> str | None:
    """The port init_process_group's rendezvous will use (None: no TCP store of its own: a
    `store=` given, `file://`, or a URL without a port)."""
    if store is not None:
        return None
    url = urlparse(str(init_method or "env://"))
    if url.scheme == "tcp":
        with contextlib.suppress(ValueError):
            return str(url.port) if url.port is not None else None
        return None
    return env.get("MASTER_PORT") if url.scheme == "env" else None


@contextlib.contextmanager
def _own_store() -> Iterator[None]:
    before = os.environ.get(AGENT_STORE_VAR)
    os.environ[AGENT_STORE_VAR] = "False"  # rank 0 serves the store (torch reads it per call)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(AGENT_STORE_VAR, None)
        else:
            os.environ[AGENT_STORE_VAR] = before


def install() -> None:
    """Wrap torch.distributed.init_process_group before the program imports it (nothing to do
    unless this worker was told to share the agent's store)."""
    if os.environ.get(AGENT_STORE_VAR) != str(True):
        return
    agent_port = os.environ.get("MASTER_PORT")
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    original = distributed_c10d.init_process_group
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        try:
            given = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:  # torch says what is wrong with the call
            return original(*args, **kwargs)
        port = store_port(given.get("init_method"), given.get("store"), dict(os.environ))
        if port is None or port == agent_port:
            return original(*args, **kwargs)
        with _own_store():
            return original(*args, **kwargs)

    dist.init_process_group = distributed_c10d.init_process_group = init_process_group
