"""A GPU pod requests cpu and memory by default (requestsPerGpu x its GPUs), so it is not
BestEffort (the first pod the kubelet evicts when its node runs short); what `resources` names
as a request or a limit stays as given (a limit alone is the request too), 0 or null asks for
none, and a CPU pod keeps what it had. Rendered by the library and by each helm binary alike."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from kubeddp.tools.manifests.chart.render import RenderError
from tests.helpers import helm_cli
from tests.helpers.chart import CHART
from tests.helpers.helm_cli import RELEASES, Release
from tests.helpers.render import job_of, render_job

pytestmark = pytest.mark.timeout(120)


def container_resources(*argv: str) -> dict:
    job = job_of("pytorchjob", "--name", "g", *argv)
    (container,) = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    return container.get("resources", {})


def qos_class(resources: dict) -> str:
    """The pod's QoS class for one container (the kubelet's rules for cpu and memory)."""
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    named = {name for name in ("cpu", "memory") if name in requests or name in limits}
    if not named:
        return "BestEffort"
    guaranteed = all(
        name in limits and requests.get(name, limits[name]) == limits[name]
        for name in ("cpu", "memory")
    )
    return "Guaranteed" if guaranteed else "Burstable"


def test_a_gpu_pod_requests_cpu_and_memory_per_gpu() -> None:
    resources = container_resources("--gpus-per-node", "8")
    assert resources["requests"] == {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "8"}
    assert resources["limits"] == {"nvidia.com/gpu": "8"}
    assert qos_class(resources) == "Burstable"
    assert qos_class({"requests": {"nvidia.com/gpu": "8"}}) == "BestEffort"  # what it was


def test_a_cpu_pod_keeps_what_it_had() -> None:
    assert container_resources() == {}
    assert container_resources("--cpu", "2")["requests"] == {"cpu": "2"}


def test_what_resources_names_is_kept_and_only_the_rest_is_added() -> None:
    """A memory limit alone is the memory request too: a default request above it would be
    refused by the API server (request > limit), so nothing is added for memory."""
    resources = container_resources("--gpus-per-node", "4", "--cpu", "3", "--memory-limit", "40Gi")
    assert resources["requests"] == {"cpu": "3", "nvidia.com/gpu": "4"}
    assert resources["limits"] == {"memory": "40Gi", "nvidia.com/gpu": "4"}


def test_per_gpu_amounts_are_options_and_zero_is_none() -> None:
    resources = container_resources(
        "--gpus-per-node", "2", "--cpu-per-gpu", "0", "--memory-per-gpu", "1500Mi"
    )
    assert resources["requests"] == {"memory": "3000Mi", "nvidia.com/gpu": "2"}
    cpu = container_resources("--gpus-per-node", "3", "--cpu-per-gpu", "500m")
    assert cpu["requests"]["cpu"] == "1500m"


def test_a_trainjob_gets_them_in_resources_per_node() -> None:
    (job,) = [d for d in render_job("trainjob", "--name", "t", "--gpus-per-node", "2")
              if d["kind"] == "TrainJob"]  # fmt: skip
    assert job["spec"]["trainer"]["resourcesPerNode"]["requests"] == {
        "cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "2"
    }  # fmt: skip


def test_a_fraction_is_refused_with_one_line() -> None:
    with pytest.raises(RenderError) as refused:
        render_job("pytorchjob", "--gpus-per-node", "2", "--cpu-per-gpu", "1.5")
    assert str(refused.value) == (
        "--cpu-per-gpu: '1.5' is not a Kubernetes quantity without a decimal point "
        "(e.g. 2, 500m, 8Gi)"
    )


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: f"helm-{r.helm_version}")
def test_each_helm_binary_computes_the_same_requests(release: Release, tmp_path) -> None:
    binary = helm_cli.require(release, "helm")
    values = {"kind": "PyTorchJob", "gpusPerNode": 3, "requestsPerGpu": {"cpu": "500m"},
              "resources": {}}  # fmt: skip
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    done = subprocess.run(
        [str(binary), "template", "r", str(CHART), "-f", str(tmp_path / "values.yaml")],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (job,) = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "PyTorchJob"]
    (container,) = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"] == {
        "cpu": "1500m", "memory": "24Gi", "nvidia.com/gpu": "3"
    }  # fmt: skip
