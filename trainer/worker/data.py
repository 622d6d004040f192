"""The training DataLoader, and moving its batches to the device."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from kubeddp.trainer.config import TrainConfig
from kubeddp.trainer.worker.sampler import ResumableDistributedSampler


def build_train_loader(
    dataset: Dataset, sampler: ResumableDistributedSampler, cfg: TrainConfig, device: torch.device
) -> DataLoader:
    use_workers = cfg.num_workers > 0
    return DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        sampler=sampler,
        num_workers=cfg.num_workers,
        pin_memory=cfg.pin_memory and device.type == "cuda",
        persistent_workers=cfg.persistent_workers and use_workers,
        prefetch_factor=cfg.prefetch_factor if use_workers else None,
        drop_last=False,
    )


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
