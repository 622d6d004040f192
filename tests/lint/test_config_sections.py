"""Components take their own config section, not the whole `Config` (issue 26).

Only the composition roots below hold the whole `Config`: they build the components and hand
each the section(s) it uses (`cfg.train`, `cfg.checkpoint`, ...), so a component's signature
says what it depends on. A parameter (or a class field: a dataclass's fields are its
constructor's parameters) annotated `Config` anywhere else under trainer/ fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECKED = REPO / "trainer"
HOME = "trainer/config.py"  # where Config is defined: its own functions take it
ROOTS = {
    "trainer/worker/entry.py::run": "one training process: init, the Trainer, teardown",
    "trainer/worker/loop.py::Trainer.__init__": "builds the training components",
    "trainer/launcher/pod.py::run_launch": "launch's composition: keeper, workdir, the pod",
    "trainer/launcher/pod.py::_run_pod": "the pod's: retry budget, /metrics, stall watch, agent",
    "trainer/launcher/pod.py::_run_as_torchrun_worker": "hands it to entry.run in process",
    "trainer/process_contract.py::resolved_config_env": "hands the whole config to the workers",
}


def _config_names(tree: ast.Module) -> set[str]:
    """`Config` and any name it is imported as."""
    names = {"Config"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("config"):
            names.update(a.asname or a.name for a in node.names if a.name == "Config")
    return names


def _names_config(annotation: ast.expr | None, names: set[str]) -> bool:
    if annotation is None:
        return False
    for node in ast.walk(annotation):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):  # "Config | None"
            try:
                inner = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                continue
            if _names_config(inner, names):
                return True
        if isinstance(node, ast.Name) and node.id in names:
            return True
        if isinstance(node, ast.Attribute) and node.attr == "Config":  # config.Config
            return True
    return False


def config_parameters(source: str, filename: str) -> list[str]:
    """`QUALNAME(PARAM)` for each parameter, and `CLASS.FIELD` for each class field, of
    `source` annotated with the whole Config."""
    tree = ast.parse(source, filename)
    names = _config_names(tree)
    found: list[str] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = prefix + child.name
                a = child.args
                for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg):
                    if arg is not None and _names_config(arg.annotation, names):
                        found.append(f"{qualname}({arg.arg})")
                visit(child, qualname + ".")
            elif isinstance(child, ast.ClassDef):
                qualname = prefix + child.name
                for stmt in child.body:
                    if (
                        isinstance(stmt, ast.AnnAssign)
                        and isinstance(stmt.target, ast.Name)
                        and _names_config(stmt.annotation, names)
                    ):
                        found.append(f"{qualname}.{stmt.target.id}")
                visit(child, qualname + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def _found_under_trainer() -> list[str]:
    """`PATH::QUALNAME(PARAM)` for every parameter or field under trainer/ that takes Config."""
    found = []
    for path in sorted(CHECKED.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        found += [f"{rel}::{item}" for item in config_parameters(path.read_text(), rel)]
    return found


def _is_root(item: str) -> bool:
    return item.split("::")[0] == HOME or item.partition("(")[0] in ROOTS


def test_the_check_sees_config_parameters() -> None:
    # It must be able to fail: every spelling of a Config parameter is found, sections are not.
    source = """
from kubeddp.trainer.config import Config as Whole, TrainConfig
from kubeddp.trainer import config

def one(cfg: Config, train: TrainConfig) -> None: ...
class Part:
    settings: config.Config
    def __init__(self, *, cfg: "Whole | None" = None) -> None:
        def inner(c: list[Config]) -> None: ...
async def two(train: TrainConfig, **rest: TrainConfig) -> Config: ...
"""
    assert config_parameters(source, "t.py") == [
        "one(cfg)",
        "Part.settings",
        "Part.__init__(cfg)",
        "Part.__init__.inner(c)",
    ]


def test_only_the_composition_roots_take_the_whole_config() -> None:
    others = [item for item in _found_under_trainer() if not _is_root(item)]
    assert not others, (
        "these take the whole Config: give them the section(s) they use (cfg.train, "
        "cfg.checkpoint, ...) or a small frozen dataclass of the fields they need:\n"
        + "\n".join(others)
    )


def test_every_root_named_takes_the_config() -> None:
    # A root that no longer takes Config leaves the list, so the list stays the truth.
    roots = {item.partition("(")[0] for item in _found_under_trainer()}
    assert set(ROOTS) - roots == set()
