"""Checkpointing: atomic, complete, resumable, in one room.

Modules (one job each):
  manager.py  CheckpointManager: a mapping of parts, save cadence, resume (collective)
  parts.py    the Stateful / PerRank protocols and adapters (optimizer, RNG, sample record)
  state.py    what state.pt holds, reading it safely, the newest usable checkpoint
  writer.py   write + keep-last-N, in a background thread
  safety.py   the one place that decides checkpoint.dir may be written
  storage.py  the CheckpointStorage interface, shared names, storage_for(checkpoint.dir)
  local.py    backend: a local directory (PVC, host path), with lock.py's writer lock
  s3.py       backend: S3-compatible object storage (`s3://bucket/prefix`, extra `s3`)

Adding state: one line in the parts mapping the trainer builds (trainer/worker/loop.py), an
object with `state_dict()` and `load_state_dict(state)` (parts.py). A checkpoint written before
the part existed leaves it as it is on resume.

The storage interface (storage.CheckpointStorage), for anyone adding a backend or moving
checkpoints around (a new backend is one module plus one line in `storage_for`):

  location: str                         where, for messages
  prepare() -> str | None               make ready, prove writable (one-line CheckpointError),
                                        take the writer's claim; a warning to print, or None
  release()                             give up the claim
  top_names() -> list[str]              names at the top (ours: storage.is_own_name)
  list() -> list[CheckpointRef]         complete checkpoints (marker present), newest first
  write(step, {name: body}) -> ref      atomically: every file, then the COMPLETE marker last;
                                        replaces the same step; body(stream) writes the bytes
  open_file(ref, name) -> binary stream never blocks on a non-regular file
  set_aside(ref, suffix=".bad") -> loc  rename out of the listing (kept, never pruned)
  delete(ref)                           marker first, then the rest
  remove_partial()                      what killed writers left behind
  write_note(name, text)                a small top-level file (the config copy), atomically

Layout in every backend: <root>/ckpt-<step:08d>/{state.pt, config.yaml, COMPLETE}, and
<root>/config.yaml. A checkpoint without COMPLETE is incomplete and ignored. Errors are
CheckpointError (bad input: exit 2) or StorageUnreachable (retryable: exit 202).
"""

from kubeddp.trainer.worker.checkpoint import writer
from kubeddp.trainer.worker.checkpoint.backends import storage_for
from kubeddp.trainer.worker.checkpoint.state import (
    REQUIRED_KEYS,
    list_checkpoints,
    load_newest_valid,
    load_state,
    set_aside,
    state_problem,
    to_cpu,
)
from kubeddp.trainer.worker.checkpoint.storage import (
    CKPT_RE,
    CONFIG_FILE,
    MARKER,
    STATE_FILE,
    CheckpointError,
    CheckpointRef,
    CheckpointStorage,
    StorageUnreachable,
)
from kubeddp.trainer.worker.checkpoint.writer import AsyncCheckpointWriter, write_checkpoint

__all__ = [
    "CKPT_RE",
    "CONFIG_FILE",
    "MARKER",
    "REQUIRED_KEYS",
    "STATE_FILE",
    "AsyncCheckpointWriter",
    "CheckpointError",
    "CheckpointRef",
    "CheckpointStorage",
    "StorageUnreachable",
    "list_checkpoints",
    "load_newest_valid",
    "load_state",
    "set_aside",
    "state_problem",
    "storage_for",
    "to_cpu",
    "write_checkpoint",
    "writer",
]
