"""The GPU stack's versions for the start-up line and kubeddp_info: parsed from what torch,
NVML and the driver's /proc file say, empty where they do not apply."""

from __future__ import annotations

import pytest
import torch

from kubeddp.trainer.worker.versions import (
    RuntimeVersions,
    nccl_version_text,
    parse_driver_version,
    runtime_versions,
)

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Oct 23 2025\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
            "580.159.04",
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build\n",
            "550.54.15",
        ),
        ("NVRM version: NVIDIA UNIX aarch64 Kernel Module  535.104\n", "535.104"),
        ("something else\n", ""),
    ],
)
def test_driver_version_from_the_kernel_module_file(text: str, expected: str) -> None:
    assert parse_driver_version(text) == expected


def test_nccl_version_text() -> None:
    assert nccl_version_text((2, 28, 9)) == "2.28.9"
    assert nccl_version_text((2, 21, 5, "rc1")) == "2.21.5+rc1"
    assert nccl_version_text(2708) == "2708"


def test_cpu_runs_name_torch_only() -> None:
    versions = runtime_versions("cpu")
    assert versions == RuntimeVersions(torch.__version__)
    assert versions.describe() == f"torch {torch.__version__}"
    assert versions.labels() == {
        "torch_version": torch.__version__,
        "cuda_version": "",
        "nccl_version": "",
        "driver_version": "",
    }


def test_gpu_runs_name_the_whole_stack() -> None:
    versions = RuntimeVersions("2.11.0+cu130", "13.0", "2.28.9", "580.159.04")
    assert versions.describe() == "torch 2.11.0+cu130, CUDA 13.0, NCCL 2.28.9, driver 580.159.04"
    assert RuntimeVersions("2.11.0", "13.0").describe() == "torch 2.11.0, CUDA 13.0"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_a_gpu_machine_reports_cuda_nccl_and_the_driver() -> None:
    versions = runtime_versions("cuda")
    assert versions.cuda == torch.version.cuda
    assert versions.nccl.count(".") >= 2, versions
    assert versions.driver.count(".") >= 1, versions
