"""Writing a checkpoint to its storage: atomically, then keep-last-N; in a background thread."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from kubeddp.trainer.worker.checkpoint.backends import as_storage
from kubeddp.trainer.worker.checkpoint.state import to_cpu
from kubeddp.trainer.worker.checkpoint.storage import (
    CONFIG_FILE,
    STATE_FILE,
    CheckpointStorage,
)


def write_checkpoint(
    where: str | Path | CheckpointStorage,
    step: int,
    state: dict[str, Any],
    config_yaml: str,
    keep: int,
) -> Path | str:
    """Write `state` (already on CPU) atomically; prune to the newest `keep`. Returns where."""
    storage = as_storage(where)
    ref = storage.write(
        step,
        {
            STATE_FILE: lambda f: torch.save(state, f),
            CONFIG_FILE: lambda f: f.write(config_yaml.encode()),
        },
    )
    for old in storage.list()[keep:]:
        storage.delete(old)
    storage.remove_partial()  # what writers killed earlier left behind
    return ref.path


class AsyncCheckpointWriter:
    """Writes checkpoints in a background thread, one in flight at a time.

    The training loop pays only for the device->CPU copy; the serialisation and fsync run
    while it trains on. A new save first waits for the previous one.
    """

    def __init__(
        self, directory: str | Path | CheckpointStorage, keep: int, config_yaml: str
    ) -> None:
        self.storage = as_storage(directory)
        self.keep = keep
        self.config_yaml = config_yaml
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._buffers: dict[str, Any] | None = None  # the last snapshot, reused by the next
        self.last_path: Path | str | None = None

    def _run(self, step: int, state: dict[str, Any]) -> None:
        try:
            self.last_path = write_checkpoint(
                self.storage, step, state, self.config_yaml, self.keep
            )
        except BaseException as exc:  # noqa: BLE001 - re-raised in wait()
            self._error = exc

    def snapshot(self, state: dict[str, Any]) -> dict[str, Any]:
        """A CPU copy of `state` to pass to save(); the memory of the previous copy is reused,
        so this first waits for its write (its error, if any, is raised by the next wait)."""
        if self._thread is not None:
            self._thread.join()
        self._buffers = to_cpu(state, self._buffers)
        return self._buffers

    def wait(self) -> None:
        """Block until the in-flight save ends; raise its error, if any."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def save(self, step: int, state: dict[str, Any], blocking: bool) -> None:
        self.wait()
        if blocking:
            self._run(step, state)
            self.wait()
            return
        self._thread = threading.Thread(
            target=self._run, args=(step, state), daemon=True, name="kubeddp-checkpoint"
        )
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
