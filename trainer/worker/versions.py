"""What the GPU stack is made of: torch, its CUDA runtime, NCCL and the NVIDIA driver.

Shown in rank 0's start-up line and as labels of `kubeddp_info`, so a failed NCCL init or a
hang can be matched to the versions that ran. Every part is an empty string when it does not
apply (CPU training) or cannot be read; reading never raises.
"""

from __future__ import annotations

import ctypes
import re
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

# The kernel module's version file: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04
# ..." (proprietary) or "... Open Kernel Module for x86_64  580.159.04 ..." (open modules).
DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")
_DRIVER_RE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")


@dataclass(frozen=True)
class RuntimeVersions:
    torch: str
    cuda: str = ""  # the CUDA runtime torch was built with (torch.version.cuda)
    nccl: str = ""
    driver: str = ""  # the NVIDIA driver release, e.g. 580.159.04

    def describe(self) -> str:
        """`torch 2.11.0+cu130, CUDA 13.0, NCCL 2.28.9, driver 580.159.04` (parts known)."""
        parts = [f"torch {self.torch}"]
        for name, value in (("CUDA", self.cuda), ("NCCL", self.nccl), ("driver", self.driver)):
            if value:
                parts.append(f"{name} {value}")
        return ", ".join(parts)

    def labels(self) -> dict[str, str]:
        """The `kubeddp_info` labels these versions add."""
        return {
            "torch_version": self.torch,
            "cuda_version": self.cuda,
            "nccl_version": self.nccl,
            "driver_version": self.driver,
        }


def parse_driver_version(text: str) -> str:
    """The driver release in the text of /proc/driver/nvidia/version; '' if none."""
    found = _DRIVER_RE.search(text)
    return found.group(1) if found else ""


def nccl_version_text(version: Any) -> str:
    """torch.cuda.nccl.version() as text: (2, 28, 9) -> 2.28.9; a suffix is kept (2.28.9+x)."""
    if isinstance(version, int):  # old torch encoded it as one number, e.g. 2708
        return str(version)
    numbers = [str(part) for part in version if isinstance(part, int)]
    suffix = "".join(str(part) for part in version if not isinstance(part, int))
    return ".".join(numbers) + (f"+{suffix}" if suffix else "")


def _driver_from_nvml() -> str:
    """The driver release through NVML (the library the driver installs); '' without it."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return ""
    if nvml.nvmlInit_v2() != 0:
        return ""
    try:
        buffer = ctypes.create_string_buffer(96)
        if nvml.nvmlSystemGetDriverVersion(buffer, ctypes.c_uint(len(buffer))) != 0:
            return ""
        return buffer.value.decode(errors="replace")
    finally:
        nvml.nvmlShutdown()


def driver_version() -> str:
    try:
        found = parse_driver_version(DRIVER_VERSION_FILE.read_text())
    except OSError:
        found = ""
    return found or _driver_from_nvml()


def _torch_version() -> str:
    torch = sys.modules.get("torch")  # a worker has it; a metrics test need not import it
    if torch is not None:
        return str(torch.__version__)
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""


def runtime_versions(device_type: str) -> RuntimeVersions:
    """The versions that matter on `device_type` ("cuda" or "cpu")."""
    torch_version = _torch_version()
    if device_type != "cuda":
        return RuntimeVersions(torch_version)
    import torch

    nccl = ""
    try:
        import torch.cuda.nccl

        nccl = nccl_version_text(torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 - a torch built without NCCL; the label stays empty
        nccl = ""
    return RuntimeVersions(torch_version, torch.version.cuda or "", nccl, driver_version())


def gpu_uuid(device: Any) -> str:
    """The UUID of a CUDA device as NVIDIA's tools (nvidia-smi, dcgm-exporter's `UUID` label)
    write it, `GPU-...`; '' off CUDA. It names the rank's GPU in the straggler line and in
    kubeddp_rank_info, which joins dcgm-exporter's series to the rank."""
    if getattr(device, "type", None) != "cuda":
        return ""
    import torch  # a worker's: already imported

    uuid = str(torch.cuda.get_device_properties(device).uuid)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
