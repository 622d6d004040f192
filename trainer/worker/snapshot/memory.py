"""Whether the pod's memory can hold a snapshot: the container's memory cgroup (what the kernel
OOM-kills at) and the volume the snapshots live on. A snapshot that would not fit is refused
in one line and training goes on without it, never an OOM kill."""

from __future__ import annotations

import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
# Left free beside a snapshot: the workers' own memory grows (data loader, allocator caches).
MARGIN_FRACTION = 0.10
MIN_MARGIN_BYTES = 128 << 20


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _stat(path: Path) -> dict[str, int]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    pairs = (line.split() for line in lines)
    return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}


def cgroup_headroom(root: Path = CGROUP) -> tuple[int, int] | None:
    """(bytes the cgroup may still take without reclaiming memory it cannot give back, its
    limit), or None without a limit. Page cache can be reclaimed; tmpfs pages (shmem) cannot."""
    limit = _read_int(root / "memory.max")  # cgroup v2
    if limit is not None:
        current = _read_int(root / "memory.current") or 0
        stat = _stat(root / "memory.stat")
        reclaimable = max(stat.get("file", 0) - stat.get("shmem", 0), 0)
    else:  # cgroup v1
        limit = _read_int(root / "memory" / "memory.limit_in_bytes")
        if limit is None or limit >= 1 << 62:  # v1 writes "no limit" as a huge number
            return None
        current = _read_int(root / "memory" / "memory.usage_in_bytes") or 0
        stat = _stat(root / "memory" / "memory.stat")
        reclaimable = max(stat.get("total_cache", 0) - stat.get("total_shmem", 0), 0)
    return max(limit - (current - reclaimable), 0), limit


def volume_free(path: Path) -> int:
    """Bytes free on the filesystem that holds `path` (a tmpfs's size is its limit)."""
    while not path.exists():
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def space_problem(path: Path, nbytes: int, cgroup: Path = CGROUP) -> str | None:
    """Why `nbytes` more in `path` would not fit, or None."""
    free = volume_free(path)
    if nbytes > free:
        return (
            f"{path} has {free / 2**20:.0f} MiB free and a snapshot takes {nbytes / 2**20:.0f} "
            "MiB: give /dev/shm more room (the chart's shmSize, `docker run --shm-size`)"
        )
    headroom = cgroup_headroom(cgroup)
    if headroom is None:
        return None
    room, limit = headroom
    margin = max(int(limit * MARGIN_FRACTION), MIN_MARGIN_BYTES)
    if nbytes + margin > room:
        return (
            f"the container's memory limit ({limit / 2**20:.0f} MiB) leaves {room / 2**20:.0f} "
            f"MiB, and a snapshot takes {nbytes / 2**20:.0f} MiB plus {margin / 2**20:.0f} MiB "
            "of margin: raise the memory limit (kubeddp render counts the snapshots in it)"
        )
    return None
