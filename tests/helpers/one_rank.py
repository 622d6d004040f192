"""A real one-process process group in the test's own process (gloo on CPU, NCCL on a GPU):
enough for the collectives the loop calls every step, with no second process to manage."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist

from kubeddp.trainer.worker.distributed import DistContext

# The device types a test runs on: the CPU always, CUDA where this machine has a GPU.
DEVICE_TYPES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    ),
]


@contextmanager
def one_rank_group(device_type: str) -> Iterator[DistContext]:
    device = torch.device(device_type, 0) if device_type == "cuda" else torch.device("cpu")
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield DistContext(0, 1, device, backend)
    finally:
        gc.collect()  # DDP modules and optimizers must be gone before the group
        dist.destroy_process_group()
