"""The one place that decides checkpoint.dir is safe to write, before anything is written.

Rules (docs/checkpoints.md, "Where checkpoints may go"):
- an empty checkpoint.dir is refused (storage_for): it would mean the working directory;
- a directory holding anything kubeddp did not write is refused: the user's files (a config
  in the working directory, a dataset) are never overwritten or pruned;
- the writer's lock file is opened with O_NOFOLLOW: a link there is refused (lock.py);
- a directory that cannot be written is refused at start, not found out at the first save;
- a run that does not continue the newest checkpoint there moves those checkpoints aside
  (`keep_apart`): keep-last-N never prunes what this run wrote, and nothing is deleted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from kubeddp.trainer.worker.checkpoint.storage import (
    CONFIG_FILE,
    CONFIG_NOTE_HEADER,
    CheckpointError,
    CheckpointStorage,
    is_own_name,
)


def claim(storage: CheckpointStorage, config_yaml: str, log: Callable[[str], None]) -> None:
    """Make `storage` this run's (the writer, global rank 0, calls it once) or raise a
    one-line CheckpointError."""
    names = storage.top_names()
    foreign = [name for name in names if not is_own_name(name)]
    # config.yaml is ours beside our other files, or when it says so on its first line (a
    # keeper hands it to the next pod before any checkpoint exists); else it is the user's (a
    # project's working directory), and the config copy would overwrite it.
    if (
        CONFIG_FILE in names
        and not any(n.startswith(("ckpt-", ".kubeddp")) for n in names)
        and not (storage.read_note(CONFIG_FILE) or "").startswith(CONFIG_NOTE_HEADER)
    ):
        foreign.insert(0, CONFIG_FILE)
    if foreign:
        raise CheckpointError(
            f"checkpoint.dir {storage.location} holds {len(foreign)} entr"
            f"{'y' if len(foreign) == 1 else 'ies'} that kubeddp did not write (e.g. "
            f"{foreign[0]!r}); kubeddp writes only into a directory of its own: set "
            "checkpoint.dir to an empty or new directory"
        )
    warning = storage.prepare()
    if warning:
        log(warning)
    try:  # the effective config next to the checkpoints: what produced them, for a person
        storage.write_note(CONFIG_FILE, CONFIG_NOTE_HEADER + config_yaml)
    except (OSError, CheckpointError) as exc:
        log(f"[kubeddp] warning: cannot write {CONFIG_FILE} in {storage.location}: {exc}")


def keep_apart(storage: CheckpointStorage) -> list[str]:
    """Move every complete checkpoint in `storage` aside as <name>.previous-<UTC time>; where
    they went."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    moved = []
    for ref in storage.list():
        target = storage.set_aside(ref, f".previous-{stamp}")
        if target is None:
            raise CheckpointError(
                f"checkpoint.dir {storage.location} holds checkpoint {ref.path} of another run "
                "and it cannot be moved aside; set checkpoint.dir to an empty or new directory"
            )
        moved.append(str(Path(target)) if isinstance(target, Path) else str(target))
    return moved
