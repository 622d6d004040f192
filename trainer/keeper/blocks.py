"""How a block of a checkpoint lands where it is received (the keeper for a push, a pod for a
fetch): read from the connection into one buffer, hashed there (the only pass over its bytes
in Python), written in place. The sender never hashes: it sends with sendfile(2) and the digest
the writer recorded (trainer/checkpoint_digest.py).

Measured on a 2-core VM (docs/checkpoints.md): what a received GiB costs is the digest (BLAKE3:
0.15 CPU-s; SHA-256: 0.55), the kernel's copies and little else. What costs more than that is
avoided here:
- reads into a small buffer as the socket hands bytes over (85 KiB a read): a digest update, a
  write and a poll for each cost 0.3 user + 0.65 kernel CPU-s per GiB; the block is read into
  one 4 MiB buffer, reused, until it is full (0.17 + 0.45).
- writes of 1 MiB or more into a new file: 4 MiB writes took 2 CPU-s per GiB in the kernel (the
  page cache takes large folios for large writes, and here those came from memory the
  hypervisor had to back first); 256 KiB writes 0.45, as `cp` does. Hence WRITE_BYTES.
- a file's bytes are handed to the disk as they arrive (sync_file_range every
  WRITEBACK_BYTES), so dirty pages stay few and the fsync at commit waits for the last piece
  rather than for the whole checkpoint; the keeper also drops what it wrote from its page cache
  (its pod's memory limit is small, and the next read is a fetch minutes away).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable

from kubeddp.trainer.checkpoint_digest import new_hash

READ_BYTES = 4 << 20
WRITE_BYTES = 256 << 10
WRITEBACK_BYTES = 8 << 20
SYNC_FILE_RANGE_WAIT_BEFORE = 1  # wait for writeback already under way in the range
SYNC_FILE_RANGE_WRITE = 2  # start writeback of dirty pages in the range; do not wait
SYNC_FILE_RANGE_WAIT_AFTER = 4  # wait for the writeback just started
SYNC_FILE_RANGE_FLUSH = (
    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER
)


def receive_block(
    read_into: Callable[[memoryview], int],
    fd: int,
    offset: int,
    size: int,
    algorithm: str,
    keep_cached: bool = True,
) -> str:
    """Read exactly `size` bytes with `read_into` (a readinto: 0 at the end of the stream) into
    `fd` at `offset`; their digest. A stream that ends early is a ConnectionError (the block
    comes again; its bytes never count).

    Every WRITEBACK_BYTES written go to the disk at once (sync_file_range), so dirty pages stay
    few whatever the block's size. Unless `keep_cached` (a pod that fetches reads the file
    next), the pieces written are then dropped from the page cache one piece behind."""
    digest = new_hash(algorithm)
    buffer = _buffer()
    behind = Behind(fd, offset, keep_cached)
    left = size
    while left:
        want = min(len(buffer), left)
        got = 0
        while got < want:  # whole: one digest update and few writes per READ_BYTES
            count = read_into(buffer[got:want])
            if not count:
                raise ConnectionError(f"the block ended {left - got} bytes early")
            got += count
        digest.update(buffer[:got])
        done = 0
        while done < got:
            done += os.pwrite(fd, buffer[done : min(got, done + WRITE_BYTES)], offset + done)
        offset += got
        left -= got
        behind.written(offset)
    behind.finish(offset)
    return digest.hexdigest()


_BUFFERS = threading.local()


def _buffer() -> memoryview:
    """This thread's READ_BYTES buffer, reused from block to block: a new one would be new
    memory to fault in for every block."""
    buffer = getattr(_BUFFERS, "view", None)
    if buffer is None:
        buffer = _BUFFERS.view = memoryview(bytearray(READ_BYTES))
    return buffer


class Behind:
    """The writeback of a block being written: each whole piece of WRITEBACK_BYTES is sent to
    the disk, and (unless `keep_cached`) the piece before it is waited for and dropped from
    the page cache."""

    def __init__(self, fd: int, start: int, keep_cached: bool) -> None:
        self.fd, self.keep_cached = fd, keep_cached
        self.sent = self.dropped = start  # [dropped, sent): sent to the disk, still cached

    def written(self, end: int) -> None:
        """The block is written up to `end`."""
        if end - self.sent >= WRITEBACK_BYTES:
            self._advance(end)

    def finish(self, end: int) -> None:
        """The block ends at `end`: the rest is sent (and, unless kept, waited for and
        dropped)."""
        self._advance(end)
        if not self.keep_cached:
            write_behind(self.fd, self.dropped, end - self.dropped)
            self.dropped = end

    def _advance(self, end: int) -> None:
        start_writeback(self.fd, self.sent, end - self.sent)
        if not self.keep_cached:
            write_behind(self.fd, self.dropped, self.sent - self.dropped)
            self.dropped = self.sent
        self.sent = end


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


def write_behind(fd: int, offset: int, size: int) -> None:
    """Write these bytes to the disk now and let their pages go: the keeper's memory then holds
    a few blocks of an upload, not all of it (the next block's pages are those just let go,
    not new memory), and the fsync at commit has nothing left to wait for. Only where
    sync_file_range exists; elsewhere the fsync at commit does it all."""
    if _SYNC_FILE_RANGE is None or not size:
        return
    if _SYNC_FILE_RANGE(fd, offset, size, SYNC_FILE_RANGE_FLUSH) == 0:
        os.posix_fadvise(fd, offset, size, os.POSIX_FADV_DONTNEED)


def start_writeback(fd: int, offset: int, size: int) -> None:
    """Ask the kernel to start writing these bytes to the disk now (the fsync at commit then
    has less to wait for). Only a hint: a failure changes nothing."""
    if _SYNC_FILE_RANGE is not None and size:
        _SYNC_FILE_RANGE(fd, offset, size, SYNC_FILE_RANGE_WRITE)
