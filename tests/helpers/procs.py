"""Run `kubeddp` (or any command) as a process tree that a test can always clean up.

torchrun starts each worker in a new session, so killing the launcher's process group does not
reach the workers, and a worker whose launcher died is re-parented away from the tree. Every
process started here therefore carries a unique tag in its environment (inherited by torchrun's
workers); cleanup kills every process on the machine whose environment holds that tag.

Output goes to a log file, never a pipe, so a chatty process cannot block on a full pipe.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TAG_ENV = "KUBEDDP_TEST_PROC_TAG"
POLL_SECONDS = 0.05


def kubeddp_argv(*args: str) -> list[str]:
    """`kubeddp ARGS` through this interpreter (the venv's, wherever pytest runs from)."""
    return [sys.executable, "-m", "kubeddp", *args]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's env plus the repo on PYTHONPATH (test workloads import `tests.helpers`)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # the process ended meanwhile, or is not ours to read
        return b""


def tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment holds TAG_ENV=tag."""
    needle = f"{TAG_ENV}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and needle in _read(f"/proc/{entry}/environ").split(b"\0"):
            found.append(int(entry))
    return found


def children(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc/PID/task/*/children)."""
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            kids += [int(x) for x in _read(f"/proc/{pid}/task/{tid}/children").split()]
    return sorted(set(kids))


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def cmdline(pid: int) -> str:
    return _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()


def environ(pid: int) -> dict[str, str]:
    pairs = _read(f"/proc/{pid}/environ").decode(errors="replace").split("\0")
    return dict(p.split("=", 1) for p in pairs if "=" in p)


def torchrun_workers(agent_pid: int) -> dict[int, int]:
    """Global rank -> pid of the training processes torchrun's agent `agent_pid` started."""
    ranks = {}
    for pid in descendants(agent_pid):
        env = environ(pid)
        if "TORCHELASTIC_RUN_ID" in env and "RANK" in env and "kubeddp" in cmdline(pid):
            ranks[int(env["RANK"])] = pid
    return ranks


def kill_tagged(tag: str, deadline_seconds: float = 10.0) -> None:
    """SIGKILL every process carrying `tag` until none is left (new ones may still be forking)."""
    end = time.monotonic() + deadline_seconds
    while True:
        pids = tagged_pids(tag)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > end:
            raise RuntimeError(f"processes {pids} tagged {tag} survive SIGKILL")
        time.sleep(POLL_SECONDS)


def wait_until(
    predicate: Callable[[], object], timeout: float, what: str, proc: Proc | None = None
) -> object:
    """Poll until predicate() is truthy; on timeout fail with `what` and the process's log."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: process exited with {proc.poll()} first\n{proc.tail()}")
        if time.monotonic() > end:
            tail = f"\n{proc.tail()}" if proc is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{tail}")
        time.sleep(POLL_SECONDS)


class Proc:
    """One started command: its own session, a log file, a tag on the whole tree."""

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.tag = uuid.uuid4().hex
        self.argv = list(argv)
        self.log_path = Path(log_path)
        full_env = dict(env if env is not None else child_env())
        full_env[TAG_ENV] = self.tag
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                self.argv,
                env=full_env,
                cwd=cwd or REPO,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 60) -> str:
        text = self.output().splitlines()[-lines:]
        return f"--- last {len(text)} lines of {self.log_path} ---\n" + "\n".join(text)

    def wait(self, timeout: float) -> int:
        """Exit code; a timeout kills the whole tree and fails with the log's tail."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{' '.join(self.argv)} still running after {timeout:.0f}s; killed\n{self.tail()}"
            ) from None

    def send_signal(self, sig: int) -> None:
        """Signal the started process only (as tini/kubelet would), not its tree."""
        self.popen.send_signal(sig)

    def wait_for_output(self, pattern: str, timeout: float) -> re.Match[str]:
        regex = re.compile(pattern, re.MULTILINE)
        found = wait_until(lambda: regex.search(self.output()), timeout, repr(pattern), self)
        assert isinstance(found, re.Match)
        return found

    def kill(self) -> None:
        """SIGKILL the command and everything it started (also orphaned workers)."""
        kill_tagged(self.tag)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)


@contextlib.contextmanager
def started(
    argv: Sequence[str],
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[Proc]:
    """Start `argv`; whatever happens in the block, nothing it started outlives it."""
    proc = Proc(argv, log_path, env, cwd)
    try:
        yield proc
    finally:
        proc.kill()


@dataclass
class Finished:
    code: int
    output: str


def run(
    argv: Sequence[str],
    log_path: Path,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Finished:
    """Run to completion (or kill after `timeout` and fail); return exit code and output."""
    with started(argv, log_path, env, cwd) as proc:
        code = proc.wait(timeout)
        return Finished(code, proc.output())


def _stdout_target(mode: str | None, file) -> tuple[object, list[int]]:
    """What Popen gets as stdout, and the fds to close once the child has its copy."""
    if mode == "full":
        fd = os.open("/dev/full", os.O_WRONLY)
        return fd, [fd]
    if mode == "broken-pipe":
        read_end, write_end = os.pipe()
        os.close(read_end)  # no reader: the child's first write gets EPIPE
        return write_end, [write_end]
    return file, []


@dataclass
class Split:
    code: int
    stdout: str
    stderr: str


def run_split(
    argv: Sequence[str],
    work_dir: Path,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stdout: str | None = None,
) -> Split:
    """Run to completion with stdout and stderr kept apart (files, never pipes); everything it
    started is killed afterwards, as with `run`. `stdout`: "full" (/dev/full), "closed" (no
    fd 1 at all) or "broken-pipe" (a pipe whose reader is gone) instead of a file."""
    tag = uuid.uuid4().hex
    full_env = dict(env if env is not None else child_env())
    full_env[TAG_ENV] = tag
    out_path, err_path = work_dir / f"{tag}.out", work_dir / f"{tag}.err"
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            target, close_fds_after = _stdout_target(stdout, out)
            popen = subprocess.Popen(
                list(argv), env=full_env, cwd=cwd or REPO, stdin=subprocess.DEVNULL,
                stdout=target, stderr=err, start_new_session=True,
                preexec_fn=(lambda: os.close(1)) if stdout == "closed" else None,
            )  # fmt: skip
            for fd in close_fds_after:
                os.close(fd)
            try:
                code = popen.wait(timeout)
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"{' '.join(argv)} still running after {timeout:.0f}s"
                ) from None
        return Split(
            code, out_path.read_text(errors="replace"), err_path.read_text(errors="replace")
        )
    finally:
        kill_tagged(tag)
