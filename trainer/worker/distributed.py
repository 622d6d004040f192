"""Distributed init and teardown (backend by device, device from LOCAL_RANK, two timeouts),
the DDP wrapper, and the few collectives the loop and checkpointing call directly.

The start-up timeout covers pods that come up minutes apart; once the first step has run the
group switches to the shorter training timeout, so a hung peer is noticed sooner.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from kubeddp.trainer.config import DDPConfig
from kubeddp.trainer.devices import DistributedSetupError, choose_device


@dataclass
class DistContext:
    rank: int
    world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()


def choose_backend(cfg: DDPConfig, device: torch.device) -> str:
    if cfg.backend != "auto":
        if cfg.backend == "nccl" and device.type != "cuda":
            raise DistributedSetupError("ddp.backend=nccl needs CUDA; use gloo on CPU")
        return cfg.backend
    return "nccl" if device.type == "cuda" else "gloo"


def init_distributed(cfg: DDPConfig) -> DistContext:
    """Bind the device and join the process group torchrun prepared (or run alone)."""
    env = os.environ
    rank = int(env.get("RANK", "0"))
    world = int(env.get("WORLD_SIZE", "1"))
    local_rank = int(env.get("LOCAL_RANK", "0"))
    device = choose_device(cfg, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = choose_backend(cfg, device)
    if "MASTER_ADDR" in env and world >= 1:
        kwargs = {}
        if device.type == "cuda":
            kwargs["device_id"] = device  # eager NCCL init: fail at start, not at step 1
        dist.init_process_group(
            backend=backend, timeout=timedelta(seconds=cfg.startup_timeout_seconds), **kwargs
        )
    return DistContext(rank, world, device, backend)


def wrap_ddp(model: torch.nn.Module, cfg: DDPConfig, ctx: DistContext) -> torch.nn.Module:
    """The model in DDP with the ddp.* settings; as it is when running alone."""
    if not ctx.distributed:
        return model
    return DDP(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        bucket_cap_mb=cfg.bucket_cap_mb,
        gradient_as_bucket_view=cfg.gradient_as_bucket_view,
        static_graph=cfg.static_graph,
        find_unused_parameters=cfg.find_unused_parameters,
    )


def mean_over_ranks(value: float | torch.Tensor, ctx: DistContext) -> float:
    """The mean of `value` over all ranks (collective), read to the host: one sync."""
    if isinstance(value, torch.Tensor):
        total = value.detach().reshape(1).to(torch.float64)
    else:
        total = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    if not ctx.distributed:
        return total.item()
    dist.all_reduce(total)
    return total.item() / ctx.world_size


def switch_to_training_timeout(cfg: DDPConfig, log: Callable[[str], None]) -> bool:
    """After the first step, replace the start-up timeout with the training timeout; say so in
    the log either way. True when the group's timeout was changed.

    torch 2.14 has the public `dist.set_timeout`; earlier versions only the private
    `_set_pg_timeout` (same effect: the default timeout of the group's gloo/NCCL backends).
    """
    if not dist.is_initialized():
        return False
    setter = getattr(dist, "set_timeout", None) or getattr(
        dist.distributed_c10d, "_set_pg_timeout", None
    )
    if setter is None:
        log(
            f"[kubeddp] warning: torch {torch.__version__} cannot change a process group's "
            f"timeout; collectives keep ddp.startup_timeout_seconds="
            f"{cfg.startup_timeout_seconds:g} (a hung peer is noticed only after it)"
        )
        return False
    setter(timedelta(seconds=cfg.timeout_seconds), None)
    log(
        f"[kubeddp] collective timeout now ddp.timeout_seconds={cfg.timeout_seconds:g} s "
        f"(start-up: {cfg.startup_timeout_seconds:g} s)"
    )
    return True


def teardown(barrier: bool = True) -> None:
    """Destroy the process group safely.

    destroy_process_group() while a DDP module or optimizer is still alive aborts the process
    now and then (SIGABRT in the reducer's destructor). Callers must have dropped every DDP,
    optimizer and trainer reference first; collecting garbage here makes sure they are gone.
    """
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()


def gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank (collective over `group`, else all)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s `obj` on every rank (collective; the other ranks' `obj` is ignored)."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
