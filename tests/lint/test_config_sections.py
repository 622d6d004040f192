"""Components take their own config section, not the whole `Config` (issue 26), and every
field of a section is read by some component (issue 38).

Only the composition roots below hold the whole `Config`: they build the components and hand
each the section(s) it uses (`cfg.train`, `cfg.checkpoint`, ...), so a component's signature
says what it depends on. A parameter (or a class field: a dataclass's fields are its
constructor's parameters) annotated `Config` anywhere else under trainer/ fails here.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

from kubeddp.trainer.config import Config

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


# ---- Every config field is read (issue 38): a key declared and documented (the generated
# docs/config-reference.md, the chart's schema) that no code reads would be accepted and do
# nothing. A read is an attribute of a section: `X.train.lr` (any X), or `lr` of a name or
# `self.NAME` that holds a section (a parameter or class field annotated with the section's
# class, or assigned from `X.train` or from another such name).
PRODUCT = ("trainer", "tools", "kubeddp")


def _sections() -> dict[str, tuple[str, set[str]]]:
    """Config's sections: name -> (the section's class name, its fields)."""
    hints = typing.get_type_hints(Config)
    classes = {item.name: hints[item.name] for item in dataclasses.fields(Config)}
    return {
        name: (cls.__name__, {item.name for item in dataclasses.fields(cls)})
        for name, cls in classes.items()
    }


def _section_of(annotation: ast.expr | None, classes: dict[str, str]) -> str | None:
    """The section an annotation names (`TrainConfig`, `"TrainConfig | None"`, config.X)."""
    for node in ast.walk(annotation) if annotation is not None else ():
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                found = _section_of(ast.parse(node.value, mode="eval").body, classes)
            except SyntaxError:
                continue
            if found:
                return found
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        if name in classes:
            return classes[name]
    return None


def _holder(node: ast.expr) -> str | None:
    """`cfg` or `self.cfg`: what a section can be held in."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


def _holders(tree: ast.Module, sections: dict, classes: dict[str, str]) -> dict[str, str]:
    """Names (and self.attrs) of a module that hold a section -> the section."""
    held: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs):
                if section := _section_of(arg.annotation, classes):
                    held[arg.arg] = section
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                annotated = isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                if annotated and (section := _section_of(stmt.annotation, classes)):
                    held[f"self.{stmt.target.id}"] = section
    for _ in range(3):  # x = cfg.train; self.cfg = cfg; y = x
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = _holder(node.targets[0]), node.value
                if isinstance(value, ast.Attribute) and value.attr in sections:
                    section: str | None = value.attr
                else:
                    section = held.get(_holder(value) or "")
                if target and section:
                    held[target] = section
    return held


def fields_read(sources: dict[str, str]) -> set[str]:
    """`section.key` for every config field that one of `sources` (path -> text) reads."""
    sections = _sections()
    classes = {cls: name for name, (cls, _) in sections.items()}
    read = set()
    for path, source in sources.items():
        tree = ast.parse(source, path)
        held = _holders(tree, sections, classes)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            base = node.value
            if isinstance(base, ast.Attribute) and base.attr in sections:
                section: str | None = base.attr
            else:
                section = held.get(_holder(base) or "")
            if section and node.attr in sections[section][1]:
                read.add(f"{section}.{node.attr}")
    return read


def _product_sources() -> dict[str, str]:
    return {
        path.relative_to(REPO).as_posix(): path.read_text()
        for folder in PRODUCT
        for path in sorted((REPO / folder).rglob("*.py"))
        if path.relative_to(REPO).as_posix() != HOME
    }


def test_every_config_field_is_read() -> None:
    declared = {f"{name}.{key}" for name, (_, keys) in _sections().items() for key in keys}
    unread = sorted(declared - fields_read(_product_sources()))
    assert not unread, (
        "these config keys are declared (and documented) but no code outside trainer/config.py "
        "reads them: wire each where it takes effect, or remove it (then make chart):\n"
        + "\n".join(unread)
    )


def test_the_read_check_sees_every_kind_of_read() -> None:
    # It must be able to fail: reads through each kind of holder count, look-alikes do not.
    source = """
from kubeddp.trainer.config import TrainConfig, CheckpointConfig

class Saver:
    settings: CheckpointConfig
    def __init__(self, settings: CheckpointConfig) -> None:
        self.settings = settings
    def due(self) -> int:
        return self.settings.every_steps

def clip(cfg) -> float:
    return cfg.train.grad_clip

def warmup(train: "TrainConfig | None") -> int:
    t = train
    return t.warmup_steps

def other(thing) -> object:
    return thing.lr, thing.keep  # not known to hold a section: not a read
"""
    assert fields_read({"t.py": source}) == {
        "checkpoint.every_steps",
        "train.grad_clip",
        "train.warmup_steps",
    }
