"""The CUDA image's Dockerfile stages, built for real on a machine without the CUDA wheels.

SUBSTITUTE: torch here is the CPU wheel (2.13.0+cpu) standing in for PyPI's CUDA build. The
CUDA build needs about 3 GB of nvidia-* wheels (nvidia-cudnn-cu13 and others, pinned by torch's
metadata) that the package index reachable from the test machines does not serve, so what this
proves is everything else of VARIANT=cuda: the hash-locked packages install, the runtime stage
adds the C compiler and Python headers Triton needs (from Debian, so the build uses the host's
network), the build-tools check passes, rdma-core's userspace (NCCL's InfiniBand/RoCE transport)
is there and loads, and the labels and version are the release's. The real CUDA image, and its
EFA variant (VARIANT=efa: the EFA installer, which needs efa-installer.amazonaws.com), are built
by .github/workflows/release.yml (linux/amd64).
"""

from __future__ import annotations

import json
import os
import shutil

import dockerenv
import pytest

from kubeddp.trainer import __version__

TAG = "kubeddp:e2e-cuda-stages"

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def cuda_stages_image(cpu_image: str) -> str:
    """Built once per machine state: docker's layer cache makes a rebuild take seconds."""
    context = dockerenv.CACHE_DIR / f"context-cuda-{os.getpid()}"
    dockerenv.make_context(context)
    args = {
        "BASE_IMAGE": dockerenv.BASE_IMAGE,
        "VARIANT": "cuda",
        "PIP_OFFLINE": "1",  # torch: the CPU wheel in wheels/ (the substitute)
        "TORCH_VERSION": dockerenv.TORCH_VERSION,
    }
    flags = [flag for key, value in args.items() for flag in ("--build-arg", f"{key}={value}")]
    try:
        proc = dockerenv.sh(
            "docker", "build", "--force-rm", "--network", "host", "--tag", TAG, *flags,
            context, timeout=2000, env={**os.environ, "DOCKER_BUILDKIT": "0"}, check=False,
        )  # fmt: skip
    finally:
        shutil.rmtree(context, ignore_errors=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return TAG


def _python(image: str, code: str) -> str:
    proc = dockerenv.sh(
        "docker", "run", "--rm", "--network", "none", "--entrypoint", "python", image, "-c", code,
    )  # fmt: skip
    return proc.stdout.strip()


def test_cuda_stages_carry_the_release_labels(cuda_stages_image: str) -> None:
    proc = dockerenv.sh("docker", "image", "inspect", cuda_stages_image)
    labels = json.loads(proc.stdout)[0]["Config"]["Labels"]
    assert labels["io.kubeddp.variant"] == "cuda"
    assert labels["org.opencontainers.image.version"] == __version__


def test_cuda_stages_have_tritons_build_tools(cuda_stages_image: str) -> None:
    code = (
        "import torch; from kubeddp.trainer.worker.compiled import missing_build_tools; "
        "print(missing_build_tools(torch.device('cuda')))"
    )
    assert _python(cuda_stages_image, code) == "None"


def test_the_torch_inside_is_the_labelled_substitute(cuda_stages_image: str) -> None:
    """Never mistaken for a CUDA build: the substitute says so."""
    assert _python(cuda_stages_image, "import torch; print(torch.__version__)").endswith("+cpu")


# What NCCL's IB transport opens (misc/ibvsymbols.cc: dlopen of libibverbs.so.1) and what
# libibverbs then loads for the adapters of InfiniBand/RoCE (mlx5) and EFA (efa) nodes.
RDMA_CHECK = """
import ctypes, glob
verbs = ctypes.CDLL("libibverbs.so.1")
ctypes.CDLL("librdmacm.so.1")
providers = sorted(glob.glob("/usr/lib/*/libibverbs/lib*-rdmav*.so"))
for path in providers:
    ctypes.CDLL(path)
verbs.ibv_get_device_list.restype = ctypes.c_void_p
count = ctypes.c_int(-1)
listed = verbs.ibv_get_device_list(ctypes.byref(count))
if listed:
    verbs.ibv_free_device_list(ctypes.c_void_p(listed))
print(count.value, " ".join(p.rsplit("/", 1)[1].split("-rdmav")[0] for p in providers))
"""


def test_cuda_stages_carry_rdma_core_for_nccls_ib_transport(cuda_stages_image: str) -> None:
    """libibverbs, librdmacm and the mlx5 and efa providers load; with no RDMA device in the
    container, libibverbs lists none (rather than failing)."""
    count, providers = _python(cuda_stages_image, RDMA_CHECK).split(" ", 1)
    assert count == "0"
    assert {"libmlx5", "libefa"} <= set(providers.split()), providers


def test_the_cpu_image_has_no_rdma_core(cpu_image: str) -> None:
    """The CPU image is unchanged: NCCL never runs there."""
    code = "import ctypes.util; print(ctypes.util.find_library('ibverbs'))"
    assert _python(cpu_image, code) == "None"
