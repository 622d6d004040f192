"""A parsed training script and what the checks ask of it: where a name comes from (imports,
`x = mp.get_context("spawn")`, `s = getattr(mp, "spawn")`), which function holds a node, which
functions a call reaches. Everything here walks the tree iteratively: a script nested as deep as
Python allows (a few hundred levels) is read, not a RecursionError."""

from __future__ import annotations

import ast
from collections.abc import Iterator

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef
MAX_RESOLVE_DEPTH = 8  # getattr(mp, "spawn"), mp.get_context("spawn").Process: a few levels


def dotted(node: ast.AST | None) -> str:
    """`a.b.c` for a Name/Attribute chain, else ''."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def last(node: ast.AST | None) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def text(node: ast.AST | None) -> str | None:
    """The leading literal text of a string expression (a constant, an f-string, `"%s" % x`,
    `"{}".format(x)`, `os.path.join("/a", x)`), else None."""
    while True:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            first = node.values[0] if node.values else None
            return first.value if isinstance(first, ast.Constant) else ""
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            node = node.left
        elif isinstance(node, ast.Call) and last(node.func) == "format":
            node = getattr(node.func, "value", None)
        elif isinstance(node, ast.Call) and dotted(node.func) == "os.path.join" and node.args:
            node = node.args[0]
        else:
            return None


def literal_text(node: ast.AST | None) -> str | None:
    """The whole text when it is one literal (a constant or an f-string without fields)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values):
        return "".join(str(v.value) for v in node.values)  # type: ignore[attr-defined]
    return None


def words(node: ast.AST) -> str:
    """The names, attributes and string constants in an expression, for a rule that looks for
    a word (`rank`) in a condition: ast.unparse recurses, and a deep expression would stop it."""
    found = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.append(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.append(sub.attr)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            found.append(sub.value)
    return " ".join(found)


def shown(node: ast.AST) -> str:
    """The expression as source text, for a message."""
    try:
        return ast.unparse(node)
    except RecursionError:
        return "(a deeply nested expression)"


class ParsedScript:
    """The parsed script with where its names come from, its calls and its functions."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.names: dict[str, str] = {}  # local name -> the module or object it stands for
        self._read_imports()
        self._read_assignments()
        self.calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        self.strings = {
            n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)
        }  # fmt: skip
        self.functions: dict[str, FunctionNode] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, node)
            elif isinstance(node, ast.ClassDef):
                self.classes.setdefault(node.name, node)

    def _read_imports(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.names[alias.asname] = alias.name
                    else:
                        head = alias.name.split(".")[0]
                        self.names[head] = head
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    self.names[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def _read_assignments(self) -> None:
        """`ctx = mp.get_context("spawn")`, `start = mp.spawn`, `s = getattr(mp, "spawn")`:
        the name stands for what the value resolves to (in source order, not flow)."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name) and target.id not in self.names:
                    value = self.resolved(node.value)
                    if value:
                        self.names[target.id] = value

    def resolved(self, node: ast.AST | None, depth: int = 0) -> str:
        """What an expression names, with import aliases and the names above expanded:
        `mp.spawn` -> `torch.multiprocessing.spawn`, `getattr(mp, "spawn")` likewise,
        `mp.get_context("spawn")` -> `torch.multiprocessing` (a context has the module's
        Process). '' for what it cannot follow (a call's result, `f()()()...`)."""
        if depth > MAX_RESOLVE_DEPTH:
            return ""
        if isinstance(node, ast.Call):
            func = self.resolved(node.func, depth + 1)
            if func.endswith(".get_context"):
                return func.rpartition(".")[0]
            if last(node.func) == "getattr" and len(node.args) >= 2:
                attribute = literal_text(node.args[1])
                base = self.resolved(node.args[0], depth + 1)
                return f"{base}.{attribute}" if base and attribute else ""
            return ""
        if isinstance(node, ast.Attribute) and not dotted(node):
            base = self.resolved(node.value, depth + 1)
            return f"{base}.{node.attr}" if base else ""
        name = dotted(node)
        head, _, rest = name.partition(".")
        full = self.names.get(head, head)
        return f"{full}.{rest}" if rest and full else full

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        while node in self.parents:
            node = self.parents[node]
            yield node

    def function_of(self, node: ast.AST) -> FunctionNode | None:
        for parent in self.ancestors(node):
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return parent
        return None

    def in_loop(self, node: ast.AST) -> bool:
        return any(isinstance(p, (ast.For, ast.While, ast.AsyncFor)) for p in self.ancestors(node))

    def calls_to(self, *names: str) -> list[ast.Call]:
        """Calls whose target's last name is one of `names`, directly or through an alias
        (`from torch.distributed import init_process_group as ipg`)."""
        return [
            c for c in self.calls
            if last(c.func) in names or self.resolved(c.func).rpartition(".")[2] in names
        ]  # fmt: skip

    def assigned_value(self, name: str, at: ast.AST) -> ast.expr | None:
        """The last `name = value` before `at` in its function (or the module)."""
        scope = self.function_of(at) or self.tree
        found = None
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and node.lineno <= at.lineno:
                for target in node.targets:
                    if dotted(target) == name and (found is None or node.lineno > found[0]):
                        found = (node.lineno, node.value)
        return found[1] if found else None

    def reaches(self, start: ast.AST, names: tuple[str, ...], depth: int = 6) -> bool:
        """Whether code under `start` calls one of `names`, directly or through the script's
        own functions (up to `depth` calls deep)."""
        todo, seen = [(start, 0)], set()
        while todo:
            node, level = todo.pop()
            for sub in ast.walk(node):
                if not isinstance(sub, ast.Call):
                    continue
                if last(sub.func) in names or self.resolved(sub.func).rpartition(".")[2] in names:
                    return True
                callee = self.functions.get(last(sub.func))
                if callee is not None and callee not in seen and level < depth:
                    seen.add(callee)
                    todo.append((callee, level + 1))
        return False
