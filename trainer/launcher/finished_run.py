"""A run that finished stays finished: a pod that starts after its peers completed the run exits
0 at once instead of waiting for a rendezvous no peer will join.

It happens when a pod is lost in the run's last seconds (preempted while its workers were
shutting down): an Indexed Job (or a JobSet's Job) needs every index to succeed, so the Job
controller recreates that pod, and its peers have already exited 0. Without this record the new
pod waits for them until its rendezvous deadline, fails, and is retried until the retry budget
ends a job whose training had finished.

Every pod whose workers all exit 0 writes the record beside the retry budget's (a hidden folder
the checkpoint keeper keeps on the claim). It names the run by what a restarted pod would run
again: the resolved config, the program, its arguments and the content of its file (an edited
script at the same path is another run), and the world's shape. A pod that would run something
else (a changed config or program) trains as usual, and so does `checkpoint.resume=never`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
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
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return _unreadable(path, str(exc))
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("identity"), str):
            return _unreadable(path, "no identity")
        if data["identity"] != identity:
            return None
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(data["finished_at"])))
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        return _unreadable(path, f"{type(exc).__name__}: {exc}")
    return (
        f"[kubeddp] this run already finished at {when} (recorded in {path}): nothing to "
        "train, exit 0. To train again, set checkpoint.resume=never or use a new checkpoint dir"
    )


def _unreadable(path: Path, problem: str) -> None:
    """A record that cannot be read names no finished run: this pod trains (said in a line)."""
    print(f"[kubeddp] warning: finished-run record {path} is unreadable ({problem}); training "
          "as a new run", file=sys.stderr, flush=True)  # fmt: skip
