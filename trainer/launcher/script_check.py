"""Read a user's training script without running it (Python `ast`) and name its DDP pitfalls.

`kubeddp check SCRIPT` prints every finding; `kubeddp train/render --script` print them as
warnings; launch asks `spawns_workers` whether the program starts its own workers (mp.spawn,
mp.Process), which decides how it is run. The rules look for what the tutorials' scripts do
and what goes wrong when the same script runs on several workers, nodes or retried pods; each
finding names the line, the pitfall and the fix. Heuristics stay on the side of silence: a
rule fires only on a pattern it recognises, never on code it cannot follow.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from kubeddp.trainer.constants import CHECKPOINT_DIR

# What mp.spawn-style programs call to start their workers.
SPAWN_CALLS = {"spawn", "start_processes", "Process"}
MULTIPROCESSING = ("torch.multiprocessing", "multiprocessing")
COLLECTIVES = {
    "all_reduce", "broadcast", "all_gather", "reduce", "reduce_scatter", "all_to_all",
    "send", "recv", "isend", "irecv", "gather", "scatter",
}  # fmt: skip
TENSOR_FACTORIES = {"tensor", "zeros", "ones", "rand", "randn", "empty", "full", "arange"}
# A condition that names the rank: saving under it is saving on one rank (or one per node).
RANK_WORDS = re.compile(r"rank|gpu_id|is_main|main_process|is_master|is_primary|master_process")
LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")
LOCAL_RANK_MACRO = "${local_rank}"

FIXES = {
    "spawn-several-nodes": "a program that spawns its own workers trains one copy per node; "
    "convert it to torchrun style (docs/your-own-script.md: read LOCAL_RANK, call "
    "init_process_group() without rank/world_size, drop mp.spawn) or run one node",
    "hardcoded-master": "delete it: torchrun and kubeddp set MASTER_ADDR and MASTER_PORT for "
    "every worker (os.environ.setdefault keeps theirs)",
    "tcp-init": "use init_method='env://' (the default): the launcher sets the address on "
    "every node",
    "file-init": "use init_method='env://' (the default): a file:// store must be on a "
    "filesystem every node shares, and a retried pod finds the previous run's file there",
    "local-rank-arg": f"pass --local_rank={LOCAL_RANK_MACRO} after -- (quoted in a shell), or "
    "read int(os.environ['LOCAL_RANK']) instead",
    "no-distributed-sampler": "give the DataLoader sampler=DistributedSampler(dataset) (and "
    "shuffle=False): without it every rank trains on the whole data set",
    "no-set-epoch": "call sampler.set_epoch(epoch) at the start of every epoch, or every "
    "epoch sees the same order",
    "save-every-rank": "save on one rank: put it under `if rank == 0:` (dist.get_rank()), or "
    "every rank writes the same file at once",
    "relative-snapshot": f"save under {CHECKPOINT_DIR} (the checkpoint volume) with an "
    "absolute path: a relative path lands in the working directory of the pod and is lost "
    "with it",
    "snapshot-outside-volume": f"save under {CHECKPOINT_DIR}: in a pod only the checkpoint "
    "volume outlives a retry",
    "load-no-map-location": "pass map_location (e.g. f'cuda:{local_rank}' or the device): "
    "otherwise every rank loads onto the GPU the tensors were saved from",
    "nccl-cpu-tensor": "create the tensor on the GPU (device=f'cuda:{local_rank}' or .cuda()): "
    "NCCL collectives take CUDA tensors only",
    "init-no-timeout": "pass timeout=datetime.timedelta(minutes=...) to init_process_group: a "
    "lost peer then fails the job in that time instead of the backend's 10-30 min default",
}
PITFALLS = {
    "spawn-several-nodes": "the program spawns its own workers but the job has {nodes} nodes",
    "hardcoded-master": "{name} is hard-coded in the script",
    "tcp-init": "init_process_group uses a fixed tcp:// address",
    "file-init": "init_process_group uses a file:// store",
    "local-rank-arg": "--local_rank is parsed but the arguments do not pass ${{local_rank}} "
    "(torchrun and kubeddp set LOCAL_RANK, not the flag)",
    "no-distributed-sampler": "a DataLoader of a DDP script has no DistributedSampler",
    "no-set-epoch": "the DistributedSampler never gets set_epoch in a loop",
    "save-every-rank": "torch.save runs on every rank",
    "relative-snapshot": "a snapshot is saved on a relative path ({path})",
    "snapshot-outside-volume": "a snapshot is saved outside the checkpoint volume ({path})",
    "load-no-map-location": "torch.load without map_location",
    "nccl-cpu-tensor": "an NCCL collective on a CPU tensor ({name})",
    "init-no-timeout": "init_process_group without a timeout",
}
RULES = tuple(FIXES)


@dataclass(frozen=True)
class Finding:
    line: int
    rule: str
    pitfall: str
    fix: str

    def shown(self, path: str) -> str:
        return f"{path}:{self.line}: {self.rule}: {self.pitfall}; fix: {self.fix}"


class ScriptCheckError(ValueError):
    """The script cannot be read or parsed; one line."""


def _dotted(node: ast.AST) -> str:
    """`a.b.c` for a Name/Attribute chain, else ''."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _last(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _text(node: ast.AST | None) -> str | None:
    """The leading literal text of a string expression (a constant, an f-string, `"%s" % x`,
    `"{}".format(x)`), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        first = node.values[0] if node.values else None
        return first.value if isinstance(first, ast.Constant) else ""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return _text(node.left)
    if isinstance(node, ast.Call) and _last(node.func) == "format":
        return _text(getattr(node.func, "value", None))
    if isinstance(node, ast.Call) and _dotted(node.func) == "os.path.join" and node.args:
        return _text(node.args[0])
    return None


class _Script:
    """The parsed script with what the rules ask of it: parents, aliases, functions."""

    def __init__(self, source: str) -> None:
        self.tree = ast.parse(source)
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.aliases: dict[str, str] = {}  # local name -> module or object path
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        self.calls = [n for n in ast.walk(self.tree) if isinstance(n, ast.Call)]
        self.strings = {
            n.value for n in ast.walk(self.tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)
        }  # fmt: skip

    def resolved(self, node: ast.AST) -> str:
        """The call target with its import alias expanded (`mp.spawn` ->
        `torch.multiprocessing.spawn`)."""
        name = _dotted(node)
        head, _, rest = name.partition(".")
        full = self.aliases.get(head, head)
        return f"{full}.{rest}" if rest else full

    def calls_named(self, *names: str) -> list[ast.Call]:
        return [c for c in self.calls if _last(c.func) in names]

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        while node in self.parents:
            node = self.parents[node]
            yield node

    def function_of(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        for parent in self.ancestors(node):
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return parent
        return None

    def in_loop(self, node: ast.AST) -> bool:
        return any(isinstance(p, (ast.For, ast.While, ast.AsyncFor)) for p in self.ancestors(node))

    def assigned_value(self, name: str, at: ast.AST) -> ast.expr | None:
        """The last `name = value` before `at` in its function (or the module)."""
        scope = self.function_of(at) or self.tree
        found = None
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and node.lineno <= at.lineno:
                for target in node.targets:
                    if _dotted(target) == name and (found is None or node.lineno > found[0]):
                        found = (node.lineno, node.value)
        return found[1] if found else None


def _spawn_calls(script: _Script) -> list[ast.Call]:
    found = []
    for call in script.calls_named(*SPAWN_CALLS):
        target = script.resolved(call.func)
        module = target.rpartition(".")[0]
        via_context = isinstance(call.func, ast.Attribute) and isinstance(
            call.func.value, ast.Call
        )  # mp.get_context("spawn").Process(...)
        if module in MULTIPROCESSING or module.endswith(".spawn") or via_context:
            found.append(call)
    return found


def _is_distributed(script: _Script) -> bool:
    return bool(script.calls_named("init_process_group"))


def spawns_workers_in(source: str) -> bool:
    """Whether a DDP program starts its own workers (mp.spawn, mp.Process...)."""
    script = _Script(source)
    return _is_distributed(script) and bool(_spawn_calls(script))


def _rank_guarded(script: _Script, node: ast.AST, depth: int = 0) -> bool:
    """Whether `node` runs on one rank only: under an `if` on a rank, after an early return of
    the other ranks, or in a function that is only called that way."""
    for parent in script.ancestors(node):
        if isinstance(parent, ast.If) and RANK_WORDS.search(ast.unparse(parent.test)):
            return True
    function = script.function_of(node)
    if function is None:
        return False
    for stmt in function.body:
        if stmt.lineno >= node.lineno:
            break
        if (
            isinstance(stmt, ast.If)
            and RANK_WORDS.search(ast.unparse(stmt.test))
            and any(isinstance(s, ast.Return) for s in stmt.body)
        ):
            return True
    if _passed_as_argument(script, function.name):
        return False  # mp.spawn(main, ...), Process(target=run): every rank runs it
    callers = [c for c in script.calls if _last(c.func) == function.name]
    if not callers or depth > 3:
        return not callers  # never called here: not this rule's business
    return all(_rank_guarded(script, caller, depth + 1) for caller in callers)


def _passed_as_argument(script: _Script, name: str) -> bool:
    return any(
        _last(arg) == name
        for call in script.calls
        for arg in [*call.args, *(k.value for k in call.keywords)]
    )


def _runs_per_epoch(script: _Script, node: ast.AST, depth: int = 0) -> bool:
    """Whether `node` runs in a loop, or in a function that a loop calls."""
    if script.in_loop(node):
        return True
    function = script.function_of(node)
    if function is None or depth > 3:
        return False
    callers = [c for c in script.calls if _last(c.func) == function.name]
    return any(_runs_per_epoch(script, caller, depth + 1) for caller in callers)


def _path_text(script: _Script, path: ast.expr) -> str | None:
    text = _text(path)
    if text is None and isinstance(path, (ast.Name, ast.Attribute)):
        value = script.assigned_value(_dotted(path), path)
        text = _text(value) if value is not None else None
    return text


def _check(script: _Script, nodes: int, program_args: list[str]) -> Iterator[tuple]:
    distributed = _is_distributed(script)
    spawns = bool(_spawn_calls(script)) and distributed
    one_node_spawn = spawns and nodes == 1  # there localhost addresses are right
    if spawns and nodes > 1:
        for call in _spawn_calls(script):
            yield call.lineno, "spawn-several-nodes", {"nodes": nodes}
    for node in ast.walk(script.tree):
        if isinstance(node, ast.Assign) and not one_node_spawn:
            for target in node.targets:
                if (
                    isinstance(target, ast.Subscript)
                    and _dotted(target.value) == "os.environ"
                    and _text(target.slice) in ("MASTER_ADDR", "MASTER_PORT")
                ):
                    yield node.lineno, "hardcoded-master", {"name": _text(target.slice)}
    for call in script.calls_named("init_process_group"):
        method = _keyword(call, "init_method") or (call.args[1] if len(call.args) > 1 else None)
        text = _text(method) or ""
        if text.startswith("tcp://") and not one_node_spawn:
            yield call.lineno, "tcp-init", {}
        if text.startswith("file://"):
            yield call.lineno, "file-init", {}
        if _keyword(call, "timeout") is None and not any(k.arg is None for k in call.keywords):
            yield call.lineno, "init-no-timeout", {}
    passed = any(LOCAL_RANK_MACRO in arg for arg in program_args)
    if not passed and "LOCAL_RANK" not in script.strings:
        for call in script.calls_named("add_argument"):
            if any(_text(a) in LOCAL_RANK_FLAGS for a in call.args):
                yield call.lineno, "local-rank-arg", {}
    yield from _data_rules(script)
    yield from _save_load_rules(script, distributed)
    yield from _nccl_rule(script)


def _data_rules(script: _Script) -> Iterator[tuple]:
    uses_ddp = any(
        _last(c.func) in ("DistributedDataParallel", "DDP")
        or script.resolved(c.func).endswith("DistributedDataParallel")
        for c in script.calls
    )
    samplers = [c for c in script.calls if script.resolved(c.func).endswith("DistributedSampler")]
    if uses_ddp and not samplers:
        for call in script.calls_named("DataLoader"):
            if _keyword(call, "sampler") is None and _keyword(call, "batch_sampler") is None:
                yield call.lineno, "no-distributed-sampler", {}
    set_epoch = script.calls_named("set_epoch")
    shuffled = [
        c for c in samplers
        if not (isinstance(_keyword(c, "shuffle"), ast.Constant)
                and _keyword(c, "shuffle").value is False)  # type: ignore[union-attr]
    ]  # fmt: skip
    if shuffled and not any(_runs_per_epoch(script, c) for c in set_epoch):
        yield shuffled[0].lineno, "no-set-epoch", {}


def _is_torch(script: _Script, call: ast.Call, name: str) -> bool:
    return script.resolved(call.func) == f"torch.{name}"


def _save_load_rules(script: _Script, distributed: bool) -> Iterator[tuple]:
    for call in script.calls:
        if _is_torch(script, call, "save") and len(call.args) >= 2:
            if distributed and not _rank_guarded(script, call):
                path = _path_text(script, call.args[1]) or ""
                if not RANK_WORDS.search(ast.unparse(call.args[1])):  # a file per rank is fine
                    yield call.lineno, "save-every-rank", {"path": path}
            path, shown = _path_text(script, call.args[1]), ast.unparse(call.args[1])
            if path and path.startswith("/") and not path.startswith(CHECKPOINT_DIR + "/"):
                yield call.lineno, "snapshot-outside-volume", {"path": shown}
            elif path and not path.startswith(("/", "~")) and not path.startswith("{"):
                yield call.lineno, "relative-snapshot", {"path": shown}
        if (
            distributed
            and _is_torch(script, call, "load")
            and _keyword(call, "map_location") is None
            and len(call.args) < 2
        ):
            yield call.lineno, "load-no-map-location", {}


def _nccl_rule(script: _Script) -> Iterator[tuple]:
    if "nccl" not in script.strings:
        return
    for call in script.calls:
        if not (call.args and _last(call.func) in COLLECTIVES):
            continue
        if not script.resolved(call.func).startswith(("torch.distributed", "dist")):
            continue
        tensor = call.args[0]
        if not isinstance(tensor, ast.Name):
            continue
        value = script.assigned_value(tensor.id, call)
        if (
            isinstance(value, ast.Call)
            and script.resolved(value.func) in {f"torch.{f}" for f in TENSOR_FACTORIES}
            and _keyword(value, "device") is None
            and not _moved_later(script, tensor.id, value, call)
        ):
            yield call.lineno, "nccl-cpu-tensor", {"name": tensor.id}


def _moved_later(script: _Script, name: str, made: ast.AST, used: ast.AST) -> bool:
    """`x = x.cuda()` / `x = x.to(...)` / `x.cuda_()` between where x is made and used."""
    scope = script.function_of(used) or script.tree
    for node in ast.walk(scope):
        if (
            isinstance(node, ast.Call)
            and made.lineno < node.lineno <= used.lineno
            and _last(node.func) in ("cuda", "to")
            and _dotted(getattr(node.func, "value", None) or node) == name
        ):
            return True
    return False


def check_source(
    source: str, nodes: int = 1, program_args: list[str] | None = None
) -> list[Finding]:
    """Every pitfall in `source`, by line."""
    script = _Script(source)
    seen: set[tuple[int, str]] = set()
    findings = []
    for line, rule, details in _check(script, nodes, list(program_args or [])):
        if (line, rule) in seen:
            continue
        seen.add((line, rule))
        details.setdefault("nodes", nodes)
        pitfall = PITFALLS[rule].format(**{"name": "", "path": "", **details})
        findings.append(Finding(line, rule, pitfall, FIXES[rule]))
    return sorted(findings, key=lambda f: (f.line, f.rule))


def read_script(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ScriptCheckError(
            f"cannot read {path}: {exc}; give the path of a Python file"
        ) from None


def check_file(path: str, nodes: int = 1, program_args: list[str] | None = None) -> list[Finding]:
    source = read_script(path)
    try:
        return check_source(source, nodes, program_args)
    except SyntaxError as exc:
        raise ScriptCheckError(
            f"{path}:{exc.lineno}: not valid Python ({exc.msg}); fix the syntax error"
        ) from None


def spawns_workers(path: str) -> bool:
    """Whether the script at `path` starts its own workers; False when it cannot be read."""
    try:
        return spawns_workers_in(read_script(path))
    except (ScriptCheckError, SyntaxError, ValueError):
        return False


def warnings_for(path: str, nodes: str | int | None, program_args: list[str]) -> list[str]:
    """`train`/`render --script`: the findings as warning lines; none when the script is not
    on this machine (an image path) or cannot be parsed (running it says why)."""
    try:
        most = int(str(nodes or 1).rsplit(":", 1)[-1])
    except ValueError:
        most = 1
    if not os.path.isfile(path):
        return []
    try:
        return [f.shown(path) for f in check_file(path, max(most, 1), program_args)]
    except ScriptCheckError:
        return []
