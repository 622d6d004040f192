"""Which exit code a failed training process ends with (the table is trainer/exit_codes.py).

A collective fails in every surviving rank when another process, pod or node dies, when the
network drops, or when the rendezvous store goes away; those ranks did nothing wrong and a
retry (resuming from the newest checkpoint) can succeed, so they end with PEER_FAILED (>= 128,
retried by the operators). Any other exception is the program's own: TRAINING_FAILED (fatal).
The built-in trainer and the runner of users' own programs both end through `exit_code_for`.
"""

from __future__ import annotations

import sys

from kubeddp.trainer import exit_codes
from kubeddp.trainer.common import one_line  # noqa: F401 (its home until issue 26; tests import it here)

# What gloo, NCCL and c10d put in the RuntimeErrors they raise when a peer or the network goes
# away (gloo raises plain RuntimeErrors; torch.distributed.DistError covers the rest).
PEER_FAILURE_MARKS = (
    "gloo/transport",
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "timed out waiting",
    "timeout caused pair closure",  # gloo: an op on a pair that another op's timeout closed
    "nccl communicator was aborted",
    "nccl error",
    "processgroupnccl",
    "socket timeout",
    "tcpstore",
)


def is_peer_failure(exc: BaseException) -> bool:
    """True when `exc` (or an exception it was raised from) says a peer, the network or the
    rendezvous store failed."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _is_dist_error(current) or isinstance(current, ConnectionError):
            return True
        if isinstance(current, RuntimeError):
            text = str(current).lower()
            if any(mark in text for mark in PEER_FAILURE_MARKS):
                return True
        current = current.__cause__ or current.__context__
    return False


def _is_dist_error(exc: BaseException) -> bool:
    # Looked up only if torch is already imported: a program that never imported it cannot
    # have failed in a collective.
    dist = sys.modules.get("torch.distributed")
    dist_error = getattr(dist, "DistError", None) if dist is not None else None
    return dist_error is not None and isinstance(exc, dist_error)


def exit_code_for(exc: BaseException) -> int:
    """The exit code a process ends with when `exc` escapes its program."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return exit_codes.OK
        if not isinstance(code, int) or not 0 <= code <= 255:
            # sys.exit(-1) would end as 255 and sys.exit(256) as 0 (the status keeps 8 bits):
            # a code the program chose is the program's own failure, never a retry or success.
            return exit_codes.TRAINING_FAILED
        return code
    if isinstance(exc, KeyboardInterrupt):
        return exit_codes.INTERRUPTED
    if is_peer_failure(exc):
        return exit_codes.PEER_FAILED
    return exit_codes.TRAINING_FAILED
