"""docs/maintainers.md: every file its recipes name exists, each recipe's check catches the
step a maintainer forgets (a kind's table entry, a metric's docs row, a workload's docs row),
and each recipe's file list is the true one: derived from the things that exist (the files that
name every metric, checkpoint part, exit code, job kind or command), never a pinned count."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import sys
from pathlib import Path

import pytest
import torch

from kubeddp.tools.cli.main import build_parser
from kubeddp.tools.manifests.chart.values import BY_PATH, FLAGS, VALUES
from kubeddp.tools.manifests.kinds import KINDS, Lands, Refused
from kubeddp.tools.manifests.kinds.trainjob import JOB as TRAINJOB
from kubeddp.tools.manifests.kinds.trainjob import pod_field_takes
from kubeddp.tools.manifests.kinds.values import POD_FIELDS
from kubeddp.trainer import exit_codes
from kubeddp.trainer.config import WorkloadConfig, load_config, workload_names
from kubeddp.trainer.worker.checkpoint import parts as checkpoint_parts
from kubeddp.trainer.worker.distributed import DistContext
from kubeddp.trainer.worker.loop import Trainer
from kubeddp.trainer.worker.metrics import TrainingMetrics
from kubeddp.trainer.workloads import build_workload
from tests.helpers.kind_restrictions import restriction_in
from tests.helpers.kind_samples import SAMPLES, derived_case, untabled
from tests.helpers.metrics import documented_tables, exported
from tests.helpers.repo_files import is_generated, string_constants, text, tracked

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "docs" / "maintainers.md"
WORKLOADS_PAGE = REPO / "docs" / "workloads.md"
EXAMPLES = "kubeddp.trainer.workloads.examples"
pytestmark = pytest.mark.timeout(120)


def named_files() -> list[str]:
    """The repository paths the recipes name in backticks."""
    page = RECIPES.read_text()
    return sorted(set(re.findall(r"`((?:tools|trainer|charts|tests|docs|kubeddp)/[\w./-]+)", page)))


def test_every_file_a_recipe_names_exists() -> None:
    paths = named_files()
    assert len(paths) >= 10
    # NAME: one file per instance; its folder exists
    missing = [
        p for p in paths if not (REPO / (p.rpartition("/")[0] if "NAME" in p else p)).exists()
    ]
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


# ---- Each recipe's true file list, derived from what exists ------------------------------
# A file that names every existing instance of a thing must name a new one too; a path that
# exists once per instance (tools/manifests/kinds/NAME.py) is one a new instance adds. Generated
# files (`do not edit`) are the recipe's `make` line, not its list.


def _naming_every(words: list[str], pattern: str = r"\b{}\b") -> set[str]:
    """The tracked files whose text names every one of `words` (each as `pattern` says); the
    recipes themselves, which name instances as examples, aside."""
    found = set()
    for name in tracked():
        if REPO / name == RECIPES:
            continue
        body = text(name)
        if body and all(re.search(pattern.format(re.escape(w)), body, re.M) for w in words):
            found.add(name)
    return found


def _hand_edited(names: set[str]) -> set[str]:
    return {name for name in names if not is_generated(name)}


def metric_files() -> set[str]:
    """Every file naming every family the worker defines (where it is made, the docs table),
    and every file that calls or defines TrainingMetrics.on_step with each of its keywords
    (each must pass a new one, or fails)."""
    families = sorted(
        s for s in string_constants("trainer/worker/metrics.py") if re.fullmatch(r"kubeddp_\w+", s)
    )
    keywords = [
        name
        for name, p in inspect.signature(TrainingMetrics.on_step).parameters.items()
        if p.kind is p.KEYWORD_ONLY
    ]
    calls = {n for n in _naming_every(keywords, r"\b{}\s*[=:]") if "on_step(" in text(n)}
    return _hand_edited(_naming_every(families, r"\b{}(_total)?\b") | calls)


def part_names() -> list[str]:
    """The parts of a trainer's checkpoint, every optional one on."""
    settings = ["workload.name=regression", "workload.samples=64", "metrics.enabled=false"]
    cfg = load_config(None, [*settings, "train.record_sample_ids=true"])
    trainer = Trainer(cfg, DistContext(0, 1, torch.device("cpu"), "gloo"))
    try:
        return sorted(trainer.checkpoints.parts)
    finally:
        trainer.close()


def checkpoint_part_files() -> set[str]:
    """Every file naming every adapter class of parts.py, and every file naming every part of
    the mapping by its name (quoted, or in backticks)."""
    module = checkpoint_parts
    adapters = [
        cls.__name__
        for cls in vars(module).values()
        if isinstance(cls, type)
        and cls.__module__ == module.__name__
        and cls not in (module.Stateful, module.PerRank)
    ]
    named = _naming_every(part_names(), r"[\"'`]{}[\"'`]")
    return _hand_edited(_naming_every(adapters) | named)


