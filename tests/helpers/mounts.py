"""Small private filesystems for tests of full and read-only disks (root only)."""

from __future__ import annotations

import contextlib
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.privileges import require_root

REPO = Path(__file__).resolve().parents[2]


def _run(*argv: str) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")


@contextlib.contextmanager
def tmpfs(mountpoint: Path, size: str = "1m") -> Iterator[Path]:
    """A tmpfs of `size` at `mountpoint` (created), unmounted on exit even after a failure."""
    require_root("mount", "umount", what="a test that mounts a tmpfs")
    mountpoint.mkdir(parents=True, exist_ok=True)
    _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "kddp-test", str(mountpoint))
    try:
        yield mountpoint
    finally:
        # Lazy: a process that still has a file open there must not leave the mount behind.
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, timeout=30)


def remount_readonly(mountpoint: Path) -> None:
    _run("mount", "-o", "remount,ro", str(mountpoint))


def fill(directory: Path) -> Path:
    """Write zeros into `directory` until its filesystem is full; returns the filler file."""
    filler = directory / "filler"
    chunk = b"\0" * 4096
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):  # ENOSPC: full
        while f.write(chunk):
            pass
    return filler


def with_own_tmp(argv: list[str], *, readonly: bool = False, full: bool = False) -> list[str]:
    """`argv` run with a /tmp of its own: a 1 MiB tmpfs in a private mount namespace (the
    host's /tmp is untouched), read-only or filled to the last byte."""
    require_root("unshare", "mount", what="a test that gives a process its own /tmp")
    filler = "dd if=/dev/zero of=/tmp/filler bs=4k 2>/dev/null" if full else "true"
    # Read-only after the covering: a checkout under /tmp needs its mount point made first.
    ro = " && mount -o remount,ro /tmp" if readonly else ""
    script = f'{_covered_tmp("-o size=1m")}{ro} || exit 90; {filler}; exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv]


def alone(argv: list[str], own_tmp: bool = False) -> list[str]:
    """`argv` with a network of its own (a private network namespace, its loopback up): a
    program's fixed port cannot meet another test's. `own_tmp`: a tmpfs at /tmp in a private
    mount namespace too, for a program that writes a fixed /tmp path (its working directory
    must then not be under /tmp: a child that changes into it by name would not find it).
    Nothing is left on the host. Root only."""
    require_root("unshare", "mount", "ip", what="a test that runs a program on its own")
    tmp = f" && {_covered_tmp('-o size=256m')}" if own_tmp else ""
    script = f'ip link set lo up{tmp} && exec "$@"'
    return ["unshare", "--net", "--mount", "--propagation", "private", "sh", "-c", script,
            "sh", *argv]  # fmt: skip


def _covered_tmp(options: str) -> str:
    """Shell that mounts a tmpfs over /tmp in the private mount namespace; a checkout that
    lives under /tmp (`git clone . "$(mktemp -d)/p"`) is bound back at its path first through
    /mnt (in that namespace only), or its venv's python would be gone under the tmpfs."""
    mount = f"mount -t tmpfs {options} kddp-test /tmp"
    if not REPO.is_relative_to("/tmp"):
        return mount
    repo = shlex.quote(str(REPO))
    return (
        f"mount --bind /tmp /mnt && {mount} && mkdir -p {repo} && "
        f"mount --bind /mnt/{shlex.quote(str(REPO.relative_to('/tmp')))} {repo}"
    )
