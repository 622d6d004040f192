"""A training script's source, read the way `python` reads it, and refused in one line when it
cannot be: `kubeddp check` and launch's spawn detection read files users name, which may be a
FIFO, a device, a huge file, not text, or nested beyond what Python's parser takes.

Python's own rules decide the text: a UTF-8 BOM and a PEP 263 coding line are honoured (the
parser reads the bytes), anything else must be UTF-8.
"""

from __future__ import annotations

import ast
import errno
import os
import stat

# Far above any training script (the tutorials' are a few KiB, a long one 100 KiB).
MAX_SCRIPT_BYTES = 8 << 20


class ScriptCheckError(ValueError):
    """The script cannot be read or parsed; one line with the fix."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"


def read_source(path: str) -> bytes:
    """The file's bytes: a regular file of at most MAX_SCRIPT_BYTES, opened without blocking
    (a FIFO with no writer would wait forever) and read with a bound (/dev/zero never ends)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        reason = "is a directory" if exc.errno == errno.EISDIR else exc.strerror
        raise ScriptCheckError(
            f"cannot read {path}: {reason}; give the path of a Python file"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ScriptCheckError(
                f"{path} is {_kind(info.st_mode)}, not a file; give the path of a Python file"
            )
        if info.st_size > MAX_SCRIPT_BYTES:
            raise ScriptCheckError(_too_big(path, info.st_size))
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_SCRIPT_BYTES + 1)
    except OSError as exc:
        raise ScriptCheckError(
            f"cannot read {path}: {exc.strerror}; give a readable file"
        ) from None
    finally:
        os.close(fd)
    if len(data) > MAX_SCRIPT_BYTES:  # it grew while being read
        raise ScriptCheckError(_too_big(path, len(data)))
    return data


def _too_big(path: str, size: int) -> str:
    return (
        f"{path} is {size} bytes, more than the {MAX_SCRIPT_BYTES >> 20} MiB a training script "
        "takes; give the path of the Python file that trains"
    )


def parse(source: bytes | str, path: str = "<script>") -> ast.Module:
    """The module's syntax tree, as `python` would read the file; ScriptCheckError (one line)
    for what Python would refuse too."""
    try:
        return ast.parse(source, filename=path)
    except SyntaxError as exc:
        where = f"{path}:{exc.lineno}" if exc.lineno else path
        raise ScriptCheckError(f"{where}: not valid Python ({exc.msg}); fix it first") from None
    except (RecursionError, MemoryError):
        raise ScriptCheckError(
            f"{path}: nested too deeply for Python's parser (python could not run it either); "
            "split the expression"
        ) from None
    except ValueError as exc:  # a NUL byte
        raise ScriptCheckError(f"{path}: not Python source ({exc}); give a Python file") from None
