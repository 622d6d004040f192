"""Which storage backend a checkpoint location names (an object store's URL, or a directory).

Kept apart from storage.py (the interface every backend imports), so that choosing a backend
does not make the interface import its own implementations. The schemes and their backends are
trainer/storage_rules.py's, which the chart reads too."""

from __future__ import annotations

import importlib
from pathlib import Path

from kubeddp.trainer import storage_rules
from kubeddp.trainer.worker.checkpoint.storage import CheckpointError, CheckpointStorage


def storage_for(location: str | Path) -> CheckpointStorage:
    """The backend for checkpoint.dir (or a checkpoint.resume path)."""
    text = str(location)
    if not text.strip():
        raise CheckpointError(
            "checkpoint.dir is empty; set it to a directory that holds only checkpoints "
            "(e.g. /checkpoints), never the working directory"
        )
    scheme = storage_rules.object_store(text)
    if scheme:
        module, _, name = storage_rules.OBJECT_STORES[scheme][0].partition(":")
        return getattr(importlib.import_module(module), name).from_url(text)
    # only the backend the URL names is imported (the object stores' through storage_rules, above)
    from kubeddp.trainer.worker.checkpoint.local import LocalStorage

    return LocalStorage(location)


def as_storage(where: str | Path | CheckpointStorage) -> CheckpointStorage:
    return storage_for(where) if isinstance(where, (str, Path)) else where
