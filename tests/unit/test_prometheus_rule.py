"""The chart's PrometheusRule (monitoring.prometheusRule.enabled): each alert fires on the
series kubeddp exports when it should and stays quiet when it should not, checked by
Prometheus' own rule engine (`promtool test rules`, Debian's `prometheus` package); the GPU
alerts over NVIDIA dcgm-exporter's series as it serves them (tests/helpers/dcgm.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import dcgm
from tests.helpers.chart import chart
from tests.helpers.metrics import documented_tables, metric_rows

pytestmark = pytest.mark.timeout(120)
PROMTOOL = shutil.which("promtool")
NS, POD0, POD1 = "team", "demo-kubeddp-worker-0", "demo-kubeddp-worker-1"


def _rule() -> dict:
    values = {"monitoring": {"prometheusRule": {"enabled": True, "noProgressSeconds": 300}}}
    rendered = chart().render(values, name="demo", namespace=NS)
    return yaml.safe_load(rendered["kubeddp/templates/prometheusrule.yaml"])


def _s(name: str, pod: str, values: str, **labels: str) -> dict:
    shown = ",".join(f'{k}="{v}"' for k, v in {"namespace": NS, "pod": pod, **labels}.items())
    return {"series": f"{name}{{{shown}}}", "values": values}


def _alert(pod: str, severity: str, value: str = "", **labels: str) -> dict:
    """An expected alert; `value`: its summary's value as Prometheus writes it."""
    return {
        "exp_labels": {"namespace": NS, "pod": pod, "severity": severity, **labels},
        "value": value,
    }


SERIES = [
    # rank 0 progresses every minute; rank 1 stops at minute 4; rank 2 finished at minute 4
    # (its series ends: a rank's progress is served only while it trains)
    _s("kubeddp_rank_last_progress_timestamp_seconds", POD0, "0+60x40", rank="0"),
    _s("kubeddp_rank_last_progress_timestamp_seconds", POD1, "0+60x4 240x36", rank="1"),
    _s("kubeddp_rank_last_progress_timestamp_seconds", POD1, "0+60x4 stale", rank="2"),
    _s("kubeddp_stalls_total", POD0, "0x40"),
    _s("kubeddp_stalls_total", POD1, "0x6 1x34"),
    # rank 1 is a straggler from minute 10 on (no series before: no verdict)
    _s("kubeddp_straggler_ratio", POD1, "_x11 2.1x30", rank="1"),
    # rank 0 has a NaN at step 37 from minute 20 on (no series before)
    _s("kubeddp_nonfinite_step", POD0, "_x21 37x20", rank="0"),
]
PAIR = {"pod_a": POD0, "node_a": "gpu-b", "pod_b": POD1, "node_b": "gpu-c"}
NETWORK_SERIES = [
    # the check at minute 0 found no slow link; the one after a restart at minute 25 did
    _s("kubeddp_network_slow_link_ratio", POD0, "_x26 6.8x15", **PAIR),
]
RESTART_SERIES = [
    # pod 0 restarts at minutes 35 and 50 and never gets past step 100; pod 1 progresses
    _s("kubeddp_worker_restarts_total", POD0, "0x35 1x15 2x20"),
    _s("kubeddp_step", POD0, "0+3x33 100x37"),
    _s("kubeddp_worker_restarts_total", POD1, "0x35 1x35"),
    _s("kubeddp_step", POD1, "0+3x70"),
]
# GPU health: dcgm-exporter's series as it serves them, with the incidents of
# tests/helpers/dcgm.py (incident_series says what happens to which rank's GPU, and when)
RANK = dcgm.RANK_LABELS
GPU_SERIES = dcgm.incident_series()


def _gpu_alert(rank: str, severity: str, value: str = "", **labels: str) -> dict:
    found = {"namespace": NS, "rank": rank, "severity": severity, **RANK[rank], **labels}
    return {"exp_labels": found, "value": value}


CASES = [
    ("KubeddpRankStalled", "3m", []),
    ("KubeddpRankStalled", "12m", [_alert(POD1, "critical", "8m 0s", rank="1")]),
    ("KubeddpStallReported", "5m", []),
    ("KubeddpStallReported", "8m", [_alert(POD1, "critical")]),
    ("KubeddpStraggler", "12m", []),  # not yet for 5 minutes
    ("KubeddpStraggler", "17m", [_alert(POD1, "warning", "2.1", rank="1")]),
    ("KubeddpNonFiniteLoss", "15m", []),
    ("KubeddpNonFiniteLoss", "21m", [_alert(POD0, "critical", "37", rank="0")]),
    ("KubeddpSlowNetworkLink", "20m", []),
    (
        "KubeddpSlowNetworkLink",
        "26m",
        [{"exp_labels": {"namespace": NS, "severity": "warning", **PAIR}, "value": "6.8"}],
    ),
    ("KubeddpRestartsWithoutProgress", "30m", []),
    ("KubeddpRestartsWithoutProgress", "65m", [_alert(POD0, "warning")]),
    ("KubeddpGpuXid", "15m", []),  # another job's GPU: not this job's alert
    (
        "KubeddpGpuXid",
        "21m",
        [_gpu_alert("3", "critical", "79", err_code="79", err_msg="GPU has fallen off the bus")],
    ),  # fmt: skip
    ("KubeddpGpuUncorrectableMemoryError", "25m", []),
    ("KubeddpGpuUncorrectableMemoryError", "31m", [_gpu_alert("1", "critical")]),
    ("KubeddpGpuUncorrectableMemoryError", "50m", []),  # none in the last 15 minutes
    ("KubeddpGpuThrottled", "12m", []),  # a power cap alone does not slow a GPU down
    ("KubeddpGpuThrottled", "43m", []),  # not yet for 5 minutes
    ("KubeddpGpuThrottled", "46m", [_gpu_alert("2", "warning", "72")]),
]


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) missing")
def test_each_alert_fires_on_the_series_kubeddp_exports(tmp_path: Path) -> None:
    rule = _rule()
    assert rule["kind"] == "PrometheusRule"
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    check = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = []
    for name, at, expected in CASES:
        for alert in expected:
            value = alert.pop("value")
            alert["exp_annotations"] = _annotations(rule, name, alert["exp_labels"], value)
        tests.append({"eval_time": at, "alertname": name, "exp_alerts": expected})
    spec = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m",
                   "input_series": SERIES + NETWORK_SERIES + RESTART_SERIES + GPU_SERIES,
                   "alert_rule_test": tests}],
    }  # fmt: skip
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(spec))
    done = subprocess.run(
        [PROMTOOL, "test", "rules", str(test_file)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _annotations(rule: dict, name: str, labels: dict, value: str) -> dict:
    """The rule's annotations with the labels and the value filled in, as Prometheus does."""
    (found,) = [r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == name]
    out = {}
    for key, text in found["annotations"].items():
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
        out[key] = re.sub(r"\{\{ \$value[^}]*\}\}", value, text)
    return out


def test_the_rules_use_only_series_kubeddp_exports() -> None:
    exported = set(documented_tables()[0]) | set(documented_tables()[2])
    exported |= set(metric_rows("Network check"))
    text = yaml.safe_dump(_rule()["spec"])
    used = set(re.findall(r"\b(kubeddp_[a-z_]+)\b", text))
    assert used and used <= exported, used - exported
    gpu = set(re.findall(r"\b(DCGM_[A-Z0-9_]+)\b", text))  # what dcgm-exporter serves
    assert gpu and gpu <= dcgm.names() | dcgm.ALIASES, gpu - dcgm.names()
