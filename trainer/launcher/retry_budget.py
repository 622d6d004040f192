"""A retry budget that ends: restarts of this pod since the checkpoints last advanced.

No operator bounds the retries kubeddp asks for: training-operator v1.9 recreates an ExitCode
pod for every exit code >= 128 without counting it against backoffLimit, and JobSet restarts
count incidents, not progress. So launch keeps a small record beside the checkpoints (one file
per pod, named after its hostname, in a hidden folder that is never mistaken for a checkpoint)
and refuses to start once the pod has been restarted `retries.without_progress` times while
the newest checkpoint stayed the same. A job that saves checkpoints keeps its budget however
often it is preempted; a worker that is OOM-killed at every start ends the job.

Progress is the newest modification time of a file under checkpoint.dir (hidden names left
out): a new checkpoint of the built-in trainer, or anything a user's program saves there; and
rank 0's note of its newest in-memory snapshot (process_contract.PROGRESS_NOTE), so a job that
resumes from a peer's memory after each lost pod keeps its budget.
A start counts as a restart when the previous one failed in a way that is retried (>= 128) or
never said how it ended (the pod was killed); a finished run removes the record, and Ctrl-C
(130) or a fatal exit do not count.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from kubeddp.trainer import constants, exit_codes, process_contract, storage_rules

RECORD_DIR = ".kubeddp-retries"
# The kubelet mounts a file here (the container's terminationMessagePath, this by default) and
# shows its text as the pod's termination message; a test or another path sets the variable.
MAX_MESSAGE_BYTES = 4096  # the kubelet keeps at most 4096 bytes of the message
NOT_RETRIED = (exit_codes.OK, exit_codes.INTERRUPTED)


@dataclass
class RetryRecord:
    progress_ns: int = 0  # newest checkpoint file's mtime when the count last restarted
    restarts: int = 0  # restarts since then
    last_exit: int | None = None  # None: the run now going, or one killed before it could say
    last_reason: str = ""


# What each field of a record must hold (bool is an int to Python, not here).
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "progress_ns": (int,), "restarts": (int,), "last_exit": (int, type(None)),
    "last_reason": (str,),
}  # fmt: skip


def parse_record(text: str) -> RetryRecord:
    """A record from its JSON text; ValueError (one line) for anything else: another writer's
    file, a hand edit, a field of the wrong type (a string count once ended every start with an
    internal error)."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {type(data).__name__}, not an object")
    for name, kinds in _FIELD_TYPES.items():
        value = data.get(name, getattr(RetryRecord(), name))
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise ValueError(f"{name} is {value!r}, not {' or '.join(k.__name__ for k in kinds)}")
    if data.get("restarts", 0) < 0:
        raise ValueError(f"restarts is {data['restarts']}, below 0")
    return RetryRecord(**{name: data[name] for name in _FIELD_TYPES if name in data})


def progress_marker(directory: Path, depth: int = 3) -> int:
    """The newest st_mtime_ns of a file under `directory` (hidden names skipped), 0 if none."""
    newest = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                if depth > 1:
                    newest = max(newest, progress_marker(Path(entry.path), depth - 1))
            else:
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime_ns)
        except OSError:
            continue
    return newest


def counts_as_restart(last_exit: int | None) -> bool:
    if last_exit is None:
        return True
    return last_exit >= exit_codes.RETRYABLE_FROM and last_exit not in NOT_RETRIED


class RetryBudget:
    """The record of one pod. Every method is best effort: a checkpoint dir that cannot hold
    the record leaves the budget off (said once) rather than stopping training."""

    def __init__(
        self,
        checkpoint_dir: str,
        limit: int,
        pod: str | None = None,
        progress: Callable[[], int] | None = None,
    ) -> None:
        self.limit = limit
        # Where progress is read: checkpoint.dir, or (behind a keeper) also the keeper's
        # listing, since a pod that reads no checkpoint has none of them here.
        self.progress = progress or (lambda: progress_marker(self.checkpoint_dir))
        self.checkpoint_dir = Path(checkpoint_dir)
        self.pod = pod or socket.gethostname() or "pod"
        self.path = self.checkpoint_dir / RECORD_DIR / f"{self.pod}.json"
        self.enabled = limit > 0 and storage_rules.is_directory(checkpoint_dir)
        self.record = RetryRecord()

    def _load(self) -> RetryRecord | None:
        """The record of the previous start; None for the first start, or (said in a line) for
        one that cannot be read: the count starts afresh rather than stopping the pod."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            problem = str(exc)
        else:
            try:
                return parse_record(text)
            except ValueError as exc:
                problem = str(exc)
        _log(f"[kubeddp] warning: retry record {self.path} is unreadable ({problem}); this "
             "start counts restarts afresh")  # fmt: skip
        return None

    def _save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(asdict(self.record)))
            os.replace(tmp, self.path)
        except OSError as exc:
            self.enabled = False
            _log(f"[kubeddp] warning: retry budget off: cannot write {self.path} ({exc})")

    def start(self) -> str | None:
        """Count this start; the one-line reason to stop when the budget is spent, else None."""
        if not self.enabled:
            return None
        previous = self._load()
        progress = max(self.progress(), process_contract.progress_noted(str(self.checkpoint_dir)))
        if (
            previous is None
            or progress > previous.progress_ns
            or not counts_as_restart(previous.last_exit)
        ):
            self.record = RetryRecord(progress_ns=progress)
        else:
            self.record = previous
            self.record.restarts += 1
        if previous is not None and self.record.restarts > self.limit:
            last = previous.last_reason or (
                "the pod was killed (node lost, or the container was OOM-killed)"
                if previous.last_exit is None
                else f"exit code {exit_codes.describe(previous.last_exit)}"
            )
            reason = (
                f"retries exhausted: {self.record.restarts} restarts of pod {self.pod} since "
                f"the newest checkpoint in {self.checkpoint_dir} last advanced "
                f"(retries.without_progress={self.limit}); last failure: {last}"
            )
            # Fatal, so a job resubmitted after the fix starts with a fresh count.
            self.record.last_exit = exit_codes.RETRIES_EXHAUSTED
            self.record.last_reason = reason
            self._save()
            return reason
        self.record.last_exit = None
        self.record.last_reason = ""
        self._save()
        return None

    def restarts_left(self) -> int:
        return max(0, self.limit - self.record.restarts)

    def ended(self, code: int, reason: str) -> None:
        """Record how this run ended; a finished run removes the record."""
        if not self.enabled:
            return
        if code == exit_codes.OK:
            with contextlib.suppress(OSError):
                self.path.unlink(missing_ok=True)
            return
        self.record.last_exit = code
        self.record.last_reason = reason
        self._save()


def write_termination_message(line: str) -> None:
    """The one-line reason, where the kubelet reads the pod's termination message (the file
    exists only in a container the kubelet made; elsewhere nothing is written)."""
    path = os.environ.get(constants.ENV_TERMINATION_LOG) or constants.TERMINATION_LOG
    if not os.path.exists(path):
        return
    with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as handle:
        handle.write(line.encode()[:MAX_MESSAGE_BYTES].decode(errors="ignore"))


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
