"""Read a user's training script without running it (Python `ast`) and name its DDP pitfalls.

`kubeddp check` prints every finding; `kubeddp train/render --script` print the pitfalls as
warnings. A finding is a **pitfall** when the script, run by kubeddp, fails, hangs, or loses or
corrupts what it saved (check exits 1), and **advice** when it runs but not as its author meant
(the same data every epoch, every rank on the whole data set) or gives up less than it could
(no init timeout): shown, exit 0. The rules follow what kubeddp does for a script: it runs it
in checkpoint.dir in its pods (a relative snapshot lands on the checkpoint volume), and a
program's own rendezvous port or tcp:// address works on one node (its rank 0 serves it).
Heuristics stay on the side of silence: a rule fires only on a pattern it recognises, never on
code it cannot follow.
"""

from __future__ import annotations

import ast
import ipaddress
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlparse

from kubeddp.trainer.constants import CHECKPOINT_DIR
from kubeddp.trainer.script_check.local_rank import LOCAL_RANK_MACRO, local_rank_rule
from kubeddp.trainer.script_check.model import (
    ParsedScript,
    dotted,
    keyword,
    last,
    literal_text,
    shown,
    text,
    words,
)
from kubeddp.trainer.script_check.snapshots import path_text, snapshot_rule
from kubeddp.trainer.script_check.source import ScriptCheckError, parse, read_source
from kubeddp.trainer.script_check.spawn import INIT_CALLS, spawn_calls

__all__ = ["RULES", "Finding", "ScriptCheckError", "check_file", "check_source", "warnings_for"]

PITFALL, ADVICE = "pitfall", "advice"
COLLECTIVES = {
    "all_reduce", "broadcast", "all_gather", "reduce", "reduce_scatter", "all_to_all",
    "send", "recv", "isend", "irecv", "gather", "scatter",
}  # fmt: skip
TENSOR_FACTORIES = {"tensor", "zeros", "ones", "rand", "randn", "empty", "full", "arange"}
# A condition that names the rank: saving under it is saving on one rank (or one per node).
RANK_WORDS = re.compile(r"rank|gpu_id|is_main|main_process|is_master|is_primary|master_process")
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
# In a pod these are the pod's own (an emptyDir, memory): gone when it is recreated.
LOST_WITH_THE_POD = ("/tmp/", "/dev/shm/")


@dataclass(frozen=True)
class Rule:
    severity: str
    pitfall: str  # what is wrong, with {fields}
    fix: str


RULE_TABLE = {
    "spawn-several-nodes": Rule(
        PITFALL, "the program spawns its own workers but the job has {nodes} nodes",
        "a program that spawns its own workers trains one copy per node; convert it to "
        "torchrun style (docs/your-own-script.md: read LOCAL_RANK, call init_process_group() "
        "without rank/world_size, drop mp.spawn) or run one node"),
    "hardcoded-master": Rule(
        PITFALL, "MASTER_ADDR is set to {value}, which {why}",
        "delete it: torchrun and kubeddp set MASTER_ADDR for every worker (os.environ."
        "setdefault keeps theirs)"),
    "tcp-init": Rule(
        PITFALL, "init_process_group meets at the fixed address {value}, which {why}",
        "use init_method='env://' (the default): the launcher sets the address on every node"),
    "file-init": Rule(
        PITFALL, "init_process_group uses a file:// store",
        "use init_method='env://' (the default): a file:// store must be on a filesystem every "
        "node shares, and a retried pod finds the previous run's file there"),
    "local-rank-arg": Rule(
        PITFALL, "--local_rank is parsed and used, but the arguments do not pass "
        "${{local_rank}} (torchrun and kubeddp set LOCAL_RANK, not the flag)",
        f"pass --local_rank={LOCAL_RANK_MACRO} after -- (quoted in a shell), or default the "
        "flag to int(os.environ['LOCAL_RANK'])"),
    "save-every-rank": Rule(
        PITFALL, "torch.save of {value} runs on every rank: they write the same file at once",
        "save on one rank: put it under `if rank == 0:` (dist.get_rank())"),
    "snapshot-outside-volume": Rule(
        PITFALL, "a snapshot is saved to {value}, which is gone when the pod is recreated",
        f"save under {CHECKPOINT_DIR} (the checkpoint volume): only it outlives a retry"),
    "snapshot-in-place": Rule(
        PITFALL, "the snapshot the script resumes from is written in place ({value})",
        "write it to a temporary name and os.replace() that onto the snapshot: a kill during "
        "the save (a preemption whose grace ran out) leaves half a file, and every retry then "
        "fails to load it"),
    "nccl-cpu-tensor": Rule(
        PITFALL, "an NCCL collective on a CPU tensor ({value})",
        "create the tensor on the GPU (device=f'cuda:{local_rank}' or .cuda()): NCCL "
        "collectives take CUDA tensors only"),
    "fixed-master-port": Rule(
        ADVICE, "MASTER_PORT is fixed ({value})",
        "delete it: torchrun and kubeddp pick a free port (a fixed one may be taken on a shared "
        "host, by another run or job)"),
    "no-distributed-sampler": Rule(
        ADVICE, "a DataLoader of a DDP script has no DistributedSampler: every rank trains on "
        "the whole data set", "give the DataLoader sampler=DistributedSampler(dataset) (and "
        "shuffle=False)"),
    "no-set-epoch": Rule(
        ADVICE, "the DistributedSampler never gets set_epoch in a loop: every epoch has the "
        "same order", "call sampler.set_epoch(epoch) at the start of every epoch"),
    "load-no-map-location": Rule(
        ADVICE, "torch.load without map_location: every rank loads onto the GPU the tensors "
        "were saved from", "pass map_location (e.g. f'cuda:{local_rank}' or the device)"),
    "init-no-timeout": Rule(
        ADVICE, "init_process_group without a timeout",
        "pass timeout=datetime.timedelta(minutes=...): a lost peer then fails the job in that "
        "time instead of the backend's 10-30 min default"),
}  # fmt: skip
RULES = tuple(RULE_TABLE)


