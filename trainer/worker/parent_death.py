"""A worker dies with its launcher.

torchrun starts each worker in a session of its own, so a launcher killed with SIGKILL (OOM,
`kill -9`, a crashed shell) leaves its workers training on: writing checkpoints beside the next
run and holding the GPU. Linux's parent-death signal ends them with their parent instead.
Every process that trains calls `die_with_launcher()` first: the kubeddp worker (entry.py) and
the runner of a user's program.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from kubeddp.trainer import exit_codes
from kubeddp.trainer.process_contract import ENV_LAUNCHER_PID

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_armed = False


def die_with_launcher() -> bool:
    """Ask the kernel for SIGKILL when the parent dies; exit at once when it already has.

    The launcher that started this process (KUBEDDP_LAUNCHER_PID, set by `kubeddp launch`; else
    whoever is the parent now) is checked after the request: had it died before, the signal
    would never come. The variable is removed here so that no child of this process mistakes
    the launcher for its own parent. False where the signal is not available (not Linux).
    """
    global _armed
    expected = os.environ.pop(ENV_LAUNCHER_PID, None)
    if _armed:
        return True
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        armed = False
    if not armed:
        return False
    _armed = True
    launcher = int(expected) if expected and expected.isdigit() else parent
    if os.getppid() != launcher:  # the launcher died before the request took effect
        print("[kubeddp] the launcher is gone; this worker exits", file=sys.stderr, flush=True)
        os._exit(exit_codes.KILLED)
    return True
