"""SIGTERM for a user's own program: the flag behind `kubeddp.api.stop_requested()`.

The built-in trainer votes on SIGTERM at step boundaries (preemption.py). A user's program
cannot be stopped at a step boundary from outside, so it decides: a program that polls
`stop_requested()` gets `checkpoint.preempt_grace_seconds` to save and exit (then exit 143 is
forced by preemption.py's grace timer); a program that never polled it is ended at once with
143, since nothing in it would react to the flag. torch is not imported here: `kubeddp.api`
must stay cheap to import.

Python runs a signal handler only when the main thread is back in Python: a worker stuck in
native code (a collective whose peer is gone, a hung init) would never see SIGTERM and wait
for the agent's SIGKILL (grace + 10 s). A watcher thread reads the signal from the wakeup fd,
which the C-level handler writes at once, and ends such a worker when the handler has not run
in time: it can never save.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

from kubeddp.trainer import constants, exit_codes

# Imported in functions: the config (yaml, 38 modules) and process_contract, only when the grace is
# read: kubeddp.api imports this module and must stay cheap.

# Seconds the main thread has to run the SIGTERM handler before the worker counts as stuck in
# native code: a program that polls may be inside one long kernel; one that never polls is
# ended by the handler anyway.
STUCK_POLLING_SECONDS = 10.0
STUCK_SECONDS = 1.0


class _StopState:
    def __init__(self) -> None:
        self.requested = False  # SIGTERM arrived
        self.polled = False  # the program asked at least once: it will react to the flag
        self.installed = False
        self.grace_seconds = float(constants.PREEMPT_GRACE_SECONDS)


STATE = _StopState()


def _log(message: str) -> None:
    print(f"[kubeddp] {message}", file=sys.stderr, flush=True)


def _on_sigterm(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    if STATE.requested:
        return
    STATE.requested = True
    if not STATE.polled:
        # Quietly: launch says once why its workers stop (a preemption, or a failed peer, when
        # every healthy worker would otherwise print this).
        flush_reported_steps()
        os._exit(exit_codes.PREEMPTED)  # peers are stopping too: no teardown, no barrier
    _log(
        "SIGTERM: kubeddp.api.stop_requested() is now true; the program has "
        f"{STATE.grace_seconds:g}s (checkpoint.preempt_grace_seconds) to save and exit"
    )
    # Imported here: a program that polls the flag trains with torch, already imported.
    from kubeddp.trainer.worker.preemption import start_grace_timer

    start_grace_timer(STATE.grace_seconds)


def flush_reported_steps() -> None:
    """Before a forced exit (which skips atexit): what report_step buffered, and stdout."""
    api = sys.modules.get("kubeddp.api")
    if api is not None:
        api._flush()
    # A signal may land while the program itself is writing to stdout (a reentrant flush
    # raises): what that write holds is then lost, not the exit code.
    with contextlib.suppress(RuntimeError, OSError, ValueError):
        sys.stdout.flush()


def install(grace_seconds: float) -> bool:
    """Catch SIGTERM in this process (main thread only: Python runs handlers there)."""
    STATE.grace_seconds = grace_seconds
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, _on_sigterm)
    STATE.installed = True
    _watch_for_stuck_main_thread()
    return True


def _watch_for_stuck_main_thread() -> None:
    try:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (OSError, ValueError):
        return  # not the main thread, or no pipe: the agent's SIGKILL remains
    # A forked child (a DataLoader worker, mp.Process) would write its own signals into this
    # pipe: a SIGTERM to it alone would look like one to this process.
    os.register_at_fork(after_in_child=_no_wakeup_fd)
    threading.Thread(target=_watch, args=(read_fd,), name="kubeddp-sigterm", daemon=True).start()


def _no_wakeup_fd() -> None:
    with contextlib.suppress(ValueError):  # forked from another thread: nothing to undo here
        signal.set_wakeup_fd(-1)


def _watch(read_fd: int) -> None:
    while True:  # one byte per signal caught, its number
        got = os.read(read_fd, 64)
        if not got:
            return
        if signal.SIGTERM in got:
            break
    wait = min(STUCK_POLLING_SECONDS, STATE.grace_seconds) if STATE.polled else STUCK_SECONDS
    end = time.monotonic() + wait
    while not STATE.requested and time.monotonic() < end:
        time.sleep(0.05)
    if not STATE.requested:  # the handler never ran: the main thread is stuck in native code
        os.write(
            sys.stderr.fileno(),  # not through sys.stderr: the stuck thread may hold its lock
            f"[kubeddp] SIGTERM: the program has been in native code for {wait:g}s (a "
            "collective or init that cannot finish) and cannot save; exiting now with "
            f"{exit_codes.PREEMPTED}\n".encode(),
        )
        os._exit(exit_codes.PREEMPTED)


def requested() -> bool:
    """True once SIGTERM reached this process; marks the program as one that polls."""
    STATE.polled = True
    if not STATE.installed:
        # Not started by kubeddp's runner (a plain torchrun): catch SIGTERM from now on.
        install(_grace_from_env())
    return STATE.requested


def _grace_from_env() -> float:
    from kubeddp.trainer.config import ConfigError
    from kubeddp.trainer.process_contract import resolved_config

    try:
        cfg = resolved_config(os.environ)
    except ConfigError:
        cfg = None
    return (
        cfg.checkpoint.preempt_grace_seconds
        if cfg is not None
        else float(constants.PREEMPT_GRACE_SECONDS)
    )
