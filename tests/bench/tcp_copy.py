"""The bar for the keeper's transfers: the least a program must do to move a checkpoint over TCP
with the same checks. A sender reads each file and sends it with sendfile(2) over one loopback
connection; a receiver reads into one reused buffer, computes the same BLAKE3 block digests the
keeper checks (trainer/checkpoint_digest.py) and compares them with the checkpoint's COMPLETE
marker, writes the bytes and fsyncs every file and folder. No HTTP, no signatures, no staging,
no parallel streams: what is left is the kernel's copies, the digest and the disk.

    python -m tests.bench.tcp_copy receive DEST PORT_FILE   # prints JSON: CPU-seconds, end
    python -m tests.bench.tcp_copy receive-no-fsync DEST PORT_FILE   # as a fetch: no fsync
    python -m tests.bench.tcp_copy send SOURCE PORT         # JSON: CPU-seconds, start

Each side is its own process, as a pod and the keeper are, and reports the CPU-seconds it spent
on the copy (not its start-up) and when the copy began (sender) or ended (receiver).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time
from pathlib import Path

from kubeddp.trainer.checkpoint_digest import BlockHasher, read_marker

BUFFER_BYTES = 256 << 10  # what the keeper's receiver reads and writes at a time (keeper/blocks.py)
HEADER = struct.Struct("!HQ")  # name length, file size; then the name, then the bytes
MARKER = "COMPLETE"


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def send(source: Path, port: int) -> dict:
    """Every file of the checkpoint directory `source` (the marker last), then a 0 name."""
    names = sorted(p.name for p in source.iterdir() if p.name != MARKER) + [MARKER]
    cpu, start = _cpu(), time.time()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for name in names:
            with open(source / name, "rb") as file:
                size = os.fstat(file.fileno()).st_size
                sock.sendall(HEADER.pack(len(name.encode()), size) + name.encode())
                sent = sock.sendfile(file, 0, size) if size else 0
                if sent != size:
                    raise RuntimeError(f"{name}: sent {sent} of {size} bytes")
        sock.sendall(HEADER.pack(0, 0))
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # the receiver closes once its fsyncs are done
    return {"cpu": _cpu() - cpu, "start": start}


def _read_exactly(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        got = sock.recv_into(view)
        if not got:
            raise ConnectionError("the sender stopped early")
        view = view[got:]


def receive(dest: Path, listener: socket.socket, fsync: bool = True) -> dict:
    """Files into `dest` until the 0 name; every block's digest checked against the marker."""
    dest.mkdir(parents=True)
    cpu = _cpu()
    conn, _ = listener.accept()
    buffer = memoryview(bytearray(BUFFER_BYTES))
    header = memoryview(bytearray(HEADER.size))
    digests = {}
    with conn:
        while True:
            _read_exactly(conn, header)
            length, size = HEADER.unpack(header)
            if not length:
                break
            name = bytearray(length)
            _read_exactly(conn, memoryview(name))
            hasher = BlockHasher()
            fd = os.open(dest / name.decode(), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                left = size
                while left:
                    got = conn.recv_into(buffer, min(left, BUFFER_BYTES))
                    if not got:
                        raise ConnectionError("the sender stopped early")
                    hasher.update(buffer[:got])
                    done = 0
                    while done < got:
                        done += os.write(fd, buffer[done:got])
                    left -= got
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            digests[name.decode()] = hasher.finish()
        for folder in (dest, dest.parent) if fsync else ():
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(fd)
            os.close(fd)
    listed = read_marker((dest / MARKER).read_text()) or {}
    wrong = [name for name, digest in listed.items() if digests.get(name) != digest]
    if not listed or wrong:
        raise RuntimeError(f"digests differ from the marker: {wrong or 'no digests listed'}")
    return {"cpu": _cpu() - cpu, "end": time.time()}


def main(argv: list[str]) -> int:
    mode, path, where = argv
    if mode == "send":
        print(json.dumps(send(Path(path), int(where))), flush=True)
        return 0
    with socket.create_server(("127.0.0.1", 0)) as listener:
        Path(where).write_text(str(listener.getsockname()[1]))  # the sender's cue
        print(json.dumps(receive(Path(path), listener, mode == "receive")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
