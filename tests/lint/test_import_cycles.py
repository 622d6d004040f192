"""No import cycles among kubeddp's own modules in trainer/ and tools/ (issue 26: a cycle means
two modules cannot be read, tested or moved apart). Every import counts, including those inside
functions: a lazy import hides a cycle from Python, not from the reader."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The package-dir mapping of pyproject.toml: dotted package -> folder.
ROOTS = {"kubeddp.trainer": REPO / "trainer", "kubeddp.tools": REPO / "tools"}


def _module_name(path: Path) -> str:
    for package, folder in ROOTS.items():
        if folder in path.parents:
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            return ".".join((package, *parts))
    raise ValueError(path)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for folder in ROOTS.values() for p in folder.rglob("*.py")}


def _imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The known modules that `path` imports (`import a.b`, `from a import b`, relative too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base]) if base else ".".join(up)
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imported(name, path, known) for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def test_finder_sees_a_cycle() -> None:
    # The checker itself must be able to fail.
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_graph_sees_real_imports() -> None:
    graph = import_graph()
    assert "kubeddp.trainer.constants" in graph["kubeddp.trainer.launcher.launch"]


def test_no_import_cycle_in_trainer_or_tools() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles (move the shared piece down into its own module):\n" + (
        "\n".join(" <-> ".join(c) for c in cycles)
    )


# Which rooms of tools/ a room may import (docs/maintainers.md, "The rooms"): the command line
# uses the cluster API and the manifests, the cluster API uses the manifests, the manifests use
# neither; the build-time generators may use anything, and nothing that ships imports them.
TOOLS_ROOMS_MAY_USE = {
    "cli": {"cli", "cluster", "manifests"},
    "cluster": {"cluster", "manifests"},
    "manifests": {"manifests"},
    "generate": {"generate", "cli", "cluster", "manifests"},
}


def room_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports against the rooms' direction: trainer -> tools, a tools room -> one it may not
    use, anything -> tools.generate from outside it."""
    found = []
    for name, targets in sorted(graph.items()):
        parts = name.split(".")
        for target in sorted(targets):
            tparts = target.split(".")
            if parts[1] == "trainer" and tparts[1] == "tools":
                found.append(f"{name} -> {target} (trainer never imports tools)")
            elif parts[1] == tparts[1] == "tools" and len(parts) > 2 and len(tparts) > 2:
                room, troom = parts[2], tparts[2]
                allowed = TOOLS_ROOMS_MAY_USE.get(room)
                if allowed is not None and troom in TOOLS_ROOMS_MAY_USE and troom not in allowed:
                    found.append(f"{name} -> {target} (tools/{room} may not use tools/{troom})")
    return found


def test_room_checker_sees_a_wrong_direction() -> None:
    graph = {
        "kubeddp.tools.manifests.kinds": {"kubeddp.tools.cluster.kube"},
        "kubeddp.tools.cli.main": {"kubeddp.tools.cluster.kube"},
        "kubeddp.trainer.launcher.pod": {"kubeddp.tools.manifests.k8s_names"},
    }
    assert len(room_violations(graph)) == 2


def test_imports_follow_the_rooms() -> None:
    violations = room_violations(import_graph())
    assert not violations, "imports against the rooms' direction:\n" + "\n".join(violations)
