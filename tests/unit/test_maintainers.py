"""docs/maintainers.md: every file its recipes name exists, and each recipe's check catches the
step a maintainer forgets (a kind's table entry, a metric's docs row, a workload's docs row)."""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch

from kubeddp.tools.chart.values import BY_PATH, FLAGS, VALUES
from kubeddp.tools.kinds import KINDS, Lands, Refused
from kubeddp.tools.kinds.trainjob import JOB as TRAINJOB
from kubeddp.tools.kinds.trainjob import pod_field_takes
from kubeddp.tools.kinds.values import POD_FIELDS
from kubeddp.trainer.config import WorkloadConfig, workload_names
from kubeddp.trainer.workloads import build_workload
from tests.unit.test_kind_values import SAMPLES, untabled
from tests.unit.test_metrics_readme import documented_tables, exported
from tests.unit.test_render_options import derived_case
from tests.unit.test_value_help import restriction_in

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "docs" / "maintainers.md"
WORKLOADS_PAGE = REPO / "docs" / "workloads.md"
EXAMPLES = "kubeddp.trainer.workloads.examples"
pytestmark = pytest.mark.timeout(120)


def named_files() -> list[str]:
    """The repository paths the recipes name in backticks."""
    text = RECIPES.read_text()
    return sorted(set(re.findall(r"`((?:tools|trainer|charts|tests|docs)/[\w./-]+)`", text)))


def test_every_file_a_recipe_names_exists() -> None:
    paths = named_files()
    assert len(paths) >= 10
    missing = [p for p in paths if not (REPO / p.replace("NAME.py", "")).exists()]
    assert missing == []


def test_a_value_a_kind_forgets_is_caught() -> None:
    kind = KINDS["trainjob"]
    forgot = {path: how for path, how in kind.takes.items() if path != "tolerations"}
    assert untabled(dataclasses.replace(kind, takes=forgot)) == ["tolerations"]


def recipe_files(title: str) -> list[str]:
    """The files a recipe's "Files" list names, each bullet's first."""
    section = RECIPES.read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^- `([^`]+)`", section, re.M)


def _assigned(node: ast.stmt) -> set[str]:
    """The names a module-level statement assigns."""
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return {target.id for target in targets if isinstance(target, ast.Name)}


def defined_in(name: str, value: object) -> str:
    """The repository file whose module assigns `value` to `name` (not one that imports it)."""
    found = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path or getattr(module, name, None) is not value:
            continue
        if any(name in _assigned(node) for node in ast.parse(Path(path).read_text()).body):
            found.add(Path(path).resolve().relative_to(REPO).as_posix())
    assert len(found) == 1, (name, found)
    return found.pop()


def template_defining(name: str) -> str:
    templates = REPO / "charts" / "kubeddp" / "templates"
    (path,) = [p for p in templates.glob("_*.tpl") if f'define "{name}"' in p.read_text()]
    return path.relative_to(REPO).as_posix()


def test_the_pod_field_recipe_names_the_files_a_pod_field_touches() -> None:
    """Derived from where the checks' tables live: the chart's values, the one pod writer, the
    pod fields (which every kind's table takes from) and the samples every value is set with."""
    files = [
        defined_in("VALUES", VALUES),
        template_defining("kubeddp.podTemplate"),
        defined_in("POD_FIELDS", POD_FIELDS),
        defined_in("SAMPLES", SAMPLES),
    ]
    assert recipe_files("Add a chart value or pod field") == files


@pytest.mark.parametrize("kind", KINDS.values(), ids=lambda kind: kind.name)
def test_no_kind_needs_its_own_entry_for_a_pod_field(kind) -> None:
    """Every kind takes POD_FIELDS as they are; a TrainJob lands or refuses each by its CRD,
    so a field kubeddp does not write yet needs no TrainJob entry either."""
    for path, field in POD_FIELDS.items():
        expected = type(pod_field_takes(field)) if kind.name == "trainjob" else Lands
        assert type(kind.takes[path]) is expected, (kind.name, path)
    assert pod_field_takes("spec.schedulingGates") == Lands((TRAINJOB,))  # the CRD admits it
    assert isinstance(pod_field_takes("spec.dnsPolicy"), Refused)  # runtimePatches cannot set it


def test_an_option_without_its_sample_is_caught() -> None:
    """No sample: the option has no case, and test_every_option_has_a_case fails."""
    (flag,) = [flag for flag, value in FLAGS if flag.name == "--tolerations"]
    forgot = {path: sample for path, sample in SAMPLES.items() if path != "tolerations"}
    assert derived_case(flag, "tolerations") is not None
    assert derived_case(flag, "tolerations", forgot) is None


def test_a_kind_restriction_written_in_a_doc_is_caught() -> None:
    doc = BY_PATH["envFrom"].doc
    assert restriction_in(doc, ["envFrom"]) == ""
    assert restriction_in(doc + " (not for a TrainJob)", ["envFrom"]) != ""


def test_a_metric_without_its_docs_row_is_caught(tmp_path: Path) -> None:
    served = documented_tables()[0]
    forgot = {name: row for name, row in served.items() if name != sorted(served)[0]}
    assert exported(tmp_path) != forgot


def documented_workloads(text: str) -> set[str]:
    """The `workload.name` column of docs/workloads.md's table."""
    return set(re.findall(r"^\| `(\w+)`", text, re.M))


def test_every_workload_has_a_docs_row() -> None:
    text = WORKLOADS_PAGE.read_text()
    assert set(workload_names()) - documented_workloads(text) == set()
    forgot = re.sub(r"^\| `regression`.*\n", "", text, flags=re.M)  # the forgotten step
    assert set(workload_names()) - documented_workloads(forgot) == {"regression"}


def smoke_config(name: str) -> WorkloadConfig:
    """The smallest config of each workload (custom: the example factories)."""
    small = {
        "regression": {"samples": 64},
        "charlm": {"seq_len": 16, "n_layer": 1, "n_head": 2, "n_embd": 32},
        "custom": {"model": f"{EXAMPLES}:make_model", "data": f"{EXAMPLES}:make_data"},
    }
    return WorkloadConfig(name=name, **small.get(name, {}))


@pytest.mark.parametrize("name", workload_names())
def test_every_workload_trains_two_steps(name: str) -> None:
    """The smoke run a new workload gets without a test of its own."""
    workload = build_workload(smoke_config(name), seed=0)
    batches = torch.utils.data.DataLoader(workload.train_set, batch_size=4)
    optimizer = torch.optim.SGD(workload.model.parameters(), lr=1e-3)
    for _, batch in zip(range(2), batches, strict=False):
        loss = workload.loss_fn(workload.model, batch)
        assert loss.dim() == 0 and torch.isfinite(loss), name
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