def exit_code_names() -> list[str]:
    return [
        name
        for name, value in vars(exit_codes).items()
        if name.isupper() and type(value) is int and name != "RETRYABLE_FROM"
    ]


def exit_code_files() -> set[str]:
    """Every hand-edited file naming every exit-code constant."""
    return _hand_edited(_naming_every(exit_code_names()))


def _per_instance_paths(names: list[str], skip: str = "") -> set[str]:
    """Paths that exist once per instance (`skip` aside), with NAME in the instance's place."""
    shapes = {path.replace(n, "NAME") for path in tracked() for n in names if n in path}
    return {
        shape
        for shape in shapes
        if all((REPO / shape.replace("NAME", n)).exists() for n in names if n != skip)
    }


def job_kind_files() -> set[str]:
    """Paths that exist once per kind (kind_paths), Python in the product and the emulated
    cluster with a literal for every kind (its name, chart kind or resource kind), and docs
    with a table row per kind."""
    ids = [{name, kind.chart_kind, kind.resource.kind} for name, kind in KINDS.items()]
    code = {
        name
        for name in tracked()
        if name.endswith(".py")
        and (
            name.split("/")[0] in ("trainer", "tools", "kubeddp")
            or (name.startswith("tests/emulation/") and not Path(name).name.startswith("test_"))
        )
        and all(i & string_constants(name) for i in ids)
    }
    docs = {n for n in _naming_every(list(KINDS), r"^\| `{}`") if n.endswith(".md")}
    return kind_paths()[0] | code | docs


def kind_paths() -> tuple[set[str], set[str]]:
    """Paths that exist once per kind, NAME in its place: (hand-edited, generated). The chart's
    default is no kind (auto: the kind the cluster serves), so every kind has them all."""
    assert BY_PATH["kind"].default not in {k.chart_kind for k in KINDS.values()}
    sample = next(iter(KINDS))
    shapes = _per_instance_paths(list(KINDS))
    generated = {shape for shape in shapes if is_generated(shape.replace("NAME", sample))}
    return shapes - generated, generated


def cli_commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def cli_command_files() -> set[str]:
    """Python files with a literal for every command (the parser), and docs with a table row
    for every command the parser hands to a handler (the manifest and cluster commands)."""
    commands = cli_commands()
    code = {n for n in tracked() if n.endswith(".py") and set(commands) <= string_constants(n)}
    handled = [name for name, parser in commands.items() if parser.get_default("handler")]
    docs = {n for n in _naming_every(handled, r"^\| `kubeddp {}\b") if n.endswith(".md")}
    return code | docs


DERIVED = {
    "Add a metric": metric_files,
    "Add a checkpoint part": checkpoint_part_files,
    "Add an exit code": exit_code_files,
    "Add a job kind": job_kind_files,
    "Add a CLI command": cli_command_files,
}


@pytest.mark.parametrize("title", sorted(DERIVED))
def test_a_recipes_files_are_the_true_list(title: str) -> None:
    listed = recipe_files(title)
    assert len(listed) == len(set(listed)), "a file listed twice"
    derived = DERIVED[title]()
    assert set(listed) == derived, (
        f"{title}: the recipe lists {sorted(set(listed) - derived)} that no existing instance "
        f"needs, and misses {sorted(derived - set(listed))}"
    )


def test_a_file_a_recipe_misses_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The derivation follows the files: a docs table that lost a command's row, or a docs
    list that lost a part, drops out of the true list, and the recipe no longer matches it."""
    real = text
    forgot = {
        "docs/manifests-and-chart.md": re.sub(
            r"^\| `kubeddp wait .*\n", "", real("docs/manifests-and-chart.md"), flags=re.M
        ),
        "docs/checkpoints.md": real("docs/checkpoints.md").replace("`sample_record`", "its"),
    }
    assert "docs/manifests-and-chart.md" in cli_command_files()
    assert "docs/checkpoints.md" in checkpoint_part_files()
    monkeypatch.setattr(sys.modules[__name__], "text", lambda n: forgot.get(n) or real(n))
    assert "docs/manifests-and-chart.md" not in cli_command_files()
    assert "docs/checkpoints.md" not in checkpoint_part_files()


def test_generated_files_of_a_recipe_are_its_make_line() -> None:
    """What `make chart`/`make k8s` writes for a kind or an exit code is named in the recipe's
    text, never in its list."""
    exit_rows = {
        name
        for name in tracked()
        if is_generated(name)
        and all(f"| {e.code} | {e.name} |" in text(name) for e in exit_codes.TABLE)
    }
    assert exit_rows == {"docs/exit-codes.md"}
    kind_generated = kind_paths()[1]
    for title, generated in (("Add an exit code", exit_rows), ("Add a job kind", kind_generated)):
        section = RECIPES.read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
        assert all(f"`{path}`" in section for path in generated), (title, generated)
