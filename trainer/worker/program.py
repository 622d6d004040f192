"""Run a user's own training program as one torchrun worker, as `python` would run it.

    python -m kubeddp.trainer.worker.program script PATH [ARGS...]   # like python PATH ARGS
    python -m kubeddp.trainer.worker.program module NAME [ARGS...]   # like python -m NAME ARGS
    python -m kubeddp.trainer.worker.program executable PROG [ARGS...]   # PROG ARGS (--no-python)

`kubeddp launch --script/--module` starts this under torchrun. The program sees what `python`
would give it (`__name__ == "__main__"`, `sys.argv`, `sys.path[0]`), plus what kubeddp adds:
SIGTERM sets `kubeddp.api.stop_requested()` (stop_signal.py), and an exception that escapes
the program ends the process with the exit code the operators need (failures.py: a peer's
failure is retryable, the program's own is not) after its traceback.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import runpy
import shlex
import sys
import traceback
from dataclasses import dataclass
from typing import NoReturn

from kubeddp.trainer import constants, exit_codes, process_contract
from kubeddp.trainer.common import one_line
from kubeddp.trainer.config import ConfigError
from kubeddp.trainer.worker import program_rendezvous, program_watch, spawn_guard, stop_signal
from kubeddp.trainer.worker.failures import exit_code_for
from kubeddp.trainer.worker.leave import leave
from kubeddp.trainer.worker.parent_death import die_with_launcher

RUNNER_MODULE = "kubeddp.trainer.worker.program"
# Imported by the runner only later (SIGTERM, the end): see _own_imports_first
RUNNER_LATE_IMPORTS = (
    "json", "kubeddp.trainer.config", "kubeddp.trainer.worker.preemption", "linecache",
    "tokenize",
)  # fmt: skip
MODES = ("script", "module", "executable")
# torchrun's description of one worker: a program that spawns its own workers gets the
# environment `python` would give it, or its children would all read rank 0 of a world of 1.
TORCHRUN_WORKER_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
)  # fmt: skip


@dataclass(frozen=True)
class Program:
    mode: str  # "script" | "module" | "executable" (torchrun's --no-python)
    target: str  # a file path, a module name, or a program (a path, or a name on PATH)
    args: tuple[str, ...] = ()

    def runner_args(self) -> list[str]:
        """The runner's own arguments (after `-m kubeddp.trainer.worker.program`)."""
        return [self.mode, self.target, *self.args]

    @property
    def shown(self) -> str:
        return f"-m {self.target}" if self.mode == "module" else self.target

    def command_line(self) -> str:
        """As one would type it after `python` (an executable: as is), for the log."""
        start = ["-m", self.target] if self.mode == "module" else [self.target]
        return shlex.join([*start, *self.args])


def _log(message: str) -> None:
    print(f"[kubeddp] {message}", file=sys.stderr, flush=True)


def _preempt_grace_seconds() -> float:
    try:
        cfg = process_contract.resolved_config(os.environ)
    except ConfigError as exc:
        _log(f"warning: {exc}")
        cfg = None
    if cfg is None:
        return float(constants.PREEMPT_GRACE_SECONDS)
    return cfg.checkpoint.preempt_grace_seconds


def _first_on_path(directory: str) -> None:
    """`directory` first on sys.path, as `python` puts it there for the program. Under
    PYTHONSAFEPATH (set by launch) nothing of the working directory's was on it; else (Python
    3.10) the working directory was, and it gives way."""
    if getattr(sys.flags, "safe_path", False) or not sys.path:
        sys.path.insert(0, directory)
    else:
        sys.path[0] = directory


