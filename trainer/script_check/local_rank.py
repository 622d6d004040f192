"""The `--local_rank` / `--local-rank` argument of the `torch.distributed.launch` era.

torchrun (and kubeddp) set LOCAL_RANK in the environment and pass no such argument, so a script
that reads the parsed flag gets None (or stops, when the flag is required) on every rank,
unless the value falls back to the environment's LOCAL_RANK. Only a read of LOCAL_RANK that
can reach the value counts as that fallback (the flag's default, the parsed attribute or the
variable it goes to assigned from it, an `or`/`if-else` around the flag); any other mention of
LOCAL_RANK (a print, a condition, an export of the flag's value into the environment) does not.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from kubeddp.trainer import constants
from kubeddp.trainer.script_check.model import ParsedScript, dotted, keyword, last, literal_text

LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")
LOCAL_RANK_MACRO = constants.LOCAL_RANK_MACRO
COVERING = (ast.BoolOp, ast.IfExp)  # `args.local_rank or env`, `args.local_rank if ... else env`


def _env_read(call: ast.Call) -> bool:
    """`<...>.environ.get(...)` or `<...>getenv(...)` (os imported under any name)."""
    func = call.func
    environ_get = isinstance(func, ast.Attribute) and func.attr == "get" and last(func.value)
    return environ_get == "environ" or last(func) == "getenv"


def reads_local_rank_env(node: ast.AST) -> bool:
    """Whether `node` reads LOCAL_RANK from the environment: os.environ["LOCAL_RANK"],
    os.environ.get("LOCAL_RANK", ...), os.getenv("LOCAL_RANK", ...)."""
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Subscript)
            and isinstance(sub.ctx, ast.Load)
            and last(sub.value) == "environ"
            and literal_text(sub.slice) == "LOCAL_RANK"
        ):
            return True
        if (
            isinstance(sub, ast.Call)
            and sub.args
            and literal_text(sub.args[0]) == "LOCAL_RANK"
            and _env_read(sub)
        ):
            return True
    return False


def _parsed_arguments(script: ParsedScript) -> set[str]:
    """Names bound to a parser's result: `args = parser.parse_args()`, `args, _ =
    parser.parse_known_args()`."""
    found = set()
    for node in ast.walk(script.tree):
        if not isinstance(node, ast.Assign):
            continue
        value = node.value.value if isinstance(node.value, ast.Subscript) else node.value
        if isinstance(value, ast.Call) and last(value.func) in ("parse_args", "parse_known_args"):
            for target in node.targets:
                first = target.elts[0] if isinstance(target, ast.Tuple) and target.elts else target
                if isinstance(first, ast.Name):
                    found.add(first.id)
    return found


def _flag_dest(call: ast.Call) -> str:
    """The attribute argparse stores the flag under: dest=, else local_rank."""
    return literal_text(keyword(call, "dest")) or "local_rank"


def _statement(script: ParsedScript, node: ast.AST) -> ast.AST:
    for parent in script.ancestors(node):
        if isinstance(parent, ast.stmt):
            return parent
    return node


def _covered(script: ParsedScript, use: ast.Attribute) -> bool:
    """A read of the flag inside an expression that falls back to LOCAL_RANK: an `or`, an
    if-else, or the default of the environment read itself."""
    for parent in script.ancestors(use):
        if isinstance(parent, ast.stmt):
            return False
        if isinstance(parent, COVERING) and reads_local_rank_env(parent):
            return True
        if isinstance(parent, ast.Call) and _env_read(parent):
            return reads_local_rank_env(parent)
    return False


def _names_assigned_from_env(script: ParsedScript) -> set[str]:
    """Variables the script assigns from LOCAL_RANK somewhere (`local_rank = int(os.environ[
    "LOCAL_RANK"])`): the flag's value put in one of them has that fallback."""
    return {
        dotted(target)
        for node in ast.walk(script.tree)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
        and reads_local_rank_env(node.value)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if dotted(target)
    }  # fmt: skip


def _uses(script: ParsedScript, dest: str) -> tuple[list[ast.Attribute], bool]:
    """Where the script reads the parsed flag, and whether the value falls back to LOCAL_RANK."""
    parsed = _parsed_arguments(script)
    from_env = _names_assigned_from_env(script)
    uses, falls_back = [], False
    for node in ast.walk(script.tree):
        if not (isinstance(node, ast.Attribute) and node.attr == dest):
            continue
        owner = dotted(node.value)
        if owner == "self" or (parsed and owner not in parsed):
            continue
        if isinstance(node.ctx, ast.Store):  # args.local_rank = int(os.environ["LOCAL_RANK"])
            falls_back |= f"{owner}.{dest}" in from_env
            continue
        uses.append(node)
        statement = _statement(script, node)
        into = statement.targets if isinstance(statement, ast.Assign) else []
        falls_back |= _covered(script, node) or any(dotted(t) in from_env for t in into)
    return uses, falls_back


def local_rank_rule(script: ParsedScript, program_args: list[str]) -> Iterator[tuple]:
    """`local-rank-arg` where the script parses the flag and reads it without a fallback to
    LOCAL_RANK (or requires it), and the program's arguments do not pass ${local_rank}."""
    if any(LOCAL_RANK_MACRO in arg for arg in program_args):
        return
    for call in script.calls_to("add_argument"):
        if not any(literal_text(a) in LOCAL_RANK_FLAGS for a in call.args):
            continue
        default = keyword(call, "default")
        if default is not None and reads_local_rank_env(default):
            continue  # default=int(os.environ["LOCAL_RANK"]): the flag is optional
        required = keyword(call, "required")
        uses, falls_back = _uses(script, _flag_dest(call))
        if (isinstance(required, ast.Constant) and required.value) or (uses and not falls_back):
            yield call.lineno, "local-rank-arg", {}
