"""Small helpers the launcher and the workers both use (neither room owns them)."""

from __future__ import annotations

import os
import socket
from importlib import metadata
from pathlib import Path

from kubeddp.trainer import constants


def one_line(exc: BaseException) -> str:
    """`TypeName: first line of the message` (a gloo/NCCL message can run over many lines)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def this_pod() -> str:
    """`pod P, node N` (the downward API's names; the host name outside Kubernetes): where a
    stalled or slow rank runs."""
    pod = os.environ.get(constants.ENV_POD_NAME) or socket.gethostname()
    node = os.environ.get(constants.ENV_NODE_NAME)
    return f"pod {pod}, node {node}" if node else f"pod {pod}"


def installed_torch_version() -> str | None:
    """The installed torch's version from its distribution metadata (no torch import, and no
    attribute that only some torch versions have); None for a torch without metadata."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def proc_stat(pid: int | str) -> list[str] | None:
    """Fields 3 and on of /proc/PID/stat (proc(5); the name before them may hold spaces), None
    where the process is gone or there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()
