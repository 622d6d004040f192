"""The CLI's standard output, checked: a full disk (`> /dev/full`), a closed stdout (`>&-`) or a
reader that went away (`| head -c 100`) is one line and exit 1, never a traceback or exit 4.

`checked_stdout()` puts a thin wrapper around sys.stdout for one command; a failed write or
flush raises OutputError, which the CLI turns into its one line.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TextIO


class OutputError(Exception):
    """Standard output cannot be written; the message says why."""


def _why(exc: BaseException) -> str:
    if isinstance(exc, BrokenPipeError):
        return "the reader of standard output went away (a closed pipe)"
    if isinstance(exc, OSError):
        return f"cannot write standard output ({exc.strerror or exc})"
    return "standard output is closed"


class _CheckedOutput:
    """sys.stdout for one command: writes and flushes that fail raise OutputError."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        if self._stream is None:  # started with stdout closed: Python sets sys.stdout = None
            raise OutputError(_why(ValueError()))
        try:
            written = self._stream.write(text)
            self._stream.flush()  # fail at the write that failed, not after claiming more
        except (OSError, ValueError) as exc:
            raise OutputError(_why(exc)) from None
        return written

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self._stream is None:
            return
        try:
            self._stream.flush()
        except (OSError, ValueError) as exc:
            raise OutputError(_why(exc)) from None

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _drop_unwritable(stream: TextIO | None) -> None:
    """Point the broken stdout at /dev/null, so the interpreter's own flush at exit does not
    print 'Exception ignored ... BrokenPipeError' after our one line."""
    if stream is None:
        return
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


@contextlib.contextmanager
def checked_stdout() -> Iterator[None]:
    """Within it, sys.stdout raises OutputError for what cannot be written; on the way out
    everything is flushed (a full disk shows only then)."""
    saved = sys.stdout
    sys.stdout = _CheckedOutput(saved)  # type: ignore[assignment]
    try:
        yield
        sys.stdout.flush()
    except OutputError:
        _drop_unwritable(saved)
        raise
    finally:
        sys.stdout = saved


def say(line: str) -> None:
    """One line on stderr, when stderr can take it (a closed stderr leaves the exit code)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        print(line, file=sys.stderr, flush=True)
