"""How a block of a checkpoint lands where it is received (the keeper for a push, a pod for a
fetch): read from the connection into one buffer, hashed there (the only pass over its bytes
in Python), written in place. The sender never hashes: it sends with sendfile(2) and the digest
the writer recorded (trainer/checkpoint_digest.py).

Measured on a 2-core VM (docs/checkpoints.md): what a received GiB costs is the digest (BLAKE3:
0.15 CPU-s; SHA-256: 0.55), the kernel's copies (about 0.4) and little else. Two things cost
more than that and are avoided here:
- writes of 1 MiB into a new file took 1.2 to 1.8 CPU-s per GiB in the kernel (the page cache
  takes large folios for large writes, and here those came from memory the hypervisor had to
  back first); 256 KiB writes took 0.2, as `cp` does. Hence WRITE_BYTES.
- a file's bytes are handed to the disk as each block arrives (sync_file_range), so the fsync
  at commit waits for the last block's rather than for the whole checkpoint's.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable

from kubeddp.trainer.checkpoint_digest import new_hash

WRITE_BYTES = 256 << 10
SYNC_FILE_RANGE_WRITE = 2  # start writeback of dirty pages in the range; do not wait


def receive_block(
    read_into: Callable[[memoryview], int], fd: int, offset: int, size: int, algorithm: str
) -> str:
    """Read exactly `size` bytes with `read_into` (a readinto: 0 at the end of the stream) into
    `fd` at `offset`; their digest. A stream that ends early is a ConnectionError (the block
    comes again; its bytes never count)."""
    digest = new_hash(algorithm)
    view = memoryview(bytearray(min(WRITE_BYTES, max(size, 1))))
    left = size
    while left:
        got = read_into(view[: min(len(view), left)])
        if not got:
            raise ConnectionError(f"the block ended {left} bytes early")
        digest.update(view[:got])
        done = 0
        while done < got:
            done += os.pwrite(fd, view[done:got], offset + done)
        offset += got
        left -= got
    return digest.hexdigest()


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's sync_file_range (Linux glibc and musl; none elsewhere: the fsync does it all)."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: libc's
        call = libc.sync_file_range
        call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        call.restype = ctypes.c_int
        return call
    return None


_SYNC_FILE_RANGE = _sync_file_range()


def start_writeback(fd: int, offset: int, size: int) -> None:
    """Ask the kernel to start writing these bytes to the disk now (the fsync at commit then
    has less to wait for). Only a hint: a failure changes nothing."""
    if _SYNC_FILE_RANGE is not None and size:
        _SYNC_FILE_RANGE(fd, offset, size, SYNC_FILE_RANGE_WRITE)