@dataclass(frozen=True)
class Finding:
    line: int
    rule: str
    pitfall: str
    fix: str
    severity: str = PITFALL

    def shown(self, path: str) -> str:
        return f"{path}:{self.line}: {self.severity} {self.rule}: {self.pitfall}; fix: {self.fix}"


def _loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _fixed_address_problem(host: str, nodes: int) -> str | None:
    """Why a literal rendezvous host in the script breaks the run (None: it works)."""
    if not _loopback(host):
        return "is no pod's address (a pod's changes when it is recreated)"
    if nodes > 1:
        return f"is each node's own address, not node 0's, on {nodes} nodes"
    return None


def _environ_assignments(script: ParsedScript, name: str) -> Iterator[tuple[int, str | None]]:
    """`os.environ[name] = value` (and os.environ.update/putenv): line and literal value."""
    for node in ast.walk(script.tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Subscript)
                    and script.resolved(target.value) == "os.environ"
                    and literal_text(target.slice) == name
                ):
                    yield node.lineno, literal_text(node.value)


def _master_rules(script: ParsedScript, nodes: int, spawns: bool) -> Iterator[tuple]:
    for line, value in _environ_assignments(script, "MASTER_ADDR"):
        why = _fixed_address_problem(value, nodes) if value is not None else None
        if why:
            yield line, "hardcoded-master", {"value": repr(value), "why": why}
    if not spawns:  # a program that spawns its own workers must name a port
        for line, value in _environ_assignments(script, "MASTER_PORT"):
            yield line, "fixed-master-port", {"value": value or "set by the script"}


def _init_rules(script: ParsedScript, nodes: int) -> Iterator[tuple]:
    for call in script.calls_to("init_process_group"):
        method = keyword(call, "init_method") or (call.args[1] if len(call.args) > 1 else None)
        literal = literal_text(method)
        if literal and literal.startswith("tcp://"):
            host = urlparse(literal).hostname or ""
            why = _fixed_address_problem(host, nodes)
            if why:
                yield call.lineno, "tcp-init", {"value": literal, "why": why}
        if (text(method) or "").startswith("file://"):
            yield call.lineno, "file-init", {}
        if keyword(call, "timeout") is None and not any(k.arg is None for k in call.keywords):
            yield call.lineno, "init-no-timeout", {}


def _check(script: ParsedScript, nodes: int, program_args: list[str]) -> Iterator[tuple]:
    distributed = bool(script.calls_to(*INIT_CALLS))
    spawning = spawn_calls(script)
    if spawning and nodes > 1:
        for call in spawning:
            yield call.lineno, "spawn-several-nodes", {}
    yield from _master_rules(script, nodes, bool(spawning))
    yield from _init_rules(script, nodes)
    yield from local_rank_rule(script, program_args)
    yield from _data_rules(script)
    yield from _save_load_rules(script, distributed)
    yield from _nccl_rule(script)


def _data_rules(script: ParsedScript) -> Iterator[tuple]:
    uses_ddp = bool(script.calls_to("DistributedDataParallel", "DDP"))
    samplers = script.calls_to("DistributedSampler")
    if uses_ddp and not samplers:
        for call in script.calls_to("DataLoader"):
            if keyword(call, "sampler") is None and keyword(call, "batch_sampler") is None:
                yield call.lineno, "no-distributed-sampler", {}
    shuffled = [
        c for c in samplers
        if not (isinstance(keyword(c, "shuffle"), ast.Constant)
                and keyword(c, "shuffle").value is False)  # type: ignore[union-attr]
    ]  # fmt: skip
    set_epoch = script.calls_to("set_epoch")
    if shuffled and not any(_runs_per_epoch(script, c) for c in set_epoch):
        yield shuffled[0].lineno, "no-set-epoch", {}


