"""Skip a test that needs root (and some tools) with a visible reason; in CI fail instead."""

from __future__ import annotations

import os
import shutil

import pytest


def require_root(*tools: str, what: str = "this test") -> None:
    reason = None
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if os.geteuid() != 0:
        reason = f"{what} needs root"
    elif missing:
        reason = f"{what} needs {', '.join(missing)} on PATH"
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI must run it")
    pytest.skip(reason)
