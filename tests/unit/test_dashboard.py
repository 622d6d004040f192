"""The Grafana dashboard: valid JSON, a data-source variable, a fixed uid, the panels users need,
and PromQL that names only metrics the trainer really exports or NVIDIA's dcgm-exporter really
serves (and parses, with promtool); the GPU panels evaluated by Prometheus' engine (`promtool
test rules`) over the exporter's series, each naming the right rank and node."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import dcgm
from tests.helpers.metrics import exported_families

DASHBOARD = (
    Path(__file__).resolve().parents[2] / "charts" / "kubeddp" / "dashboards" / "kubeddp.json"
)
PROMQL_FUNCTIONS = {
    "rate", "increase", "sum", "avg", "max", "min", "count", "histogram_quantile", "time",
    "label_values", "irate", "clamp_min", "topk", "bottomk", "abs", "delta", "deriv",
    "max_over_time", "min_over_time", "avg_over_time", "vector", "scalar", "changes", "resets",
    "floor", "clamp_max",
}  # fmt: skip
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                   "unless", "bool", "offset"}  # fmt: skip
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict]:
    return dashboard()["panels"]


def exprs() -> list[str]:
    return [t["expr"] for p in panels() for t in p.get("targets", [])]


def exported_sample_names(tmp_path: Path) -> set[str]:
    return {s.name for f in exported_families(tmp_path) for s in f.samples}


def names_in(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, function names) in a PromQL expression; a `{__name__=~"a|b"}` selector
    names each of its alternatives."""
    metrics = {name for found in re.findall(r'__name__=~"([^"]*)"', expr)
               for name in _alternatives(found)}  # fmt: skip
    text = re.sub(r'"[^"]*"', '""', expr)  # strings (label values, variables)
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    grouping = r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
    text = re.sub(grouping, "", text)  # grouping labels
    functions = set()
    for match in re.finditer(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        word, call = match.group(1), match.group(2)
        if call:
            functions.add(word)
        elif word not in PROMQL_KEYWORDS:
            metrics.add(word)
    return metrics, functions


def _alternatives(pattern: str) -> set[str]:
    """The names a `__name__` regex of the dashboard matches: `A|B` or `P_(X|Y)_S`."""
    group = re.fullmatch(r"(\w*)\(([\w|]+)\)(\w*)", pattern)
    if group:
        return {group[1] + middle + group[3] for middle in group[2].split("|")}
    return set(pattern.split("|"))


def test_dashboard_has_a_fixed_uid_and_a_datasource_variable() -> None:
    board = dashboard()
    assert board["uid"] == "kubeddp-training"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(
    ("title_word", "needs"),
    [
        ("samples", "kubeddp_samples_total"),
        ("tokens", "kubeddp_tokens_total"),
        ("loss", "kubeddp_loss"),
        ("step time", "kubeddp_step_duration_seconds_bucket"),
        ("data wait", "kubeddp_data_wait_seconds_total"),
        ("checkpoint age", "kubeddp_last_checkpoint_timestamp_seconds"),
        ("restarts", "kubeddp_worker_restarts_total"),
        ("gpu memory", "kubeddp_gpu_memory_allocated_bytes"),
    ],
)
def test_required_panel_exists(title_word: str, needs: str) -> None:
    matching = [p for p in panels() if title_word in p["title"].lower()]
    assert matching, f"no panel titled with {title_word!r}"
    assert any(needs in t["expr"] for p in matching for t in p["targets"]), (title_word, needs)


def test_step_time_panel_shows_p50_and_p99_per_pod() -> None:
    """Per pod: the histogram has a rank label only with metrics.per_rank (docs/metrics.md)."""
    panel = next(p for p in panels() if "step time" in p["title"].lower())
    quantiles = {
        re.search(r"histogram_quantile\((0\.\d+)", t["expr"]).group(1) for t in panel["targets"]
    }
    assert quantiles == {"0.5", "0.99"}
    assert all("by (pod, le)" in t["expr"] for t in panel["targets"])


def test_every_expression_names_only_exported_metrics(tmp_path: Path) -> None:
    exported = exported_sample_names(tmp_path) | dcgm.names() | dcgm.ALIASES
    for expr in exprs():
        metrics, functions = names_in(expr)
        assert metrics, f"no metric in {expr!r}"
        assert metrics <= exported, f"{expr!r} names {metrics - exported}, not exported"
        assert functions <= PROMQL_FUNCTIONS, f"{expr!r} calls {functions - PROMQL_FUNCTIONS}"
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            selector = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["definition"])
            assert selector, variable["definition"]
            metrics, _ = names_in(selector.group(1))
            assert metrics <= exported, variable["name"]


