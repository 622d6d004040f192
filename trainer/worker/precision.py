"""Numeric precision: the autocast dtype a device runs with, the context that applies it, and
the precision of fp32 matmuls (TF32)."""

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


def tf32_enabled(wanted: bool, device: torch.device) -> bool:
    """train.tf32 on CUDA: fp32 matmuls (those outside autocast, or all of them with
    train.amp=off) run on TF32 tensor cores, about 2x faster (33 -> 16 ms per step for a
    6x384 charlm on an H200) with a 10-bit mantissa. The flag only affects CUDA."""
    return wanted and device.type == "cuda"


def set_fp32_matmul_precision(wanted: bool, device: torch.device) -> None:
    """Apply train.tf32 on CUDA; CPU runs are left as torch set them.
    torch.set_float32_matmul_precision exists in every supported torch (the newer
    torch.backends.cuda.matmul.fp32_precision does not)."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high" if tf32_enabled(wanted, device) else "highest")