def _rank_guarded(script: ParsedScript, node: ast.AST, depth: int = 0) -> bool:
    """Whether `node` runs on one rank only: under an `if` on a rank, after an early return of
    the other ranks, or in a function that is only called that way."""
    for parent in script.ancestors(node):
        if isinstance(parent, ast.If) and RANK_WORDS.search(words(parent.test)):
            return True
    function = script.function_of(node)
    if function is None:
        return False
    for stmt in function.body:
        if stmt.lineno >= node.lineno:
            break
        if (
            isinstance(stmt, ast.If)
            and RANK_WORDS.search(words(stmt.test))
            and any(isinstance(s, ast.Return) for s in stmt.body)
        ):
            return True
    if _passed_as_argument(script, function.name):
        return False  # mp.spawn(main, ...), Process(target=run): every rank runs it
    callers = [c for c in script.calls if last(c.func) == function.name]
    if not callers or depth > 3:
        return not callers  # never called here: not this rule's business
    return all(_rank_guarded(script, caller, depth + 1) for caller in callers)


def _passed_as_argument(script: ParsedScript, name: str) -> bool:
    return any(
        last(arg) == name
        for call in script.calls
        for arg in [*call.args, *(k.value for k in call.keywords)]
    )


def _runs_per_epoch(script: ParsedScript, node: ast.AST, depth: int = 0) -> bool:
    """Whether `node` runs in a loop, or in a function that a loop calls."""
    if script.in_loop(node):
        return True
    function = script.function_of(node)
    if function is None or depth > 3:
        return False
    callers = [c for c in script.calls if last(c.func) == function.name]
    return any(_runs_per_epoch(script, caller, depth + 1) for caller in callers)


def _save_load_rules(script: ParsedScript, distributed: bool) -> Iterator[tuple]:
    yield from snapshot_rule(script, distributed)
    for call in script.calls:
        target = script.resolved(call.func)
        if target == "torch.save" and len(call.args) >= 2:
            path, where = path_text(script, call.args[1]), shown(call.args[1])
            one_file_per_rank = RANK_WORDS.search(words(call.args[1]))
            if distributed and not one_file_per_rank and not _rank_guarded(script, call):
                yield call.lineno, "save-every-rank", {"value": where}
            if path and path.startswith(LOST_WITH_THE_POD):
                yield call.lineno, "snapshot-outside-volume", {"value": where}
        if (
            distributed
            and target == "torch.load"
            and keyword(call, "map_location") is None
            and len(call.args) < 2
        ):
            yield call.lineno, "load-no-map-location", {}


def _nccl_rule(script: ParsedScript) -> Iterator[tuple]:
    if "nccl" not in script.strings:
        return
    for call in script.calls:
        if not (call.args and last(call.func) in COLLECTIVES):
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
            and keyword(value, "device") is None
            and not _moved_later(script, tensor.id, value, call)
        ):
            yield call.lineno, "nccl-cpu-tensor", {"value": tensor.id}


def _moved_later(script: ParsedScript, name: str, made: ast.AST, used: ast.AST) -> bool:
    """`x = x.cuda()` / `x = x.to(...)` / `x.cuda_()` between where x is made and used."""
    scope = script.function_of(used) or script.tree
    for node in ast.walk(scope):
        if (
            isinstance(node, ast.Call)
            and made.lineno < node.lineno <= used.lineno
            and last(node.func) in ("cuda", "to")
            and dotted(getattr(node.func, "value", None) or node) == name
        ):
            return True
    return False


def check_tree(
    tree: ast.Module, nodes: int = 1, program_args: list[str] | None = None
) -> list[Finding]:
    """Every finding in a parsed script, by line."""
    script = ParsedScript(tree)
    seen: set[tuple[int, str]] = set()
    findings = []
    for line, rule, details in _check(script, nodes, list(program_args or [])):
        if (line, rule) in seen:
            continue
        seen.add((line, rule))
        spec = RULE_TABLE[rule]
        pitfall = spec.pitfall.format(**{"nodes": nodes, "value": "", "why": "", **details})
        findings.append(Finding(line, rule, pitfall, spec.fix, spec.severity))
    return sorted(findings, key=lambda f: (f.line, f.rule))


def check_source(
    source: bytes | str, nodes: int = 1, program_args: list[str] | None = None
) -> list[Finding]:
    """Every finding in `source` (bytes are read as `python` reads a file), by line; a
    SyntaxError for what Python would refuse."""
    return check_tree(ast.parse(source), nodes, program_args)


def check_file(path: str, nodes: int = 1, program_args: list[str] | None = None) -> list[Finding]:
    """Every finding in the file at `path`; ScriptCheckError (one line) when it cannot be read
    or parsed."""
    return check_tree(parse(read_source(path), path), nodes, program_args)


def pitfalls(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == PITFALL]


def warnings_for(path: str, nodes: str | int | None, program_args: list[str]) -> list[str]:
    """`train`/`render --script`: the pitfalls as warning lines (advice is `kubeddp check`'s);
    none when the script is not on this machine (an image path) or cannot be parsed (running
    it says why)."""
    try:
        most = int(str(nodes or 1).rsplit(":", 1)[-1])
    except ValueError:
        most = 1
    if not os.path.isfile(path):
        return []
    try:
        return [f.shown(path) for f in pitfalls(check_file(path, max(most, 1), program_args))]
    except ScriptCheckError:
        return []
