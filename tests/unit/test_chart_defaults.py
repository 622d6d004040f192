"""The chart's generated files are current (`make chart`), and the defaults, names and rules they
carry are kubeddp's Python definitions: values.yaml and values.schema.json from
tools/manifests/chart/values.py, templates/_constants.tpl from the kinds and the shared names, the
schema's `config` from trainer/config.py, Kubernetes types from kubernetes-validate."""

from __future__ import annotations

import json
import math
import re
import shutil
import typing
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml

from kubeddp.tools.generate import chart_files as gen_chart
from kubeddp.tools.manifests import k8s_names as N
from kubeddp.tools.manifests.chart.values import VALUES
from kubeddp.tools.manifests.kinds import KINDS, MAX_JOB_NAME_LENGTH
from kubeddp.tools.manifests.patterns import DNS1035
from kubeddp.trainer import __version__, exit_codes
from kubeddp.trainer import constants as C
from kubeddp.trainer.config import ConfigError, config_fields, config_from_dict

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kubeddp"

pytestmark = pytest.mark.timeout(120)


def load_yaml(name: str) -> Any:
    return yaml.safe_load((CHART / name).read_text())


def chart_constants() -> dict[str, Any]:
    text = (CHART / "templates" / "_constants.tpl").read_text()
    body = re.search(r'define "kubeddp.constants" -}}\n(.*?){{- end }}', text, re.S)
    assert body, "_constants.tpl has no kubeddp.constants block"
    return yaml.safe_load(body.group(1))


def schema() -> dict:
    return json.loads((CHART / "values.schema.json").read_text())


def test_generated_files_are_current(capsys) -> None:
    code = gen_chart.main(["--root", str(REPO), "--check"])
    assert code == 0, f"stale generated files; run `make chart`:\n{capsys.readouterr().out}"


def test_check_fails_on_a_hand_edit(tmp_path: Path, capsys) -> None:
    shutil.copytree(CHART, tmp_path / "charts" / "kubeddp")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    values = tmp_path / "charts" / "kubeddp" / "values.yaml"
    values.write_text(values.read_text().replace("shmSize: 8Gi", "shmSize: 9Gi"))
    assert gen_chart.main(["--root", str(tmp_path), "--check"]) == 1
    assert "values.yaml" in capsys.readouterr().out


def test_app_version_is_the_kubeddp_version() -> None:
    meta = load_yaml("Chart.yaml")
    assert meta["apiVersion"] == "v2"
    assert meta["appVersion"] == __version__
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", meta["version"])
    values = load_yaml("values.yaml")
    assert values["image"] == {
        "repository": N.IMAGE_REPOSITORY,
        "tag": "",  # "" = appVersion: the default image is the kubeddp release
        "digest": "",
        "pullPolicy": None,  # null = IfNotPresent where the kind has the field (not TrainJob)
    }


