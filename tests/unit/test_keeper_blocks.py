"""How a received block lands (trainer/keeper/blocks.py): read from a real socket into
its place in the file, its digest taken on the way, and a stream cut short never passing."""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import socket
import threading
from pathlib import Path

import blake3
import pytest

from kubeddp.trainer.keeper.blocks import (
    READ_BYTES,
    WRITE_BYTES,
    WRITEBACK_BYTES,
    receive_block,
    start_writeback,
)


def _sent(data: bytes) -> socket.socket:
    """The receiving end of a connection down which `data` is sent, then closed."""
    receiver, sender = socket.socketpair()
    receiver.settimeout(30)

    def send() -> None:
        with sender:
            sender.sendall(data)

    threading.Thread(target=send, daemon=True).start()
    return receiver


@pytest.mark.parametrize(("algorithm", "reference"), [("blake3", blake3.blake3),
                                                      ("sha256", hashlib.sha256)])  # fmt: skip
def test_a_block_is_written_at_its_offset_and_its_digest_taken_on_the_way(
    tmp_path: Path, algorithm, reference
) -> None:
    data = os.urandom(2 * READ_BYTES + 3 * WRITE_BYTES + 4321)  # more than a buffer, and a tail
    offset = 5 << 20
    path = tmp_path / "part"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, offset + len(data) + 100)
        with _sent(data) as conn:
            got = receive_block(conn.recv_into, fd, offset, len(data), algorithm)
        start_writeback(fd, offset, len(data))  # a hint: it changes no byte
    finally:
        os.close(fd)
    assert got == reference(data).hexdigest()
    written = path.read_bytes()
    assert written[offset : offset + len(data)] == data
    assert written[:offset] == bytes(offset) and written[offset + len(data) :] == bytes(100)


def _cached_pages(path: Path, start: int, length: int) -> int:
    """How many pages of the file's range are in the page cache: mincore(2) on a mapping,
    which looks without reading."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]  # fmt: skip
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
        assert address not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        pages = (ctypes.c_ubyte * (-(-length // mmap.PAGESIZE)))()
        try:
            assert libc.mincore(address, length, pages) == 0, ctypes.get_errno()
        finally:
            libc.munmap(address, length)
    finally:
        os.close(fd)
    return sum(page & 1 for page in pages)


def _filesystem(path: Path) -> str:
    """The type of the filesystem `path` is on (the longest mount point above it)."""
    best, kind = "", ""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        point = fields[1].replace("\\040", " ")
        inside = str(path).startswith(point.rstrip("/") + "/") or str(path) == point
        if inside and len(point) > len(best):
            best, kind = point, fields[2]
    return kind


@pytest.mark.parametrize("keep_cached", [True, False])
def test_a_block_written_for_the_keeper_leaves_the_page_cache_and_a_fetched_one_stays(
    tmp_path: Path, keep_cached: bool
) -> None:
    """The keeper's memory holds a few pieces of an upload, not the upload: what it received
    is on the disk and out of the page cache when the block is done; a pod keeps what it
    fetched cached (it reads it next)."""
    if _filesystem(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is in memory: its pages are the file and cannot be dropped")
    data = os.urandom(2 * WRITEBACK_BYTES + 12345)
    path = tmp_path / "part"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, len(data))
        with _sent(data) as conn:
            got = receive_block(conn.recv_into, fd, 0, len(data), "blake3", keep_cached)
    finally:
        os.close(fd)
    assert got == blake3.blake3(data).hexdigest()
    cached = _cached_pages(path, 0, len(data))
    pages = -(-len(data) // mmap.PAGESIZE)
    if keep_cached:
        assert cached == pages
    else:
        assert cached == 0, f"{cached} of {pages} pages still cached"
    assert path.read_bytes() == data


def test_a_stream_that_ends_early_is_a_connection_error_not_a_block(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "part", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        with _sent(b"x" * 1000) as conn, pytest.raises(ConnectionError, match="24 bytes early"):
            receive_block(conn.recv_into, fd, 0, 1024, "blake3")
    finally:
        os.close(fd)


def test_an_empty_block_reads_nothing_and_has_the_empty_digest(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "part", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        with _sent(b"next request") as conn:
            assert receive_block(conn.recv_into, fd, 0, 0, "blake3") == blake3.blake3().hexdigest()
            assert conn.recv(100) == b"next request"  # nothing of the next request was taken
    finally:
        os.close(fd)
    start_writeback(-1, 0, 0)  # nothing to write back: not even a bad fd is touched
