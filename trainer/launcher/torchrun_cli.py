"""torchrun's command line as `kubeddp train` takes it, so `kubeddp train` can stand where
`torchrun` stood:

    torchrun      --nproc_per_node=2 --nnodes=1 train.py --epochs 3
    kubeddp train --nproc_per_node=2 --nnodes=1 train.py --epochs 3
    kubeddp train --standalone --nproc-per-node 2 -m mypkg.train --epochs 3

The first word that is not an option (or the word after -m) is the program; what follows it is
the program's, as written, and never goes through a parser of kubeddp's or torchrun's. Both
spellings of each flag (--node-rank, --node_rank) are accepted; argparse also takes an
unambiguous prefix (--nnode), as torchrun's parser does. Every other option of the installed
torchrun (--tee, --log-dir, --redirects, --local-ranks-filter, --rdzv-conf, --role...) is
accepted too, with its torchrun meaning: kubeddp passes it on to torchrun's agent.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
from collections.abc import Callable
from pathlib import Path

from kubeddp.trainer.launcher.user_input import rdzv_conf_problem

# torchrun's -m starts the program; kubeddp's own --module NAME stays an option among others.
MODULE_FLAGS = ("-m",)
# torchrun's -m/--module is a flag: before another option it says the program word is a module.
BARE_MODULE_FLAGS = ("-m", "--module")
RDZV_BACKENDS = ("c10d", "static")  # what kubeddp starts: static with --master-addr, else c10d


def spellings(name: str) -> list[str]:
    """`--node-rank` -> ["--node-rank", "--node_rank"] (torchrun documents both)."""
    underscored = name.replace("-", "_").replace("__", "--", 1)
    return [name] if underscored == name else [name, underscored]


def _action(parser: argparse.ArgumentParser, token: str) -> argparse.Action | None:
    """The action an option token selects: exact, `--opt=value`, or a unique prefix."""
    name = token.split("=", 1)[0]
    actions = {opt: action for action in parser._actions for opt in action.option_strings}
    if name in actions:
        return actions[name]
    matches = {actions[opt] for opt in actions if opt.startswith(name) and name.startswith("--")}
    return matches.pop() if len(matches) == 1 else None


def split_program(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[list[str], list[str], list[str]] | None:
    """torchrun's positional form -> (kubeddp's own options, ["--script", P] or ["--module", M],
    the program's arguments); None when argv has no program word (the `--` form applies)."""
    index, module = 0, False
    while index < len(argv):
        token = argv[index]
        if token == "--":
            return None
        following = argv[index + 1] if index + 1 < len(argv) else None
        if token in MODULE_FLAGS and following is not None and not following.startswith("-"):
            return argv[:index], ["--module", following], argv[index + 2 :]
        if token in BARE_MODULE_FLAGS and following is not None and following.startswith("-"):
            module = True  # torchrun's bare -m/--module: the program word names a module
            argv = argv[:index] + argv[index + 1 :]
            continue
        if token.startswith("-") and token != "-":
            action = _action(parser, token)
            takes_value = action is not None and action.nargs != 0
            index += 2 if takes_value and "=" not in token else 1
            continue
        return argv[:index], ["--module" if module else "--script", token], argv[index + 1 :]
    return None


def check_standalone(args: argparse.Namespace) -> str | None:
    """torchrun --standalone is one node with a local rendezvous: what contradicts it."""
    if not args.standalone:
        return None
    if args.nnodes not in (None, "1", "1:1"):
        return f"--standalone runs one node, but --nnodes is {args.nnodes}; drop one of them"
    if args.master_addr or args.rdzv_endpoint:
        return "--standalone picks its own local rendezvous; drop --master-addr/--rdzv-endpoint"
    return None


def check_rdzv_backend(args: argparse.Namespace) -> str | None:
    if args.rdzv_backend == "static" and args.rdzv_endpoint:
        return "--rdzv-backend static takes --master-addr/--master-port, not --rdzv-endpoint"
    if args.rdzv_backend == "c10d" and args.master_addr and not args.rdzv_endpoint:
        return (
            f"--rdzv-backend c10d needs --rdzv-endpoint HOST:PORT "
            f"(e.g. {args.master_addr}:29400), not --master-addr"
        )
    return None


