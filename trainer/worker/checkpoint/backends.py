"""Which storage backend a checkpoint location names (s3://... or a local directory).

Kept apart from storage.py (the interface every backend imports), so that choosing a backend
does not make the interface import its own implementations."""

from __future__ import annotations

from pathlib import Path

from kubeddp.trainer.worker.checkpoint.storage import CheckpointError, CheckpointStorage


def storage_for(location: str | Path) -> CheckpointStorage:
    """The backend for checkpoint.dir (or a checkpoint.resume path)."""
    text = str(location)
    if not text.strip():
        raise CheckpointError(
            "checkpoint.dir is empty; set it to a directory that holds only checkpoints "
            "(e.g. /checkpoints), never the working directory"
        )
    if text.startswith("s3://") or text.lower().startswith("s3:"):
        from kubeddp.trainer.worker.checkpoint.s3 import S3Storage

        return S3Storage.from_url(text)
    from kubeddp.trainer.worker.checkpoint.local import LocalStorage

    return LocalStorage(location)


def as_storage(where: str | Path | CheckpointStorage) -> CheckpointStorage:
    return storage_for(where) if isinstance(where, (str, Path)) else where
