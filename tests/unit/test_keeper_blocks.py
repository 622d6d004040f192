"""How a received block lands (trainer/keeper/blocks.py): read from a real socket into
its place in the file, its digest taken on the way, and a stream cut short never passing."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from pathlib import Path

import blake3
import pytest

from kubeddp.trainer.keeper.blocks import WRITE_BYTES, receive_block, start_writeback


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
    data = os.urandom(3 * WRITE_BYTES + 4321)  # pieces larger than one buffer, and a short one
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
