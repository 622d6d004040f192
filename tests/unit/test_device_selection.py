"""The GPU decisions (device from LOCAL_RANK, backend, AMP dtype), testable without a GPU.

CUDA is absent on CI machines, so `torch.cuda` is made to report devices here; the code under
test only asks torch how many devices exist and picks from that.
"""

from __future__ import annotations

import pytest
import torch

from kubeddp.trainer.config import DDPConfig
from kubeddp.trainer.worker.distributed import DistributedSetupError, choose_backend, choose_device
from kubeddp.trainer.worker.precision import amp_dtype

CPU = torch.device("cpu")
CUDA1 = torch.device("cuda", 1)


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)


def test_auto_device_is_cpu_without_cuda() -> None:
    assert not torch.cuda.is_available()
    assert choose_device(DDPConfig(), local_rank=1) == CPU


def test_cuda_requested_without_cuda_is_one_clear_error() -> None:
    with pytest.raises(DistributedSetupError, match="no CUDA device is visible; .*ddp.device=cpu"):
        choose_device(DDPConfig(device="cuda"), local_rank=0)


def test_auto_device_binds_the_local_rank_gpu(four_gpus: None) -> None:
    assert choose_device(DDPConfig(), local_rank=1) == CUDA1
    assert choose_device(DDPConfig(device="cpu"), local_rank=1) == CPU


def test_more_local_ranks_than_gpus_is_refused(four_gpus: None) -> None:
    with pytest.raises(DistributedSetupError, match="LOCAL_RANK=4 but only 4 CUDA devices"):
        choose_device(DDPConfig(), local_rank=4)


@pytest.mark.parametrize(
    ("backend", "device", "expected"),
    [("auto", CUDA1, "nccl"), ("auto", CPU, "gloo"), ("gloo", CUDA1, "gloo")],
)
def test_backend_follows_the_device(backend: str, device: torch.device, expected: str) -> None:
    assert choose_backend(DDPConfig(backend=backend), device) == expected


def test_nccl_on_cpu_is_refused() -> None:
    with pytest.raises(DistributedSetupError, match="nccl needs CUDA; use gloo"):
        choose_backend(DDPConfig(backend="nccl"), CPU)


@pytest.mark.parametrize(
    ("mode", "device", "expected"),
    [
        ("auto", CUDA1, torch.bfloat16),
        ("auto", CPU, None),
        ("off", CUDA1, None),
        ("bf16", CPU, torch.bfloat16),
        ("fp16", CUDA1, torch.float16),
    ],
)
def testamp_dtype(mode: str, device: torch.device, expected: torch.dtype | None) -> None:
    assert amp_dtype(mode, device) == expected


def test_fp16_on_cpu_is_refused() -> None:
    with pytest.raises(ValueError, match="fp16 needs CUDA"):
        amp_dtype("fp16", CPU)
