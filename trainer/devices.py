"""Which device a worker trains on: shared by the launcher (its compile check before any wait)
and the workers (distributed setup), so it sits above both rooms."""

from __future__ import annotations

import torch

from kubeddp.trainer.config import DDPConfig


class DistributedSetupError(RuntimeError):
    pass


def choose_device(cfg: DDPConfig, local_rank: int) -> torch.device:
    want = cfg.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
        if not torch.cuda.is_available():
            raise DistributedSetupError(
                "ddp.device=cuda but no CUDA device is visible; run with --gpus/nvidia.com/gpu "
                "or set ddp.device=cpu"
            )
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise DistributedSetupError(
                f"LOCAL_RANK={local_rank} but only {count} CUDA devices are visible; "
                "set nprocPerNode to at most the GPUs per node"
            )
        return torch.device("cuda", local_rank)
    return torch.device("cpu")
