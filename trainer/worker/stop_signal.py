"""SIGTERM for a user's own program: the flag behind `kubeddp.api.stop_requested()`.

The built-in trainer votes on SIGTERM at step boundaries (preemption.py). A user's program
cannot be stopped at a step boundary from outside, so it decides: a program that polls
`stop_requested()` gets `checkpoint.preempt_grace_seconds` to save and exit (then exit 143 is
forced by preemption.py's grace timer); a program that never polled it is ended at once with
143, since nothing in it would react to the flag. torch is not imported here: `kubeddp.api`
must stay cheap to import.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

from kubeddp.trainer import constants, exit_codes


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
        _log(
            "SIGTERM: the program does not poll kubeddp.api.stop_requested(); exiting now with "
            f"{exit_codes.PREEMPTED}"
        )
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
    return True


def requested() -> bool:
    """True once SIGTERM reached this process; marks the program as one that polls."""
    STATE.polled = True
    if not STATE.installed:
        # Not started by kubeddp's runner (a plain torchrun): catch SIGTERM from now on.
        install(_grace_from_env())
    return STATE.requested


def _grace_from_env() -> float:
    from kubeddp.trainer.config import ConfigError, resolved_config

    try:
        cfg = resolved_config(os.environ)
    except ConfigError:
        cfg = None
    return (
        cfg.checkpoint.preempt_grace_seconds
        if cfg is not None
        else float(constants.PREEMPT_GRACE_SECONDS)
    )
