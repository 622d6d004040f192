"""SIGTERM/SIGINT reaching the launch process at any moment end it with 128 + N, never a
traceback or exit 4.

torchrun's agent turns them into its SignalException while it runs and leaves that handler
installed afterwards, so a signal in the last second (the metrics endpoint shutting down, the
log dir being removed) used to escape as an internal error. Launch installs `install()`
before it starts anything and maps both exception kinds with `exit_code_of`; once the run's
exit code is decided (0 when the program finished) it ignores them (`ignore()`), so that the
endpoint's shutdown and the interpreter's own end complete.
"""

from __future__ import annotations

import atexit
import signal
from types import FrameType
from typing import Any

from kubeddp.trainer import exit_codes

HANDLED = (signal.SIGTERM, signal.SIGINT)


class Terminated(Exception):
    """SIGTERM/SIGINT reached launch before or after torchrun's agent handled it."""

    def __init__(self, sigval: int) -> None:
        super().__init__(f"{signal.Signals(sigval).name} received")
        self.sigval = sigval


RECEIVED: list[int] = []
# True when launch is the process itself (the `kubeddp` command), not a call inside another
# program (a test): its handlers are then not restored, SIGTERM stays ignored to the end.
PROCESS_ENDS_WITH_LAUNCH = False


def _raise(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001 - handler signature
    RECEIVED.append(signum)
    raise Terminated(signum)


def install() -> dict[int, Any]:
    """From now on a SIGTERM/SIGINT raises Terminated (torchrun replaces it while it runs);
    the handlers it replaced, for `restore`."""
    previous = {sig: signal.getsignal(sig) for sig in HANDLED}
    for sig in HANDLED:
        signal.signal(sig, _raise)
    RECEIVED.clear()
    atexit.unregister(ignore)  # registered once; see `ignore`
    atexit.register(ignore)
    return previous


def restore(previous: dict[int, Any]) -> None:
    """The handlers launch found, when it runs inside another program (a test); at the
    interpreter's exit `ignore` applies again."""
    if PROCESS_ENDS_WITH_LAUNCH:
        return
    for sig, handler in previous.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def exit_code_of(exc: BaseException) -> int | None:
    """The code of a signal turned into an exception (ours or torchrun's), else None."""
    if isinstance(exc, Terminated):
        return exit_codes.for_signal(exc.sigval)
    if type(exc).__name__ == "SignalException" and hasattr(exc, "sigval"):
        return exit_codes.for_signal(int(exc.sigval))  # torch's: SIGHUP, SIGQUIT as well
    return None


def pending_code() -> int | None:
    """128 + N when a signal arrived while code that swallows exceptions ran (torch's own
    imports catch some): launch checks this before it starts the workers."""
    return exit_codes.for_signal(RECEIVED[0]) if RECEIVED else None


def ignore() -> None:
    """From now on SIGTERM/SIGINT are ignored: the exit code is decided and launch is ending.
    Python's finalization resets function handlers to the default (a signal then kills the
    process, a finished run would read 143) but keeps SIG_IGN; atexit calls this too."""
    for sig in HANDLED:
        signal.signal(sig, signal.SIG_IGN)
