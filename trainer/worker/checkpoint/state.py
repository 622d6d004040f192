"""What a checkpoint's state.pt holds, reading it safely, and finding the newest usable one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from kubeddp.trainer.checkpoint_digest import (
    READ_BYTES,
    BlockHasher,
    DigestError,
    FileDigest,
    read_marker,
)
from kubeddp.trainer.worker.checkpoint.backends import as_storage
from kubeddp.trainer.worker.checkpoint.storage import (
    MARKER,
    STATE_FILE,
    CheckpointError,
    CheckpointRef,
    CheckpointStorage,
    StorageUnreachable,
    reason,
)

MAX_MARKER_BYTES = 1 << 20

# What every checkpoint kubeddp writes holds, and the type of each.
REQUIRED_KEYS: dict[str, type] = {
    "model": dict,
    "optimizer": dict,
    "scheduler": dict,
    "scaler": dict,
    "step": int,
    "epoch": int,
    "consumed": int,
}


def list_checkpoints(where: str | Path | CheckpointStorage) -> list[CheckpointRef]:
    """Complete checkpoints in `where`, newest first."""
    return as_storage(where).list()


def load_state(ref: CheckpointRef) -> dict[str, Any]:
    """state.pt of `ref`, checked against what its COMPLETE marker records (size and block
    digests) before it is unpickled: a file stored short or changed since it was written is
    read once more (an object store may have served a cut answer), then refused."""
    storage = ref.storage or as_storage(Path(ref.path).parent)
    recorded = _recorded(storage, ref).get(STATE_FILE)
    for attempt in (1, 2):
        with storage.open_file(ref, STATE_FILE) as f:
            problem = _differs(f, recorded) if recorded is not None else None
            if problem is None:
                # weights_only=True: a checkpoint must never be able to run code when loaded.
                return torch.load(f, map_location="cpu", weights_only=True)
        if attempt == 2:
            raise CheckpointError(f"{STATE_FILE} {problem}, not what its {MARKER} records")
    raise AssertionError("unreachable")


def _recorded(storage: CheckpointStorage, ref: CheckpointRef) -> dict[str, FileDigest]:
    """The files' digests COMPLETE records (none for a marker of an older kubeddp)."""
    try:
        with storage.open_file(ref, MARKER) as f:
            text = f.read(MAX_MARKER_BYTES).decode(errors="replace")
    except StorageUnreachable:
        raise
    except (OSError, CheckpointError):
        return {}
    try:
        return read_marker(text) or {}
    except DigestError as exc:
        raise CheckpointError(f"its {MARKER} marker is not one ({exc})") from None


def _differs(f: IO[bytes], recorded: FileDigest) -> str | None:
    """How the open file differs from its record (None: it is what was written); the file is
    left at its start."""
    hasher = BlockHasher(recorded.block, recorded.algorithm)
    while chunk := f.read(READ_BYTES):
        hasher.update(chunk)
    f.seek(0)
    got = hasher.finish()
    if got.size != recorded.size:
        return f"holds {got.size} bytes, {recorded.size} were written"
    if got != recorded:
        return "differs from what was written (its block digests)"
    return None


def state_problem(state: Any) -> str | None:
    """Why a loaded state.pt is not a kubeddp checkpoint (it unpickled, but holds something
    else: a tensor, a dict of another program), or None."""
    if not isinstance(state, dict):
        return f"{STATE_FILE} holds a {type(state).__name__}, not a checkpoint's state"
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        return f"{STATE_FILE} has no {', '.join(missing)}"
    for key, kind in REQUIRED_KEYS.items():
        value = state[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"its {key} is a {type(value).__name__}, not a {kind.__name__}"
        if kind is int and value < 0:
            return f"its {key} is {value}"
    if not all(isinstance(t, torch.Tensor) for t in state["model"].values()):
        return "its model holds values that are not tensors"
    return None


def load_newest_valid(
    where: str | Path | CheckpointStorage,
    log: Callable[[str], None] = print,
    check: Callable[[dict[str, Any]], str | None] | None = None,
    on_bad: Callable[[CheckpointRef], None] | None = None,
) -> tuple[CheckpointRef, dict] | None:
    """Newest checkpoint that loads and holds a checkpoint's content (`check` may ask more);
    a bad one is reported and skipped (`on_bad` may set it aside), never deleted."""
    for ref in list_checkpoints(where):
        try:
            state = load_state(ref)
        except StorageUnreachable:  # the network, not the checkpoint: never set it aside
            raise
        except Exception as exc:  # noqa: BLE001 - any unreadable file means "try the previous"
            log(
                f"[kubeddp] checkpoint {ref.path} is unreadable ({type(exc).__name__}: "
                f"{reason(exc)}); trying the previous one"
            )
        else:
            problem = state_problem(state) or (check(state) if check else None)
            if problem is None:
                return ref, state
            log(
                f"[kubeddp] checkpoint {ref.path} holds the wrong content ({problem}); "
                "trying the previous one"
            )
        if on_bad is not None:
            on_bad(ref)
    return None


def set_aside(ref: CheckpointRef, suffix: str = ".bad") -> Path | str | None:
    """Rename a bad checkpoint to <name>.bad[-N]: kept for inspection, but never listed,
    pruned, tried again or replaced by a new save of the same step. None if it cannot move."""
    storage = ref.storage or as_storage(Path(ref.path).parent)
    return storage.set_aside(ref, suffix)


def to_cpu(obj: Any, reuse: Any = None) -> Any:
    """Deep copy of a state tree with every tensor on CPU (safe to write from a thread).

    `reuse` is an earlier copy whose write has finished: a tensor of the same shape and dtype
    is copied into it instead of into new memory. On a large model most of the copy's time is
    the first touch of freshly allocated pages, so a reused copy blocks training ~5x shorter.
    """
    if isinstance(obj, torch.Tensor):
        src = obj.detach()
        if (
            isinstance(reuse, torch.Tensor)
            and reuse.device.type == "cpu"
            and reuse.shape == src.shape
            and reuse.dtype == src.dtype
        ):
            return reuse.copy_(src)
        return src.to("cpu", copy=True)
    if isinstance(obj, dict):
        old = reuse if isinstance(reuse, dict) else {}
        return {k: to_cpu(v, old.get(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        old = reuse if isinstance(reuse, (list, tuple)) and len(reuse) == len(obj) else ()
        return type(obj)(to_cpu(v, old[i] if old else None) for i, v in enumerate(obj))
    return obj
