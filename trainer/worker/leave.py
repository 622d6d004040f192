"""How a worker process ends: as the interpreter's shutdown would, short of tearing down torch's
C++ state.

A process group, DDP module or c10d store met in that teardown can abort the process (SIGABRT,
"terminate called without an active exception") and turn the code the operators act on into a
crash: about 1 in 7 two-node runs of a tutorial script that destroyed its process group, and
once in CI a built-in worker stopping on a NaN (6 became 205, retried instead of failing).
What a program relies on at exit still happens: after a success its non-daemon threads are
joined (after a failure they may wait on peers that are gone), its atexit handlers run, and its
open files are flushed.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import os
import sys
import threading
from typing import NoReturn

from kubeddp.trainer import exit_codes
from kubeddp.trainer.worker import stop_signal


def leave(code: int) -> NoReturn:
    """End this worker with `code` (see the module's docstring)."""
    if code == exit_codes.OK:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()
    for obj in gc.get_objects():  # files the program left open, as their finalizers would
        # type(obj), not isinstance: isinstance reads obj.__class__, and a deprecated object
        # (torch.distributed.reduce_op) warns on every attribute read
        if issubclass(type(obj), io.IOBase):
            with contextlib.suppress(Exception):
                if not obj.closed and obj.writable():
                    obj.flush()
    stop_signal.flush_reported_steps()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