def test_the_name_extractor_catches_a_foreign_metric() -> None:
    metrics, functions = names_in('sum by (rank, le) (rate(node_cpu_seconds_total{job="x"}[5m]))')
    assert metrics == {"node_cpu_seconds_total"} and functions == {"sum", "rate"}
    metrics, _ = names_in('increase({__name__=~"X_(A|B)_TOTAL"}[1m]) * on (U) group_left (r) y')
    assert metrics == {"X_A_TOTAL", "X_B_TOTAL", "y"}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs Debian's prometheus package")
def test_expressions_parse_with_promtool(tmp_path: Path) -> None:
    rules = []
    for i, expr in enumerate(exprs()):
        for var, value in GRAFANA_VARS.items():
            expr = expr.replace(var, value)
        expr = expr.replace("$job", ".*").replace("$pod", ".*")
        rules.append({"record": f"kubeddp:dashboard_expr_{i}", "expr": expr})
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _gpu_panel(title: str) -> dict[str, str]:
    """refId -> expression of a GPU panel, with Grafana's variables as a user's pick sets them."""
    (panel,) = [p for p in panels() if p["title"] == title]
    out = {}
    for target in panel["targets"]:
        expr = target["expr"].replace("$job", dcgm.KUBEDDP_JOB).replace("$pod", ".*")
        out[target["refId"]] = expr.replace("$__rate_interval", "5m")
    return out


def _ranks(*flagged: str, every: bool = False) -> list[dict]:
    """Expected samples of a per-rank panel, as `(expr) > bool 0`: 1 for each flagged rank and,
    with `every`, 0 for the others (a rank whose GPU series exist but show nothing)."""
    ranks = dcgm.RANK_LABELS if every else {r: dcgm.RANK_LABELS[r] for r in flagged}
    out = []
    for rank, labels in ranks.items():
        shown = ",".join(f'{k}="{v}"' for k, v in {"rank": rank, **labels}.items() if k != "UUID")
        out.append({"labels": f"{{{shown}}}", "value": 1 if rank in flagged else 0})
    return out


XID_79 = {**dcgm.RANK_LABELS["3"], "rank": "3", "err_code": "79",
          "err_msg": "GPU has fallen off the bus"}  # fmt: skip
GPU_PANELS = [
    # (panel, refId, minute, expected samples); the incidents: tests/helpers/dcgm.py
    ("GPU XID errors per rank", "A", 15, []),  # another job's GPU is not shown
    ("GPU XID errors per rank", "A", 25,
     [{"labels": "{" + ",".join(f'{k}="{v}"' for k, v in XID_79.items()) + "}", "value": 1}]),
    ("GPU throttling per rank", "D", 10, _ranks("2")),  # power cap
    ("GPU throttling per rank", "A", 10, []),
    ("GPU throttling per rank", "A", 45, _ranks("2")),  # HW slowdown
    ("GPU throttling per rank", "B", 45, _ranks("2")),  # thermal
    ("GPU throttling per rank", "C", 45, []),  # HW power brake
    ("GPU SM activity per rank", "A", 5, _ranks("0", "1", "2", "3")),
    ("GPU ECC errors per rank", "A", 32, _ranks("1", every=True)),  # uncorrectable
    ("GPU ECC errors per rank", "B", 32, _ranks("0", every=True)),  # corrected
    ("GPU ECC errors per rank", "C", 32, _ranks(every=True)),  # rows remapped: none
    ("GPU NVLink errors per rank", "A", 52, _ranks(every=True)),  # CRC flit: none
    ("GPU NVLink errors per rank", "B", 52, _ranks("0", every=True)),  # CRC data
    ("GPU NVLink errors per rank", "C", 52, _ranks(every=True)),  # replay
    ("GPU NVLink errors per rank", "D", 52, _ranks(every=True)),  # recovery
]  # fmt: skip


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs Debian's prometheus package")
def test_the_gpu_panels_name_each_ranks_gpu(tmp_path: Path) -> None:
    """Prometheus' engine evaluates each GPU panel over dcgm-exporter's series (as a
    ServiceMonitor stores them) and kubeddp_rank_info: the rank and node of the GPU that had
    the incident, and no other job's GPU."""
    cases = [
        {"expr": f"({_gpu_panel(title)[ref]}) > bool 0", "eval_time": f"{minute}m",
         "exp_samples": expected}
        for title, ref, minute, expected in GPU_PANELS
    ]  # fmt: skip
    covered = {(title, ref) for title, ref, _, _ in GPU_PANELS}
    every = {(p["title"], t["refId"]) for p in panels() for t in p["targets"]
             if "DCGM_" in t["expr"]}  # fmt: skip
    assert every == covered, every - covered
    rules = tmp_path / "none.yml"
    rules.write_text("groups: []\n")
    spec = {"rule_files": [str(rules)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": dcgm.incident_series(),
                       "promql_expr_test": cases}]}  # fmt: skip
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump(spec))
    done = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
