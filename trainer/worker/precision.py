"""Mixed precision: which autocast dtype a device runs with, and the context that applies it."""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def amp_dtype(mode: str, device: torch.device) -> torch.dtype | None:
    """train.amp -> the autocast dtype (None: full precision)."""
    if mode == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    if mode == "fp16" and device.type != "cuda":
        raise ValueError("train.amp=fp16 needs CUDA; use bf16 or off on CPU")
    return {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[mode]


def autocast(device: torch.device, dtype: torch.dtype | None) -> Any:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
