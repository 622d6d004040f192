"""One step of a checkpoint's way in a process of its own, for tests that SIGKILL it midway
(KUBEDDP_TEST_KILL_AT, trainer/fault_points.py):

    python -m tests.helpers.keeper_actor save DIR STEP FILL SIZE   # the trainer's writer
    python -m tests.helpers.keeper_actor push URL SECRET DIR       # a pod's last send
"""

from __future__ import annotations

import sys
from pathlib import Path

from kubeddp.trainer.keeper.auth import Secret
from kubeddp.trainer.keeper.client import KeeperClient
from kubeddp.trainer.keeper.sync import CheckpointSync, SyncSettings
from kubeddp.trainer.worker.checkpoint.local import LocalStorage


def state(fill: str, size: int) -> bytes:
    """The state.pt of a checkpoint called `fill` (its byte, repeated)."""
    return fill.encode()[:1] * size


def save(directory: str, step: int, fill: str, size: int) -> None:
    storage = LocalStorage(directory)
    storage.prepare()
    body = state(fill, size)
    storage.write(
        step, {"state.pt": lambda f: f.write(body), "config.yaml": lambda f: f.write(b"a: 1\n")}
    )
    storage.release()


def push(url: str, secret_file: str, directory: str) -> None:
    client = KeeperClient(url, Secret.from_file(secret_file), timeout=30)
    sync = CheckpointSync(client, Path(directory), print, SyncSettings(reads=True, keep=2, pod="a"))
    print(sync.push(final=True), flush=True)
    client.close()


def main(argv: list[str]) -> int:
    if argv[0] == "save":
        save(argv[1], int(argv[2]), argv[3], int(argv[4]))
    elif argv[0] == "push":
        push(argv[1], argv[2], argv[3])
    else:
        raise SystemExit(f"unknown step {argv[0]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
