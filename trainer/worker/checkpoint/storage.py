"""What every checkpoint backend offers (`CheckpointStorage`), the names they share, and
`storage_for`, which picks the backend from checkpoint.dir (`s3://...` or a local path)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from kubeddp.trainer import constants
from kubeddp.trainer.storage_rules import TENSORBOARD_DIR

CKPT_RE = re.compile(r"^ckpt-(\d{8})$")
MARKER = constants.CHECKPOINT_MARKER  # written last: a checkpoint without it is ignored
STATE_FILE = "state.pt"
CONFIG_FILE = "config.yaml"
# Names kubeddp writes at the top of a checkpoint directory. Anything else there belongs to
# someone else, and a directory holding it is refused (safety.py). Other parts of kubeddp that
# keep a file beside the checkpoints name it `.kubeddp-*`.
OWN_PREFIXES = ("ckpt-", constants.CHECKPOINT_TMP_PREFIX, ".kubeddp")
# lost+found: a fresh ext4 volume has it; TENSORBOARD_DIR: rank 0's curves (worker/curves.py)
OWN_NAMES = (CONFIG_FILE, "lost+found", TENSORBOARD_DIR)
# The first line of the config copy kubeddp writes beside its checkpoints: how a config.yaml
# that arrived alone (from a checkpoint keeper, before the first checkpoint) is told from a
# user's own config.yaml in a working directory (safety.claim).
CONFIG_NOTE_HEADER = "# kubeddp: the effective config of the run whose checkpoints are here\n"
NOTE_BYTES = 4096


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written, read or used; the message is one line for the user."""


class StorageUnreachable(CheckpointError):
    """The storage did not answer (network, endpoint down): another try may work."""


@dataclass
class CheckpointRef:
    """One complete checkpoint: where it is (a Path, or an `s3://` URL) and its step."""

    path: Path | str
    step: int
    storage: CheckpointStorage | None = field(default=None, compare=False, repr=False)

    @property
    def name(self) -> str:
        return f"ckpt-{self.step:08d}"


WriteBody = Callable[[IO[bytes]], Any]  # writes one file's bytes into the stream it is given


class CheckpointStorage(Protocol):
    """A place that holds checkpoints. See the package docstring for the contract."""

    location: str  # for messages: `/checkpoints`, `s3://bucket/prefix`

    def prepare(self) -> None:
        """Make the place ready and prove it can be written; CheckpointError (one line) if
        not. Called once, by the writer, before training."""
        ...

    def top_names(self) -> list[str]:
        """Names at the top of the place (to tell ours from someone else's)."""
        ...

    def list(self) -> list[CheckpointRef]:
        """Complete checkpoints (marker present), newest first."""
        ...

    def write(self, step: int, files: dict[str, WriteBody]) -> CheckpointRef:
        """Write one checkpoint atomically: all `files`, then the marker; a kill at any moment
        leaves the old checkpoint of this step or the new one. Replaces a checkpoint of the
        same step."""
        ...

    def open_file(self, ref: CheckpointRef, name: str) -> IO[bytes]:
        """A readable stream of one file of `ref`. Never blocks on a non-regular file."""
        ...

    def set_aside(self, ref: CheckpointRef, suffix: str = ".bad") -> str | None:
        """Rename `ref` to <name><suffix>[-N]: kept, but never listed, pruned or replaced.
        Returns the new location, or None if it could not be moved."""
        ...

    def delete(self, ref: CheckpointRef) -> None:
        """Remove `ref` (its marker first, so a half-deleted one is incomplete)."""
        ...

    def remove_partial(self) -> None:
        """Remove what killed writers left (temporaries, checkpoints without a marker)."""
        ...

    def write_note(self, name: str, text: str | bytes) -> None:
        """A small file at the top (the effective config copy; a TensorBoard event file in an
        object store), replaced atomically."""
        ...

    def read_note(self, name: str) -> str | None:
        """The start (at most NOTE_BYTES) of a small file at the top; None when there is none
        or it is not a regular file."""
        ...

    def release(self) -> None:
        """Give up what prepare() holds (a lock)."""
        ...


def is_own_name(name: str) -> bool:
    return name in OWN_NAMES or name.startswith(OWN_PREFIXES)


def reason(exc: BaseException) -> str:
    """An error's first line (torch's C++ errors span many), at most 200 characters."""
    text = getattr(exc, "strerror", None) or str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:200]
