"""The chart and `kubeddp render` share one source of truth, trainer/constants.py (plus the
renderer's defaults in tools/jobspec.py and tools/manifests.py): values.yaml, the chart's
constants (templates/_constants.tpl), the schema's trainer-config part and the version must
agree with them."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml

from kubeddp.tools import jobspec, manifests
from kubeddp.trainer import __version__
from kubeddp.trainer import constants as C
from kubeddp.trainer.config import CHOICES, Config

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kubeddp"


def load_yaml(name: str) -> Any:
    return yaml.safe_load((CHART / name).read_text())


def chart_constants() -> dict[str, Any]:
    text = (CHART / "templates" / "_constants.tpl").read_text()
    body = re.search(r'define "kubeddp.constants" -}}\n(.*?)\n{{- end }}', text, re.S)
    assert body, "_constants.tpl has no kubeddp.constants block"
    return yaml.safe_load(body.group(1))


def schema() -> dict:
    return yaml.safe_load((CHART / "values.schema.json").read_text())


def test_app_version_is_the_kubeddp_version() -> None:
    meta = load_yaml("Chart.yaml")
    assert meta["apiVersion"] == "v2"
    assert meta["appVersion"] == __version__
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", meta["version"])
    # image tag "" means appVersion: the default image is the renderer's default image
    values = load_yaml("values.yaml")
    assert values["image"]["tag"] == ""
    assert f"{values['image']['repository']}:{meta['appVersion']}" == jobspec.DEFAULT_IMAGE


def test_values_defaults_agree_with_constants_and_renderer() -> None:
    values = load_yaml("values.yaml")
    spec = jobspec.JobSpec()
    assert values["image"]["repository"] == C.IMAGE_REPOSITORY
    assert values["image"]["pullPolicy"] == spec.image_pull_policy
    assert values["shmSize"] == C.SHM_SIZE_DEFAULT == spec.shm_size
    assert values["terminationGracePeriodSeconds"] == C.TERMINATION_GRACE_PERIOD_SECONDS
    assert values["podSecurityContext"] == C.POD_SECURITY_CONTEXT
    assert values["securityContext"] == manifests.container_security_context()
    assert values["securityContext"] == {
        **C.CONTAINER_SECURITY_CONTEXT,
        "readOnlyRootFilesystem": True,
    }
    assert values["podSecurityContext"]["runAsUser"] == C.IMAGE_UID
    assert values["istio"]["optOut"] is spec.istio_opt_out is True
    assert values["nodes"] is spec.nodes is None
    assert values["nprocPerNode"] is spec.nproc_per_node is None
    assert values["gpusPerNode"] == spec.gpus_per_node
    assert values["resources"] == {} and spec.cpu is spec.memory is None
    assert values["elastic"]["maxRestarts"] == spec.max_restarts == jobspec.DEFAULT_MAX_RESTARTS
    assert values["elastic"]["rdzvId"] == ""  # "" = the job name, as the renderer sets it
    assert values["checkpoints"]["accessMode"] == spec.checkpoint_access_mode
    assert values["trainJob"]["runtimeName"] == jobspec.TRAINJOB_RUNTIME
    for knob in ("restartPolicy", "backoffLimit", "ttlSecondsAfterFinished", "cleanPodPolicy"):
        assert values[knob] is None  # null = the renderer's default, and "not asked for"
    assert values["config"] == {} == spec.trainer_config
    assert values["monitoring"]["podMonitor"]["enabled"] is spec.podmonitor is False


def test_chart_constants_agree_with_trainer_constants() -> None:
    expected = {
        "pytorchjobPort": C.PYTORCHJOB_PORT,
        "pytorchjobPortName": C.PYTORCHJOB_PORT_NAME,
        "indexedjobPort": C.INDEXEDJOB_PORT,
        "indexedjobPortName": manifests.INDEXEDJOB_PORT_NAME,
        "metricsPort": C.METRICS_PORT,
        "metricsPortName": C.METRICS_PORT_NAME,
        "pytorchjobContainer": C.PYTORCHJOB_CONTAINER,
        "trainjobContainer": C.TRAINJOB_CONTAINER,
        "indexedjobContainer": C.INDEXEDJOB_CONTAINER,
        "checkpointDir": C.CHECKPOINT_DIR,
        "configDir": C.CONFIG_DIR,
        "configFile": C.CONFIG_FILE,
        "configKey": manifests.CONFIG_KEY,
        "scratchDir": C.SCRATCH_DIR,
        "gpuResource": manifests.GPU_RESOURCE,
        "istioInjectAnnotation": C.ISTIO_INJECT_ANNOTATION,
        "kueueQueueLabel": manifests.KUEUE_QUEUE_LABEL,
        "pytorchjobJobNameLabel": C.PYTORCHJOB_JOB_NAME_LABEL,
        "pytorchjobReplicaTypeLabel": C.PYTORCHJOB_REPLICA_TYPE_LABEL,
        "pytorchjobReplicaIndexLabel": C.PYTORCHJOB_REPLICA_INDEX_LABEL,
        "trainjobNameLabel": C.TRAINJOB_NAME_LABEL,
        "indexedjobNameLabel": C.INDEXEDJOB_NAME_LABEL,
        "indexedjobIndexLabel": C.INDEXEDJOB_INDEX_LABEL,
        "masterAddrEnv": C.ENV_INDEXEDJOB_MASTER_ADDR,
        "trainjobPort": C.TRAINJOB_PORT,
        "entrypoint": list(C.IMAGE_ENTRYPOINT),
        "masterPortEnv": C.ENV_INDEXEDJOB_MASTER_PORT,
        "nnodesEnv": C.ENV_INDEXEDJOB_NNODES,
        "nprocEnv": C.ENV_INDEXEDJOB_NPROC,
        "trainjobReplicatedJob": manifests.TRAINJOB_REPLICATED_JOB,
        "runtimePatchManager": manifests.RUNTIME_PATCH_MANAGER,
        "defaultRestartPolicy": jobspec.DEFAULT_RESTART_POLICY,
        "defaultBackoffLimit": jobspec.DEFAULT_BACKOFF_LIMIT,
        "defaultCleanPodPolicy": jobspec.DEFAULT_CLEAN_POD_POLICY,
    }
    assert chart_constants() == expected


def test_job_name_rule_matches_the_renderer() -> None:
    rules = (CHART / "templates" / "_validate.tpl").read_text()
    assert f'regexMatch "{jobspec.DNS1035.pattern}"' in rules
    assert f"(gt (len $job) {jobspec.MAX_NAME_LENGTH})" in rules
    full_name = schema()["properties"]["fullnameOverride"]
    assert full_name["maxLength"] == jobspec.MAX_NAME_LENGTH
    assert re.fullmatch(full_name["pattern"], "demo-1") and not re.fullmatch(
        full_name["pattern"], "1demo"
    )


JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean"}
POSITIVE_CONFIG_KEYS = {
    "train.batch_size",
    "train.grad_accum_steps",
    "train.epochs",
    "train.log_every",
    "checkpoint.keep",
    "workload.seq_len",
}


def test_schema_config_matches_the_trainer_config() -> None:
    """values.config is checked like the trainer checks its config file at start-up."""
    config_schema = schema()["properties"]["config"]
    hints = typing.get_type_hints(Config)
    assert set(config_schema["properties"]) == {f.name for f in dataclasses.fields(Config)}
    for section in dataclasses.fields(Config):
        section_schema = config_schema["properties"][section.name]
        section_type = hints[section.name]
        assert section_schema["additionalProperties"] is False
        fields = typing.get_type_hints(section_type)
        assert set(section_schema["properties"]) == set(fields), section.name
        for key, typ in fields.items():
            node = section_schema["properties"][key]
            path = f"{section.name}.{key}"
            assert node["type"] == JSON_TYPES[typ], path
            assert node.get("enum") == (list(CHOICES[path]) if path in CHOICES else None), path
            assert node.get("minimum") == (1 if path in POSITIVE_CONFIG_KEYS else None), path


def open_maps(node: Any, path: str = "") -> list[str]:
    """Objects with `properties` that still accept unknown keys."""
    found = []
    if isinstance(node, dict):
        if "properties" in node and node.get("additionalProperties") is not False:
            found.append(path or "/")
        for key, value in node.items():
            found += open_maps(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += open_maps(value, f"{path}/{index}")
    return found


def test_schema_is_strict_draft07() -> None:
    values_schema = schema()
    assert values_schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(values_schema)
    assert open_maps(values_schema) == []
    jsonschema.Draft7Validator(values_schema).validate(load_yaml("values.yaml"))
    with helm.Chart.load(CHART) as chart:  # a ci file overrides the defaults, as `helm -f`
        for ci_file in sorted((CHART / "ci").glob("*.yaml")):
            merged = chart.merge_values(yaml.safe_load(ci_file.read_text()))
            jsonschema.Draft7Validator(values_schema).validate(merged)


def leaf_paths(values: dict, prefix: str = "") -> list[str]:
    paths = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if (
            isinstance(value, dict)
            and value
            and key not in ("podSecurityContext", "securityContext", "resources")
        ):
            paths += leaf_paths(value, f"{path}.")
        else:
            paths.append(path)
    return paths


@pytest.mark.parametrize("document", ["charts/kubeddp/README.md"])
def test_every_value_is_documented(document: str) -> None:
    text = (REPO / document).read_text()
    missing = [path for path in leaf_paths(load_yaml("values.yaml")) if f"`{path}`" not in text]
    assert missing == []


def test_values_files_pass_yamllint() -> None:
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    config = YamlLintConfig(
        "{extends: default, rules: {line-length: {max: 100}, document-start: disable}}"
    )
    files = [CHART / "Chart.yaml", CHART / "values.yaml", *sorted((CHART / "ci").glob("*.yaml"))]
    problems = [
        f"{path.relative_to(REPO)}:{problem.line}: {problem.message}"
        for path in files
        for problem in linter.run(path.read_text(), config)
    ]
    assert problems == []