def _execute(program: Program) -> None:
    if program.mode == "script":
        # `python PATH` puts the script's own directory first on sys.path (symlinks resolved).
        _first_on_path(os.path.dirname(os.path.realpath(program.target)))
        sys.argv = [program.target, *program.args]
        runpy.run_path(program.target, run_name="__main__")
    else:
        # `python -m NAME` puts the working directory first: the one launch started in (not
        # checkpoint.dir, where it may have moved the program: files fetched there are data).
        _first_on_path(os.environ.get(process_contract.ENV_LAUNCH_DIR) or os.getcwd())
        # alter_sys sets sys.argv[0] to the module's file, as `python -m` does.
        sys.argv = [program.target, *program.args]
        runpy.run_module(program.target, run_name="__main__", alter_sys=True)


def _own_imports_first() -> None:
    """What the runner imports later (on SIGTERM, at the end), imported now, while sys.path
    holds only the standard library and kubeddp: a user's `json.py` beside their script must
    not become the runner's. The program's own environment is what `python` would give it."""
    if os.environ.pop(process_contract.ENV_SAFE_PATH_ADDED, None) == "1":
        os.environ.pop(process_contract.ENV_SAFE_PATH, None)
    for name in RUNNER_LATE_IMPORTS:
        importlib.import_module(name)


def run_program(program: Program) -> NoReturn:
    """Run the program in this process, then end the process with its exit code."""
    die_with_launcher()  # first: a launcher killed from now on takes the program with it
    _own_imports_first()
    if program.mode == "executable":
        _exec(program)
    if os.environ.get(process_contract.ENV_SPAWNS_WORKERS) == "1":
        for name in TORCHRUN_WORKER_VARS:
            os.environ.pop(name, None)
    elif os.environ.get("LOCAL_RANK") == "0":  # a program that spawns its own is named once
        with contextlib.suppress(ValueError):
            spawn_guard.install(program.shown, int(os.environ.get("WORLD_SIZE", "1")))
    program_rendezvous.install()  # a tcp:// init, or a MASTER_PORT of the program's own
    stop_signal.install(_preempt_grace_seconds())
    process_contract.note_start()
    program_watch.install()  # the heartbeat a stall report reads (no-op without diagnostics)
    try:
        _execute(program)
    except SystemExit as exc:
        code = exit_code_for(exc)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr, flush=True)  # sys.exit("message"), as python does
        elif isinstance(exc.code, int) and exc.code != code:
            _log(f"{program.shown} called sys.exit({exc.code}), outside 0-255; exit code "
                 f"{exit_codes.describe(code)}")  # fmt: skip
    except KeyboardInterrupt:  # Ctrl-C reached the workers through torchrun: quietly, 130
        code = exit_codes.INTERRUPTED
        _log(f"{program.shown} interrupted; exit code {exit_codes.describe(code)}")
    except BaseException as exc:  # every other escape maps to an exit code
        traceback.print_exc()
        code = exit_code_for(exc)
        _log(f"{program.shown} failed: {one_line(exc)}; exit code {exit_codes.describe(code)}")
    else:
        code = exit_codes.OK
    if code == exit_codes.OK:
        process_contract.note_returned()  # a peer still running may fail because of it
    stop_signal.flush_reported_steps()
    sys.stderr.flush()
    leave(code)


def _exec(program: Program) -> NoReturn:
    """torchrun's --no-python: the program replaces this process (its pid, so torchrun's
    signals and the launcher's death reach it), and its exit code is the worker's."""
    try:
        os.execvp(program.target, [program.target, *program.args])
    except OSError as exc:
        _log(f"cannot run {program.target}: {exc.strerror}; exit code "
             f"{exit_codes.describe(exit_codes.BAD_INPUT)}")  # fmt: skip
        os._exit(exit_codes.BAD_INPUT)


def parse(argv: list[str]) -> Program:
    if len(argv) < 2 or argv[0] not in MODES:
        raise SystemExit(
            f"usage: python -m {RUNNER_MODULE} {{script PATH|module NAME|executable PROG}} "
            "[ARGS...]; kubeddp launch --script/--module starts it"
        )
    return Program(argv[0], argv[1], tuple(argv[2:]))


def main(argv: list[str] | None = None) -> NoReturn:
    run_program(parse(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
