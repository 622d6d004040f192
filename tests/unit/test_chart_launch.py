"""The jobs the chart renders start a consistent DDP world.

For every ci/ values file: the independent model of the operators (tests/emulation/
operator_env.py, written from the reference env matrix) says which pods the operator would
create and what env it injects; kubeddp's launcher (`plan_from_env`, what `kubeddp launch`
runs in each pod) must then agree on the node count, distinct node ranks, the world size and a
rendezvous endpoint that is a pod's DNS name and one of its container ports.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import helm_python as helm
import pytest
import yaml

from kubeddp.trainer.launcher.agent import WORKER_MODULE
from kubeddp.trainer.launcher.launch import launch_parser, parse_command_line
from kubeddp.trainer.launcher.program_options import torchrun_worker_args
from kubeddp.trainer.launcher.rendezvous import plan_from_env
from kubeddp.trainer.worker.program import RUNNER_MODULE, Program

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kubeddp"
CI_FILES = sorted((CHART / "ci").glob("*.yaml"))
SOURCES = {"PyTorchJob": "pytorchjob", "TrainJob": "trainjob", "IndexedJob": "indexedjob"}

pytestmark = pytest.mark.timeout(120)


@functools.cache
def operator_model() -> ModuleType:
    """Loaded by path: it must not depend on how pytest sets sys.path."""
    path = REPO / "tests" / "emulation" / "operator_env.py"
    spec = importlib.util.spec_from_file_location("kubeddp_test_operator_env", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def job_plan(values: dict):
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values, name="demo", namespace="ml", is_install=True)
    docs = [
        doc
        for path, text in rendered.items()
        if "/tests/" not in path and path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    return operator_model().plan_from_documents(docs)


def pod_env(pod, index: int) -> dict[str, str]:
    """The kubelet's view of the container env; Secret references cannot be resolved here."""
    literal = dict(pod.container)
    literal["env"] = [e for e in pod.container.get("env", []) if "secretKeyRef" not in str(e)]
    view = type(pod)(**{**pod.__dict__, "container": literal})
    env = operator_model().container_env(view, "ml", f"10.0.0.{index + 1}")
    env["KUBERNETES_SERVICE_HOST"] = "10.96.0.1"  # every pod has it
    return env


def launch_options(container: dict) -> tuple[argparse.Namespace, list[str]]:
    """The container's args as `kubeddp launch` parses them (the program ends its options)."""
    return parse_command_line(launch_parser(), container.get("args", []))


def worker_command(container: dict) -> tuple[str, list[str], list[str]]:
    """What launch gives torchrun for the container's args: the worker module, its
    arguments, and the arguments its command line must end with."""
    args, rest = launch_options(container)
    if args.script is None and args.module is None:
        return WORKER_MODULE, [], []  # the config reaches the workers in their environment
    mode = "script" if args.script is not None else "module"
    program = Program(mode, args.script or args.module, tuple(rest))
    return RUNNER_MODULE, torchrun_worker_args(program), program.runner_args()


@pytest.mark.parametrize("values_file", CI_FILES, ids=lambda p: p.stem)
def test_every_pod_agrees_on_the_world(values_file: Path) -> None:
    values = yaml.safe_load(values_file.read_text())
    plan = job_plan(values)
    gpus = int(values.get("gpusPerNode", 0))
    module, args, argv_end = worker_command(plan.pods[0].container)
    plans = [
        plan_from_env(
            pod_env(pod, index),
            worker_args=worker_command(pod.container)[1],
            gpu_count=lambda: gpus,
            worker_module=module,
        )
        for index, pod in enumerate(plan.pods)
    ]
    expected_source = SOURCES[plan.kind]
    if plan.elastic:
        expected_source = "pytorchjob-elastic"
    elif plan.kind == "PyTorchJob" and "Master" not in {p.replica_type for p in plan.pods}:
        expected_source = "pytorchjob-workers"  # the default shape: no Master, no init-pytorch
    assert {p.source for p in plans} == {expected_source}
    assert {p.nnodes for p in plans} == (
        {f"{values['elastic']['minNodes']}:{values['elastic']['maxNodes']}"}
        if plan.elastic
        else {str(len(plan.pods))}
    )
    nproc = {p.nproc_per_node for p in plans}
    assert len(nproc) == 1
    if not plan.elastic:
        assert sorted(p.node_rank for p in plans) == list(range(len(plan.pods)))
        assert {p.world_size for p in plans} == {len(plan.pods) * nproc.pop()}
    (endpoint,) = {p.rdzv_endpoint for p in plans}
    host, port = endpoint.rsplit(":", 1)
    first = plan.pods[0]
    assert host in first.dns_names, f"{host} is not a DNS name of {first.name}"
    ports = {p["containerPort"] for p in first.container.get("ports", [])}
    assert int(port) in ports | {29500}  # the Trainer adds 29500 itself
    for p in plans:
        assert p.argv[-len(argv_end) - 2 :] == ["--module", module, *argv_end]
    trainer = values.get("trainer", {})
    if trainer.get("script") or trainer.get("module"):  # launch's own options stay launch's
        args, rest = launch_options(first.container)
        assert rest == trainer.get("args", [])
        assert args.spawns_workers == trainer.get("spawnsWorkers")


def test_cpu_ci_values_start_two_workers_per_pod() -> None:
    """The kind CI job: 2 pods x KUBEDDP_CPU_NPROC=2 gloo workers = world size 4."""
    plan = job_plan(yaml.safe_load((CHART / "ci" / "cpu-kind-values.yaml").read_text()))
    plans = [plan_from_env(pod_env(pod, i)) for i, pod in enumerate(plan.pods)]
    assert [p.world_size for p in plans] == [4, 4]
    assert [p.nproc_per_node for p in plans] == [2, 2]
