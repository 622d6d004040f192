"""The training DataLoader, and moving its batches to the device."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from kubeddp.trainer.config import TrainConfig
from kubeddp.trainer.worker.sampler import ResumableDistributedSampler


def pins_memory(cfg: TrainConfig, device: torch.device) -> bool:
    """Batches in page-locked memory: only then is a host-to-GPU copy asynchronous."""
    return cfg.pin_memory and device.type == "cuda"


def build_train_loader(
    dataset: Dataset, sampler: ResumableDistributedSampler, cfg: TrainConfig, device: torch.device
) -> DataLoader:
    use_workers = cfg.num_workers > 0
    return DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        sampler=sampler,
        num_workers=cfg.num_workers,
        pin_memory=pins_memory(cfg, device),
        persistent_workers=cfg.persistent_workers and use_workers,
        prefetch_factor=cfg.prefetch_factor if use_workers else None,
        drop_last=cfg.drop_last,
    )


def tensors_of(batch: Any) -> list[torch.Tensor]:
    """The tensors of a tensor, list, tuple or dict batch (nested), in order."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, (list, tuple)):
        return [t for item in batch for t in tensors_of(item)]
    if isinstance(batch, dict):
        return [t for item in batch.values() for t in tensors_of(item)]
    return []


def unpinned_host_tensors(batch: Any) -> int:
    """Host tensors of a batch outside pinned memory: their copies to a GPU block the host
    (non_blocking=True is then only a request)."""
    return sum(1 for t in tensors_of(batch) if t.device.type == "cpu" and not t.is_pinned())


def leading_dim(batch: Any) -> int | None:
    """The batch dimension of a batch: the first dimension of its first tensor."""
    found = tensors_of(batch)
    return found[0].shape[0] if found and found[0].dim() else None


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def batch_samples(batch: Any, default: int) -> int:
    """Samples in a batch: the length of its first field (a dict batch counts as `default`)."""
    return len(batch[0]) if isinstance(batch, (list, tuple)) else default