def nested(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for path, value in pairs:
        *parents, key = path.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[key] = value
    return out


def test_values_yaml_holds_the_defaults() -> None:
    defaults = nested([(value.path, value.default) for value in VALUES])
    assert load_yaml("values.yaml") == defaults
    with helm.Chart.load(CHART) as chart:  # what Helm itself reads
        assert chart.values == defaults


def test_defaults_are_the_designed_ones() -> None:
    values = load_yaml("values.yaml")
    assert values["kind"] == "auto"  # the kind the cluster serves (templates/_kind.tpl)
    assert values["shmSize"] == "8Gi"
    # null: 120 s, or behind a keeper the save plus the send of a checkpoint (_keeper.tpl)
    assert values["terminationGracePeriodSeconds"] is None
    assert values["istio"]["optOut"] is True
    assert values["nodes"] is values["nprocPerNode"] is None
    assert values["gpusPerNode"] == 0
    assert values["elastic"]["maxRestarts"] == 3
    assert values["elastic"]["rdzvId"] == ""  # "" = the job name
    # Progress survives pod recreation by default: a claim is created (ReadWriteOnce: one pod
    # mounts it, or with several pods a keeper pod); an emptyDir only when asked for by name.
    assert values["checkpoints"] == {
        "existingClaim": "",
        "size": None,
        "storageClassName": "",
        "accessMode": None,
        "storage": None,
        "lostOnRetry": False,
    }
    # the keeper: a secret of the chart's making, a NetworkPolicy, the training pods' placement
    assert values["keeper"] == {
        "existingSecret": "",
        "networkPolicy": True,
        **dict.fromkeys(("nodeSelector", "tolerations", "affinity", "priorityClassName"), None),
        "resources": None,  # keeper_sizing's requests and limits
    }
    assert values["pytorchJob"] == {"masterReplica": False}  # Workers only: no init-pytorch
    assert values["trainJob"] == {
        "ownRuntime": True,  # a TrainingRuntime with a gang failure policy, named after the job
        "runtimeName": "torch-distributed",
        "runtimeKind": "ClusterTrainingRuntime",
    }
    for knob in ("restartPolicy", "backoffLimit", "ttlSecondsAfterFinished", "cleanPodPolicy"):
        assert values[knob] is None  # null = the documented default, and "not asked for"
    assert values["config"] == {}
    assert values["monitoring"]["podMonitor"]["enabled"] is False
    assert values["managedBy"] == "Helm"


def test_security_contexts_are_the_restricted_standard() -> None:
    values = load_yaml("values.yaml")
    pod, container = values["podSecurityContext"], values["securityContext"]
    assert pod["runAsNonRoot"] is container["runAsNonRoot"] is True
    assert pod["runAsUser"] == pod["runAsGroup"] == pod["fsGroup"] == N.IMAGE_UID
    assert container["runAsUser"] == container["runAsGroup"] == N.IMAGE_UID
    assert pod["seccompProfile"] == container["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["allowPrivilegeEscalation"] is False
    assert container["capabilities"] == {"drop": ["ALL"]}
    assert container["readOnlyRootFilesystem"] is True


def test_chart_constants_are_the_python_names() -> None:
    constants = chart_constants()
    assert constants == gen_chart.chart_constants()
    # the names the operators and the image fix (design.md)
    kinds = constants["kinds"]
    assert (kinds["PyTorchJob"]["container"], kinds["PyTorchJob"]["rendezvousPortName"]) == (
        "pytorch",
        "pytorchjob-port",
    )
    assert kinds["PyTorchJob"]["rendezvousPort"] == C.PYTORCHJOB_PORT == 23456
    assert kinds["TrainJob"]["container"] == "node"
    assert kinds["TrainJob"]["rendezvousPort"] == C.TRAINJOB_PORT == 29500
    assert kinds["TrainJob"]["declaresPorts"] is False  # runtimePatches cannot add ports
    assert kinds["IndexedJob"]["container"] == "trainer"
    assert kinds["IndexedJob"]["nnodesEnv"] == C.ENV_NNODES
    assert (constants["metricsPort"], constants["metricsPortName"]) == (C.METRICS_PORT, "metrics")
    assert constants["configFile"] == C.CONFIG_FILE == f"{N.CONFIG_DIR}/{N.CONFIG_KEY}"
    assert constants["checkpointDir"] == C.CHECKPOINT_DIR
    assert constants["entrypoint"] == ["tini", "--", "kubeddp", "launch"]
    assert constants["firstRetryableExitCode"] < exit_codes.PREEMPTED
    assert set(kinds) == {kind.chart_kind for kind in KINDS.values()}


def test_job_name_rule_is_the_schemas() -> None:
    constants = chart_constants()
    assert constants["jobNamePattern"] == DNS1035.regex
    assert constants["maxJobNameLength"] == MAX_JOB_NAME_LENGTH == 40
    full_name = schema()["properties"]["fullnameOverride"]
    assert full_name["maxLength"] == MAX_JOB_NAME_LENGTH
    assert re.fullmatch(full_name["pattern"], "demo-1") and not re.fullmatch(
        full_name["pattern"], "1demo"
    )


JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean"}


def test_schema_config_is_the_trainer_config() -> None:
    """values.config is checked like the trainer checks its config file at start-up."""
    config_schema = schema()["properties"]["config"]
    sections = config_schema["properties"]
    assert config_schema["additionalProperties"] is False
    assert sum(len(s["properties"]) for s in sections.values()) == len(config_fields())
    for path, typ, item in config_fields():
        section, key = path.split(".")
        assert sections[section]["additionalProperties"] is False
        node = sections[section]["properties"][key]
        meta = item.metadata
        free_form = typing.get_origin(typ) is dict  # workload.args: any mapping
        assert node["type"] == ("object" if free_form else JSON_TYPES[typ]), path
        assert node.get("enum") == (list(meta["choices"]) if "choices" in meta else None), path
        assert node.get("minimum") == meta.get("minimum"), path
        assert node.get("exclusiveMinimum") == meta.get("above"), path
        assert node.get("maximum") == meta.get("maximum"), path
        assert node["description"] == meta["doc"]


def boundary_cases() -> list[tuple[str, Any]]:
    """(key, value) just inside and just outside every numeric range of the trainer config."""
    cases = []
    for path, typ, item in config_fields():
        meta = item.metadata
        step = 1 if typ is int else 1e-6
        if "minimum" in meta:
            cases += [(path, meta["minimum"]), (path, meta["minimum"] - step)]
        if "above" in meta:
            cases += [(path, meta["above"]), (path, meta["above"] + step)]
        if "maximum" in meta:
            cases += [(path, meta["maximum"]), (path, meta["maximum"] + step)]
    return cases


@pytest.mark.parametrize(("path", "value"), boundary_cases())
def test_schema_and_trainer_agree_on_every_range(path: str, value: Any) -> None:
    section, key = path.split(".")
    data = {section: {key: value}}
    if path == "workload.n_head":  # n_embd must stay a multiple of n_head
        data[section]["n_embd"] = value if value >= 1 else 128
    if path == "workload.n_embd":
        data[section]["n_head"] = 1
    try:
        config_from_dict(json.loads(json.dumps(data)))
        trainer_accepts = True
    except ConfigError:
        trainer_accepts = False
    config_schema = jsonschema.Draft7Validator(schema()["properties"]["config"])
    assert config_schema.is_valid(data) == trainer_accepts, (path, value)


def test_every_float_must_be_finite() -> None:
    for path, typ, _ in config_fields():
        if typ is float:
            for bad in (math.nan, math.inf):
                section, key = path.split(".")
                with pytest.raises(ConfigError, match="finite"):
                    config_from_dict({section: {key: bad}})


def test_every_numeric_setting_has_a_range() -> None:
    for path, typ, item in config_fields():
        if typ in (int, float):
            assert {"minimum", "above"} & set(item.metadata), path
            assert "maximum" in item.metadata, path
        assert item.metadata["doc"], path


def open_maps(node: Any, path: str = "") -> list[str]:
    """Objects with `properties` that still accept unknown keys (if/then only add conditions,
    and so do the entries of an allOf after a strict Kubernetes $ref: names the API checks)."""
    found = []
    if isinstance(node, dict):
        if "properties" in node and node.get("additionalProperties") is not False:
            found.append(path or "/")
        for key, value in node.items():
            if key == "allOf" and value and "$ref" in value[0]:
                value = value[:1]
            if key not in ("if", "then"):
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


def test_kubernetes_types_come_from_kubernetes_validate() -> None:
    """Not hand copies: each definition is the package's, at the pinned Kubernetes version."""
    definitions = schema()["definitions"]
    source = gen_chart._kubernetes_definitions()
    for name in ("Toleration", "Affinity", "SecurityContext", "PodSecurityContext", "EnvVar"):
        assert f"io.k8s.api.core.v1.{name}" in definitions
    quantity = "io.k8s.apimachinery.pkg.api.resource.Quantity"
    for name, definition in definitions.items():
        if name != quantity:
            assert definition == gen_chart._strip(source[name]), name
    refs = {
        ref.rsplit("/", 1)[-1] for ref in re.findall(r'"\$ref": "([^"]+)"', json.dumps(schema()))
    }
    assert refs == set(definitions)  # nothing unused, nothing missing


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


def test_each_kind_has_its_template() -> None:
    """A kind's template names the kind it renders: the one place the chart spells a kind."""
    for kind in KINDS.values():
        template = CHART / "templates" / f"{kind.name}.yaml"
        first = template.read_text().splitlines()[0]
        assert first == f'{{{{- if eq (include "kubeddp.kind" .) "{kind.chart_kind}" }}}}', template
