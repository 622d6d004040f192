"""What the checkpoint writer records of its files (sizes, one SHA-256 per block, in COMPLETE),
and that a step saved again can never lose both its copies."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from kubeddp.trainer.checkpoint_digest import (
    MIN_BLOCK_BYTES,
    BlockHasher,
    DigestError,
    FileDigest,
    digest_file,
    marker_text,
    read_marker,
)
from kubeddp.trainer.worker.checkpoint.local import ASIDE_PREFIX, LocalStorage


def test_block_digests_are_sha256_of_each_block_whatever_the_pieces_fed() -> None:
    data = os.urandom(3 * MIN_BLOCK_BYTES + 12345)
    hasher = BlockHasher(MIN_BLOCK_BYTES)
    for start in range(0, len(data), 777_777):  # pieces that straddle blocks
        hasher.update(data[start : start + 777_777])
    digest = hasher.finish()
    expected = [
        hashlib.sha256(data[i : i + MIN_BLOCK_BYTES]).hexdigest()
        for i in range(0, len(data), MIN_BLOCK_BYTES)
    ]
    assert digest == FileDigest(len(data), MIN_BLOCK_BYTES, tuple(expected))
    assert digest.span(3) == (3 * MIN_BLOCK_BYTES, 12345)
    empty = BlockHasher().finish()
    assert empty.size == 0 and empty.blocks == (hashlib.sha256(b"").hexdigest(),)


def test_a_digest_record_that_is_not_one_is_refused() -> None:
    good = BlockHasher(MIN_BLOCK_BYTES).finish().to_json()
    for bad in (
        {**good, "size": -1},
        {**good, "block": 7},
        {**good, "blocks": ["xyz"]},
        {**good, "size": 5 * MIN_BLOCK_BYTES},  # 5 blocks of digests needed, 1 given
        [],
    ):
        with pytest.raises(DigestError):
            FileDigest.from_json(bad)


def test_the_writer_records_every_file_in_the_marker(tmp_path) -> None:
    storage = LocalStorage(tmp_path)
    payload = os.urandom(200_000)
    ref = storage.write(
        3, {"state.pt": lambda f: f.write(payload), "config.yaml": lambda f: f.write(b"a: 1\n")}
    )
    marker = (ref.path / "COMPLETE").read_text()
    assert json.loads(marker)["step"] == 3
    recorded = read_marker(marker)
    assert recorded == {
        "state.pt": digest_file(ref.path / "state.pt"),
        "config.yaml": digest_file(ref.path / "config.yaml"),
    }
    assert read_marker("step=3\n") is None  # an older kubeddp's marker: complete, no digests
    assert read_marker(marker_text(1, {})) == {}


def test_a_writer_killed_between_the_two_renames_of_a_resave_leaves_the_old_copy(tmp_path) -> None:
    """Saving a step again moves the old copy aside before the new one takes its name; when the
    writer dies between the two renames, the next writer puts the old copy back."""
    storage = LocalStorage(tmp_path)
    old = storage.write(8, {"state.pt": lambda f: f.write(b"old")})
    os.rename(old.path, tmp_path / f"{ASIDE_PREFIX}ckpt-00000008")  # as the first rename left it
    assert storage.list() == []
    again = LocalStorage(tmp_path)
    again.prepare()
    assert (tmp_path / "ckpt-00000008" / "state.pt").read_bytes() == b"old"
    again.write(8, {"state.pt": lambda f: f.write(b"new")})  # the resave in full
    assert (tmp_path / "ckpt-00000008" / "state.pt").read_bytes() == b"new"
    assert not list(tmp_path.glob(f"{ASIDE_PREFIX}*"))
    again.release()
