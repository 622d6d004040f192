"""Small helpers the launcher and the workers both use (neither room owns them)."""

from __future__ import annotations


def one_line(exc: BaseException) -> str:
    """`TypeName: first line of the message` (a gloo/NCCL message can run over many lines)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
