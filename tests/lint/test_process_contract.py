"""What crosses the boundary between `kubeddp launch` and its workers lives in one module,
trainer/process_contract.py (issue 30): the workers never import the launcher, the launcher
imports from the workers only what it runs or checks in its own process, and no other module
spells one of the contract's environment names or file names."""

from __future__ import annotations

import ast
from pathlib import Path

from kubeddp.trainer import constants, process_contract

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "trainer" / "process_contract.py"
WORKER, LAUNCHER = "kubeddp.trainer.worker", "kubeddp.trainer.launcher"
# What launch may import from the worker's folder, and why (none of it crosses a process).
LAUNCHER_MAY_IMPORT = {
    f"{WORKER}.program": "Program and its runner: checked by launch, run in process under torchrun",
    f"{WORKER}.entry": "run: under a user's own torchrun, launch trains in its own process",
    f"{WORKER}.compiled": "compile_plan: launch refuses train.compile=on before any wait",
    f"{WORKER}.metrics": "FAMILIES: what a worker records, which launch serves (its own table)",
}
# The contract's environment names and the suffixes of its files, spelled nowhere else.
SPELLED_ONCE = [
    *(value for name, value in vars(process_contract).items() if name.startswith("ENV_")),
    ".hb",
    ".stacks",
    ".fr-request",
    ".fr.json",
    process_contract.WORKER_METRICS_SUFFIX,
]


def imported_modules(source: str) -> set[str]:
    """Every module a source imports (`from a import b` counts as `a` and `a.b`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def crossings(folder: str, source: str) -> list[str]:
    """The imports of a module in `folder` (worker or launcher) that reach the other side."""
    imported = imported_modules(source)
    if folder == "worker":
        return sorted(m for m in imported if m == LAUNCHER or m.startswith(LAUNCHER + "."))
    reached = {m for m in imported if m.startswith(WORKER + ".")}
    return sorted(m for m in reached if not any(m.startswith(ok) for ok in LAUNCHER_MAY_IMPORT))


def spelled_literals(source: str) -> set[str]:
    """The string constants of a source that spell a contract name (or end in its suffix)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(w for w in SPELLED_ONCE if node.value == w or node.value.endswith(w))
    return found


def test_the_checks_see_a_crossing() -> None:
    # Each check must be able to fail.
    assert crossings("worker", "from kubeddp.trainer.launcher import early_exit") == [
        "kubeddp.trainer.launcher",
        "kubeddp.trainer.launcher.early_exit",
    ]
    assert crossings("launcher", "from kubeddp.trainer.worker.heartbeat import read_record") == [
        "kubeddp.trainer.worker.heartbeat",
        "kubeddp.trainer.worker.heartbeat.read_record",
    ]
    assert crossings("launcher", "from kubeddp.trainer.worker.entry import run") == []
    assert spelled_literals('ENV = "KUBEDDP_DIAG_DIR"\nP = f"rank-{r}.hb"') == {
        "KUBEDDP_DIAG_DIR",
        ".hb",
    }


def test_neither_side_imports_the_others_contract() -> None:
    found = [
        f"{path.relative_to(REPO)}: {module}"
        for folder in ("worker", "launcher")
        for path in sorted((REPO / "trainer" / folder).rglob("*.py"))
        for module in crossings(folder, path.read_text())
    ]
    assert not found, (
        "the worker and the launcher share only trainer/process_contract.py; move the shared "
        "piece there (or, for a launcher import that crosses no process, add it to "
        "LAUNCHER_MAY_IMPORT with why):\n" + "\n".join(found)
    )


def test_the_contracts_names_are_spelled_only_there() -> None:
    sources = [*(REPO / "trainer").rglob("*.py"), *(REPO / "kubeddp").rglob("*.py")]
    found = [
        f"{path.relative_to(REPO)}: {sorted(spelled)}"
        for path in sorted(sources)
        if path != CONTRACT and (spelled := spelled_literals(path.read_text()))
    ]
    assert not found, "use the names of trainer/process_contract.py:\n" + "\n".join(found)


def aliases(*modules: object) -> dict[str, list[str]]:
    """Environment variables with more than one ENV_ name among `modules`."""
    names: dict[str, list[str]] = {}
    for module in modules:
        for name, value in vars(module).items():
            if name.startswith("ENV_") and isinstance(value, str):
                names.setdefault(value, []).append(name)
    return {value: found for value, found in names.items() if len(found) > 1}


def test_each_environment_variable_has_one_name() -> None:
    """No alias survives a rename (ENV_INDEXEDJOB_NNODES for KUBEDDP_NNODES, read by the
    PyTorchJob too): one name, which says what the variable holds."""
    old = type(
        "Old", (), {"ENV_NNODES": "KUBEDDP_NNODES", "ENV_INDEXEDJOB_NNODES": "KUBEDDP_NNODES"}
    )
    assert aliases(old) == {"KUBEDDP_NNODES": ["ENV_NNODES", "ENV_INDEXEDJOB_NNODES"]}
    assert aliases(constants, process_contract) == {}
