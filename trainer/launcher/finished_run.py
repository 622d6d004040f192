"""A run that finished stays finished: a pod that starts after its peers completed the run exits
0 at once instead of waiting for a rendezvous no peer will join.

It happens when a pod is lost in the run's last seconds (preempted while its workers were
shutting down): an Indexed Job (or a JobSet's Job) needs every index to succeed, so the Job
controller recreates that pod, and its peers have already exited 0. Without this record the new
pod waits for them until its rendezvous deadline, fails, and is retried until the retry budget
ends a job whose training had finished.

Every pod whose workers all exit 0 writes the record beside the retry budget's (a hidden folder
the checkpoint keeper keeps on the claim). It names the run by what a restarted pod would run
again: the resolved config, the program and its arguments, and the world's shape. A pod that
would run something else (a changed config) trains as usual, and so does `checkpoint.resume=never`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubeddp.trainer import storage_rules
from kubeddp.trainer.launcher.retry_budget import RECORD_DIR

# An underscore cannot be in a hostname, so no pod's own budget record has this name.
RECORD_NAME = "_finished.json"


def run_identity(config: Mapping[str, Any], program: str, nnodes: str, nproc: int) -> str:
    """What a restarted pod would run again, as one hash. `config` is Config.to_dict(); its
    checkpoint.dir is left out: the record lies there (and an emptyDir's path may differ)."""
    settings = {name: dict(section) for name, section in config.items()}
    settings.get("checkpoint", {}).pop("dir", None)
    shape = {"config": settings, "program": program, "nnodes": nnodes, "nproc": nproc}
    return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()


def _path(checkpoint_dir: str) -> Path | None:
    if not storage_rules.is_directory(checkpoint_dir):
        return None
    return Path(checkpoint_dir) / RECORD_DIR / RECORD_NAME


def record_finished(checkpoint_dir: str, identity: str) -> None:
    """Best effort: without the record a late pod only waits, as before."""
    path = _path(checkpoint_dir)
    if path is None:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"identity": identity, "finished_at": time.time()}))
        os.replace(tmp, path)


def finished_line(checkpoint_dir: str, identity: str) -> str | None:
    """The line to print when this run already finished, else None."""
    path = _path(checkpoint_dir)
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("identity") != identity:
            return None
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(data["finished_at"])))
    except (OSError, ValueError, TypeError, KeyError, AttributeError, OverflowError):
        return None
    return (
        f"[kubeddp] this run already finished at {when} (recorded in {path}): nothing to "
        "train, exit 0. To train again, set checkpoint.resume=never or use a new checkpoint dir"
    )