# torchrun's options that kubeddp decides from the plan, or takes under its own names.
KUBEDDP_DECIDES = frozenset({
    "help", "nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id",
    "standalone", "max_restarts", "node_rank", "master_addr", "master_port", "module",
})  # fmt: skip
# Accepted with torchrun's meaning, done by kubeddp rather than passed on: --no-python (the
# runner executes the program itself) and --run-path (the runner always runs a script with
# runpy.run_path in the worker's interpreter; torchrun would run our runner that way).
DONE_HERE = frozenset({"no_python", "run_path"})
PREFIX = "torchrun_"  # their dest in kubeddp train's namespace


def torchrun_option_strings() -> list[str]:
    """The installed torchrun's option strings, read from its source without importing torch
    (1-2 s): for `kubeddp completion`, which a shell may run at every start. [] when the source
    is not where a torch install keeps it."""
    spec = importlib.util.find_spec("torch")  # a top-level package: nothing is imported
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    try:
        source = Path(locations[0], "distributed", "run.py").read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (IndexError, OSError, SyntaxError, ValueError):
        return []
    return [
        arg.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
        for arg in node.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value[:1] == "-"
    ]


@functools.cache
def torchrun_actions() -> list[argparse.Action]:
    """The installed torchrun's options that kubeddp train takes as they are (the set grows
    with torch: each version's flags are its parser's)."""
    from torch.distributed.run import get_args_parser

    return [
        action
        for action in get_args_parser()._actions
        if action.option_strings and action.dest not in KUBEDDP_DECIDES
    ]


def _std(text: str) -> object:
    from torch.distributed.elastic.multiprocessing import Std

    return Std.from_str(text)  # 0-3, or local_rank:value,...


def _ranks(text: str) -> set[int]:
    return set(map(int, text.split(",")))


def _rdzv_conf(text: str) -> str:
    problem = rdzv_conf_problem(text)
    if problem:
        raise ValueError(problem)
    return text


# Values torchrun reads only once its agent runs (a traceback then): checked as it reads them.
VALUE_CHECKS: dict[str, Callable[[str], object]] = {
    "tee": _std, "redirects": _std, "local_ranks_filter": _ranks, "rdzv_conf": _rdzv_conf,
}  # fmt: skip


def _checked_text(action: argparse.Action) -> Callable[[str], str]:
    """An argparse type that checks the value as torchrun would and keeps the text (it goes on
    to torchrun's own parser as written)."""
    convert = VALUE_CHECKS.get(action.dest) or (action.type if callable(action.type) else str)

    def parse(text: str) -> str:
        try:
            convert(text)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
        return text

    return parse


def add_torchrun_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """torchrun's other options, as torchrun has them (its help, choices and checks); the
    actions they mirror are returned for `passed_on`."""
    group = parser.add_argument_group(
        "torchrun's other options (the installed torch's; passed on with torchrun's meaning)"
    )
    actions = torchrun_actions()
    for action in actions:
        helptext = " ".join((action.help or "").split()).replace("%", "%%")  # torch's words
        options: dict = {"dest": PREFIX + action.dest, "help": helptext}
        if action.nargs == 0:
            options.update(action="store_true", default=False)
        else:
            metavar = action.metavar or action.dest.upper()
            options.update(default=None, type=_checked_text(action), metavar=metavar)
            options["choices"] = action.choices
        group.add_argument(*action.option_strings, **options)
    return actions


def passed_on(args: argparse.Namespace, actions: list[argparse.Action]) -> list[str]:
    """The torchrun flags given, as `--flag=value` words for torchrun's parser (one word each:
    a value can never be read as a flag of its own)."""
    flags = []
    for action in actions:
        value = getattr(args, PREFIX + action.dest, None)
        if action.dest in DONE_HERE or value in (None, False):
            continue
        name = max(action.option_strings, key=len)  # the long, dashed spelling
        flags.append(name if value is True else f"{name}={value}")
    return flags


def torchrun_option(args: argparse.Namespace, dest: str) -> bool:
    """Whether torchrun's flag `dest` (no_python, run_path...) was given."""
    return bool(getattr(args, PREFIX + dest, False))


def program_arguments(after_program: list[str]) -> list[str]:
    """What follows the program word, as the program gets it: a `--` right after it is the
    separator of kubeddp's other form (`train.py -- --x`), not the program's."""
    return after_program[1:] if after_program[:1] == ["--"] else after_program
