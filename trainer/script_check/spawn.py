"""Whether a program starts its own DDP workers (mp.spawn, mp.Process, as most tutorials begin),
read from its source without running it. launch runs such a program once per node, and
`kubeddp render/submit`, launch and `kubeddp check` refuse it on several nodes
(program_options.spawn_refusal): one decision.

A process start counts when it is multiprocessing's (torch's or the standard library's, under
any alias: `from torch.multiprocessing import spawn as s`, `getattr(mp, "spawn")`,
`mp.get_context("spawn").Process`, `ctx.Process`, `multiprocessing.Process as P`, a class of
the script's own derived from Process) and what it starts reaches init_process_group (or
init_device_mesh) through the script's own functions; a start whose code the script does not
show (an imported function) counts too. A process for something else (a data-prep worker
that never joins a process group) does not.
"""

from __future__ import annotations

import ast

from kubeddp.trainer.script_check.model import ParsedScript, keyword, last
from kubeddp.trainer.script_check.source import ScriptCheckError, parse, read_source

MULTIPROCESSING = ("multiprocessing", "torch.multiprocessing")
# What starts processes, and where its code is given: (keyword, position).
STARTERS = {"spawn": ("fn", 0), "start_processes": ("fn", 0), "Process": ("target", 1)}
INIT_CALLS = ("init_process_group", "init_device_mesh")


def _from_multiprocessing(name: str) -> bool:
    module, _, starter = name.rpartition(".")
    in_module = module in MULTIPROCESSING or module.startswith(
        tuple(f"{m}." for m in MULTIPROCESSING)
    )
    return in_module and starter in STARTERS


def _own_process_class(script: ParsedScript, call: ast.Call) -> ast.ClassDef | None:
    """The script's class that `call` makes, when it derives from a multiprocessing Process."""
    cls = script.classes.get(last(call.func))
    if cls is None or not any(_from_multiprocessing(script.resolved(b)) for b in cls.bases):
        return None
    return cls


def _started_code(script: ParsedScript, call: ast.Call, starter: str) -> ast.AST | None:
    """The code the started process runs, when the script shows it (a function of its own, a
    functools.partial of one, a lambda); None when it does not."""
    name, position = STARTERS[starter]
    code = keyword(call, name)
    if code is None and len(call.args) > position:
        code = call.args[position]
    if isinstance(code, ast.Call) and last(code.func) == "partial" and code.args:
        code = code.args[0]
    if isinstance(code, ast.Lambda):
        return code.body
    return script.functions.get(code.id) if isinstance(code, ast.Name) else None


def spawn_calls(script: ParsedScript) -> list[ast.Call]:
    """The calls that start the program's own DDP workers (empty for a torchrun-style one)."""
    if not script.calls_to(*INIT_CALLS):
        return []
    found = []
    for call in script.calls:
        own_class = _own_process_class(script, call)
        target = script.resolved(call.func)
        if own_class is not None:
            code: ast.AST | None = own_class
        elif _from_multiprocessing(target):
            code = _started_code(script, call, target.rpartition(".")[2])
        else:
            continue
        if code is None or script.reaches(code, INIT_CALLS):
            found.append(call)
    return found


def spawns_workers_in(source: bytes | str, path: str = "<script>") -> bool:
    """Whether a DDP program starts its own workers; ScriptCheckError when it cannot be read."""
    return bool(spawn_calls(ParsedScript(parse(source, path))))


def spawns_workers(path: str) -> bool:
    """Whether the script at `path` starts its own workers; False when it cannot be read (the
    program then runs as torchrun would run it, and says itself what is wrong)."""
    try:
        return spawns_workers_in(read_source(path), path)
    except ScriptCheckError:
        return False
