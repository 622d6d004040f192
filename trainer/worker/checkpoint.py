"""Checkpoint files: atomic, complete, resumable.

Layout: <dir>/ckpt-<step:08d>/{state.pt, config.yaml, COMPLETE}. A checkpoint is written into
a temporary sibling directory, fsynced, marked COMPLETE, then renamed; readers only trust
directories with the marker, so a kill at any moment leaves either the old or the new one.
Only global rank 0 writes (one writer per file; safe on a PVC shared by all pods).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

CKPT_RE = re.compile(r"^ckpt-(\d{8})$")
MARKER = "COMPLETE"
STATE_FILE = "state.pt"


class CheckpointError(RuntimeError):
    pass


@dataclass
class CheckpointRef:
    path: Path
    step: int


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, write) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _reason(exc: BaseException) -> str:
    """An error's first line (torch's C++ errors span many), at most 200 characters."""
    text = getattr(exc, "strerror", None) or str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:200]


def _free_space(root: Path) -> str:
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return ""
    return f"{free / 2**20:.1f} MiB free there; "


def list_checkpoints(directory: str | Path) -> list[CheckpointRef]:
    """Complete checkpoints in `directory`, newest first; a path naming one checkpoint
    (.../ckpt-00000040) lists just that one."""
    root = Path(directory)
    if not root.is_dir():
        return []
    own = CKPT_RE.match(root.name)
    if own and (root / MARKER).is_file():
        return [CheckpointRef(root, int(own.group(1)))]
    refs = []
    for child in root.iterdir():
        m = CKPT_RE.match(child.name)
        if m and (child / MARKER).is_file():
            refs.append(CheckpointRef(child, int(m.group(1))))
    return sorted(refs, key=lambda r: r.step, reverse=True)


def write_checkpoint(
    directory: str | Path, step: int, state: dict[str, Any], config_yaml: str, keep: int
) -> Path:
    """Write `state` (already on CPU) atomically; prune to the newest `keep`. Returns the path."""
    root = Path(directory)
    final = root / f"ckpt-{step:08d}"
    tmp = root / f".tmp-ckpt-{step:08d}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        _write_file(tmp / STATE_FILE, lambda f: torch.save(state, f))
        _write_file(tmp / "config.yaml", lambda f: f.write(config_yaml.encode()))
        _write_file(tmp / MARKER, lambda f: f.write(f"step={step}\n".encode()))
        _fsync_dir(tmp)
        if final.exists():  # same step saved twice (e.g. end of epoch == max_steps)
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
    except Exception as exc:
        # Any failure, not only OSError: torch's zip writer reports a full disk as a
        # RuntimeError. The half-written temporary goes at once (it may be as large as a
        # checkpoint, on a disk that is full).
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(
            f"cannot write checkpoint {final}: {_reason(exc)} ({_free_space(root)}check free "
            "space and write permission of checkpoint.dir)"
        ) from exc
    for old in list_checkpoints(root)[keep:]:
        shutil.rmtree(old.path, ignore_errors=True)
    # Half-written temporaries of writers that were killed: there is one writer (global
    # rank 0), so any other temporary is dead and may be as large as a checkpoint.
    for stale in root.glob(".tmp-ckpt-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return final


def load_state(ref: CheckpointRef) -> dict[str, Any]:
    # weights_only=True: a checkpoint must never be able to run code when loaded.
    return torch.load(ref.path / STATE_FILE, map_location="cpu", weights_only=True)


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
    directory: str | Path,
    log=print,
    check: Callable[[dict[str, Any]], str | None] | None = None,
    on_bad: Callable[[CheckpointRef], None] | None = None,
) -> tuple[CheckpointRef, dict] | None:
    """Newest checkpoint that loads and holds a checkpoint's content (`check` may ask more);
    a bad one is reported and skipped (`on_bad` may set it aside), never deleted."""
    for ref in list_checkpoints(directory):
        try:
            state = load_state(ref)
        except Exception as exc:  # noqa: BLE001 - any unreadable file means "try the previous"
            log(
                f"[kubeddp] checkpoint {ref.path} is unreadable ({type(exc).__name__}: "
                f"{_reason(exc)}); trying the previous one"
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


def set_aside(ref: CheckpointRef) -> Path | None:
    """Rename a bad checkpoint to <name>.bad[-N]: kept for inspection, but never listed,
    pruned, tried again or replaced by a new save of the same step. None if it cannot move."""
    for attempt in range(100):
        target = ref.path.with_name(f"{ref.path.name}.bad" + (f"-{attempt}" if attempt else ""))
        if target.exists():
            continue
        try:
            os.rename(ref.path, target)
        except OSError:
            return None
        return target
    return None


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


class AsyncCheckpointWriter:
    """Writes checkpoints in a background thread, one in flight at a time.

    The training loop pays only for the device->CPU copy; the serialisation and fsync run
    while it trains on. A new save first waits for the previous one.
    """

    def __init__(self, directory: str | Path, keep: int, config_yaml: str) -> None:
        self.directory = directory
        self.keep = keep
        self.config_yaml = config_yaml
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._buffers: dict[str, Any] | None = None  # the last snapshot, reused by the next
        self.last_path: Path | None = None

    def _run(self, step: int, state: dict[str, Any]) -> None:
        try:
            self.last_path = write_checkpoint(
                self.directory, step, state, self.config_yaml, self.keep
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
