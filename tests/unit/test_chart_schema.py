"""Bad chart values are refused by real Helm before anything reaches a cluster:
values.schema.json rejects a wrong type, an unknown key or a bad name, and every `fail` rule in
templates/_validate.tpl (values that contradict each other) fires with a message that names
the value (in backticks, which `kubeddp render` turns into its option) and the fix."""

from __future__ import annotations

import functools
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from kubeddp.tools.manifests.chart.values import BY_PATH
from kubeddp.tools.manifests.kinds import KINDS
from tests.helpers.chart import CHART, chart
from tests.helpers.chart_refusals import FAIL_RULES, SCHEMA_REJECTS

pytestmark = pytest.mark.timeout(120)


def render_error(values: dict[str, Any], release: str = "demo") -> str:
    with pytest.raises(helm.HelmError) as caught:
        chart().render(values, name=release, namespace="ml")
    return str(caught.value)


@pytest.mark.parametrize("case", SCHEMA_REJECTS)
def test_schema_rejects_bad_values(case: str) -> None:
    values, texts = SCHEMA_REJECTS[case]
    message = render_error(values)
    assert "values don't meet the specifications of the schema" in message
    for text in texts:
        assert text in message, f"{text!r} not in {message!r}"


@functools.cache
def fail_message(case: str) -> str:
    values, release, _ = FAIL_RULES[case]
    return render_error(values, release)


@pytest.mark.parametrize("case", FAIL_RULES)
def test_fail_rule_fires(case: str) -> None:
    pattern = FAIL_RULES[case][2]
    message = fail_message(case)
    assert re.search(pattern, message), f"{pattern!r} not in {message!r}"
    assert "values don't meet" not in message  # the template rule, not the schema


def template_fail_messages() -> list[str]:
    """The message of every `fail` in the templates, as written (printf verbs included)."""
    texts = [path.read_text() for path in (CHART / "templates").rglob("*") if path.is_file()]
    return [
        m.group(1)
        for text in texts
        for m in re.finditer(r'fail (?:\(printf )?"((?:[^"\\]|\\.)*)"', text)
    ]


def test_every_fail_rule_is_tested() -> None:
    produced = [fail_message(case) for case in FAIL_RULES]
    produced.append(dashboard_error_message())
    untested = []
    for template in template_fail_messages():
        literal = template.replace('\\"', '"')
        pattern = ".*?".join(re.escape(part) for part in re.split(r"%[sdvq]", literal))
        if not any(re.search(pattern, message) for message in produced):
            untested.append(template)
    assert len(template_fail_messages()) >= 10
    assert untested == []


def a_set_value(path: str) -> object:
    """A valid value that counts as "set" (0 does: backoffLimit 0 is a setting)."""
    schema = BY_PATH[path].schema
    if "enum" in schema:
        return next(option for option in schema["enum"] if option)
    kind = schema["type"][0] if isinstance(schema["type"], list) else schema["type"]
    one_of_each = {"boolean": True, "integer": schema.get("minimum", 0), "string": "x"}
    return one_of_each[kind] if kind != "array" else [{}]  # a list with one (empty) entry


@pytest.mark.parametrize(
    ("kind", "path"),
    [(kind.chart_kind, path) for kind in KINDS.values() for path in kind.unsupported],
)
def test_each_kind_refuses_each_value_it_cannot_take(kind: str, path: str) -> None:
    """The kinds' `unsupported` tables are rules too: every entry fires for its kind."""
    values: dict = {"kind": kind}
    *parents, key = path.split(".")
    node = values
    for part in parents:
        node = node.setdefault(part, {})
    node[key] = a_set_value(path)
    message = render_error(values)
    assert f"`{path}` (" in message and f"cannot be set for kind {kind}" in message


def test_valid_values_still_render() -> None:
    """The rules are not over-eager: the boundary cases pass."""
    ok = [
        {
            "kind": "PyTorchJob",
            "nodes": 4,
            "elastic": {"enabled": True, "minNodes": 4, "maxNodes": 4},
        },
        {"timeLimit": 1},
        {"timeLimit": "1h30m"},
        {"timeLimit": "90s"},
        {"timeLimit": "3600"},
        {"gpusPerNode": 2, "nprocPerNode": 2},
        {"kind": "TrainJob", "nprocPerNode": "auto"},
        {"kind": "IndexedJob", "restartPolicy": "OnFailure"},
        {"checkpoints": {"size": "1Gi", "storageClassName": "fast"}},
        {"checkpoints": {"storageClassName": "fast"}},  # the created claim's class, default size
        {"checkpoints": {"existingClaim": "ckpt"}},
        {"checkpoints": {"lostOnRetry": True}},
        {"kind": "PyTorchJob", "pytorchJob": {"masterReplica": True}, "nodes": 3},
        {"config": {"workload": {"name": "custom", "model": "m:f", "data": "d:f"}}},
        {"kind": "TrainJob", "backoffLimit": None, "elastic": {"enabled": False, "minNodes": 2}},
        {"monitoring": {"podMonitor": {"enabled": True, "labels": {"a": "b"}, "interval": "1m"}}},
        {
            "trainer": {"script": "/app/t.py", "args": ["--a", "b c"]},
            "config": {"metrics": {"port": 9500}, "checkpoint": {"preempt_grace_seconds": 5}},
        },
        {
            "kind": "TrainJob",
            "volumes": [
                {
                    "name": "a",
                    "mountPath": "/etc/ssl/certs/ca.pem",
                    "subPath": "ca.pem",
                    "configMap": {"name": "ca"},
                },
                {"name": "b", "mountPath": "/opt/models", "csi": {"driver": "x.csi.io"}},
                {
                    "name": "c",
                    "mountPath": "/scratch",
                    "ephemeral": {
                        "volumeClaimTemplate": {
                            "spec": {
                                "accessModes": ["ReadWriteOnce"],
                                "resources": {"requests": {"storage": "1Gi"}},
                            }
                        }
                    },
                },
            ],
        },
    ]
    for values in ok:
        assert chart().render(values, name="demo", namespace="ml")


def chart_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "kubeddp"
    shutil.copytree(CHART, copy)
    for stale in (copy / "dashboards").glob("*.json"):
        stale.unlink()
    return copy


def dashboard_error_message() -> str:
    with (
        tempfile.TemporaryDirectory() as tmp,
        helm.Chart.load(chart_copy(Path(tmp))) as bare,
        pytest.raises(helm.HelmError) as caught,
    ):
        bare.render({"monitoring": {"dashboard": {"enabled": True}}}, name="demo")
    return str(caught.value)


def test_dashboard_needs_a_json_file() -> None:
    assert "no dashboards/*.json" in dashboard_error_message()


def test_dashboard_configmap_carries_the_json_for_the_grafana_sidecar(tmp_path: Path) -> None:
    copy = chart_copy(tmp_path)
    dashboard = {"title": "kubeddp test", "panels": [{"type": "timeseries", "id": 1}]}
    (copy / "dashboards" / "kubeddp-test.json").write_text(json.dumps(dashboard, indent=2))
    values = {"monitoring": {"dashboard": {"enabled": True, "labels": {"team": "ml"}}}}
    with helm.Chart.load(copy) as chart_with_json:
        rendered = chart_with_json.render(values, name="demo", namespace="ml")
    (config_map,) = [
        doc
        for path, text in rendered.items()
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc and doc["metadata"]["name"] == "demo-kubeddp-dashboard"
    ]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["labels"]["team"] == "ml"
    assert json.loads(config_map["data"]["kubeddp-test.json"]) == dashboard
