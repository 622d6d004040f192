"""What a file holds, as its size and one digest per block: recorded where it is written, checked
wherever it arrives.

The checkpoint writer (worker/checkpoint/local.py) records every file's digest in the
checkpoint's COMPLETE marker as it saves (`marker_text`); the keeper's client sends the
digests with the files, the keeper checks every block against them before it commits, and a pod
that fetches checks them again (trainer/keeper/). One digest per block rather than
per file: the blocks of one large file travel and are checked in parallel.

The digest is BLAKE3 (the `blake3` package, 0.4 MB): every byte a checkpoint moves is hashed once
where it is written and once where it arrives, and BLAKE3 costs a fifth of SHA-256's CPU here
(0.10 against 0.54 CPU-s per GiB, with SHA extensions and AVX-512; docs/checkpoints.md). A
digest recorded by an older kubeddp (SHA-256, marker format v1) is still read and checked with
SHA-256: each file's digest names its algorithm.

No torch here: the keeper imports this, and its pod has 256 MiB of memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import blake3

from kubeddp.trainer import constants

BLOCK_BYTES = 64 << 20
MIN_BLOCK_BYTES = 1 << 20
MAX_BLOCK_BYTES = 256 << 20
ENV_BLOCK_BYTES = constants.ENV_CHECKPOINT_BLOCK_BYTES
READ_BYTES = 1 << 20  # hashlib lets go of the GIL for pieces this large
HEX = re.compile(r"^[0-9a-f]{64}$")
# v2 names each file's algorithm; v1 (kubeddp before BLAKE3) is SHA-256 throughout. An older
# kubeddp reads a v2 marker as one without digests (it hashes the files itself).
MARKER_FORMAT = "kubeddp-checkpoint-v2"
READ_FORMATS = ("kubeddp-checkpoint-v1", MARKER_FORMAT)


class Hash(Protocol):
    def update(self, data: bytes | bytearray | memoryview, /) -> object: ...
    def hexdigest(self) -> str: ...


# Both release the GIL while they hash a large piece: the blocks of a transfer hash on every core
ALGORITHMS: dict[str, Callable[[], Hash]] = {"blake3": blake3.blake3, "sha256": hashlib.sha256}
ALGORITHM = "blake3"  # what is recorded now
OLD_ALGORITHM = "sha256"  # a digest that names none: recorded by an older kubeddp


def new_hash(algorithm: str) -> Hash:
    return ALGORITHMS[algorithm]()


class DigestError(ValueError):
    """A digest record that is not one (the message says what is wrong)."""


@dataclass(frozen=True)
class FileDigest:
    """A file's size and the digest (`algorithm`) of each `block` bytes of it (an empty file:
    one block)."""

    size: int
    block: int
    blocks: tuple[str, ...]
    algorithm: str = ALGORITHM

    def span(self, index: int) -> tuple[int, int]:
        """(offset, length) of block `index`."""
        offset = index * self.block
        return offset, max(0, min(self.block, self.size - offset))

    def to_json(self) -> dict:
        return {
            "size": self.size,
            "block": self.block,
            "algorithm": self.algorithm,
            "blocks": list(self.blocks),
        }

    @classmethod
    def from_json(cls, data: object) -> FileDigest:
        if not isinstance(data, dict):
            raise DigestError(f"a file's digest is {type(data).__name__}, not an object")
        size, block, blocks = data.get("size"), data.get("block"), data.get("blocks")
        algorithm = data.get("algorithm", OLD_ALGORITHM)
        if algorithm not in ALGORITHMS:
            raise DigestError(f"algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise DigestError(f"size {size!r} is not a count of bytes")
        if not isinstance(block, int) or not MIN_BLOCK_BYTES <= block <= MAX_BLOCK_BYTES:
            raise DigestError(f"block {block!r} is not between 1 MiB and 256 MiB")
        if not isinstance(blocks, list) or not all(isinstance(b, str) and HEX.match(b)
                                                   for b in blocks):  # fmt: skip
            raise DigestError(f"blocks must be a list of {algorithm} hex digests")
        if len(blocks) != block_count(size, block):
            raise DigestError(
                f"{len(blocks)} block digests for {size} bytes in {block}-byte blocks"
            )
        return cls(size, block, tuple(blocks), algorithm)


def default_block() -> int:
    """BLOCK_BYTES, or the environment's KUBEDDP_CHECKPOINT_BLOCK_BYTES within the bounds."""
    raw = os.environ.get(ENV_BLOCK_BYTES, "")
    value = int(raw) if raw.isdigit() else BLOCK_BYTES
    return min(MAX_BLOCK_BYTES, max(MIN_BLOCK_BYTES, value))


def block_count(size: int, block: int) -> int:
    return max(1, -(-size // block))


class BlockHasher:
    """Bytes in order -> their FileDigest."""

    def __init__(self, block: int | None = None, algorithm: str = ALGORITHM) -> None:
        self.block = block or default_block()
        self.algorithm = algorithm
        self.size = 0
        self._done: list[str] = []
        self._current = new_hash(algorithm)
        self._filled = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view.nbytes:
            take = min(view.nbytes, self.block - self._filled)
            self._current.update(view[:take])
            self._filled += take
            self.size += take
            view = view[take:]
            if self._filled == self.block:
                self._done.append(self._current.hexdigest())
                self._current, self._filled = new_hash(self.algorithm), 0

    def finish(self) -> FileDigest:
        blocks = list(self._done)
        if self._filled or not blocks:
            blocks.append(self._current.hexdigest())
        return FileDigest(self.size, self.block, tuple(blocks), self.algorithm)


def digest_fd(fd: int, block: int | None = None) -> FileDigest:
    """The digest of an open file, read from its start (its offset is left at the end)."""
    hasher = BlockHasher(block)
    buffer = bytearray(READ_BYTES)
    view = memoryview(buffer)
    offset = 0
    while True:
        got = os.preadv(fd, [view], offset)
        if not got:
            return hasher.finish()
        hasher.update(view[:got])
        offset += got


def digest_file(path: str | os.PathLike[str], block: int | None = None) -> FileDigest:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return digest_fd(fd, block)
    finally:
        os.close(fd)


class HashingWriter:
    """A binary stream that hashes what goes through it to the file below (only `write` and
    `flush`: torch.save, yaml and plain writes use nothing else)."""

    def __init__(self, inner, block: int | None = None) -> None:  # noqa: ANN001 - a binary file
        self.inner = inner
        self.hasher = BlockHasher(block)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        written = self.inner.write(data)
        view = memoryview(data).cast("B")
        self.hasher.update(view[: written if written is not None else view.nbytes])
        return written if written is not None else view.nbytes

    def flush(self) -> None:
        self.inner.flush()

    def writable(self) -> bool:
        return True


def marker_text(step: int, files: dict[str, FileDigest]) -> str:
    """The COMPLETE marker of a checkpoint: its step and what each of its files holds."""
    record = {
        "format": MARKER_FORMAT,
        "step": step,
        "files": {name: digest.to_json() for name, digest in sorted(files.items())},
    }
    return json.dumps(record, indent=1) + "\n"


def read_marker(text: str) -> dict[str, FileDigest] | None:
    """The files a COMPLETE marker lists; None for a marker without them (an older kubeddp's
    `step=N`, or S3's), which says only that the checkpoint is complete."""
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("format") not in READ_FORMATS:
        return None
    files = record.get("files")
    if not isinstance(files, dict):
        raise DigestError("the marker's files are not an object")
    return {str(name): FileDigest.from_json(data) for name, data in files.items()}
