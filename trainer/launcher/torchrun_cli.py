"""torchrun's command line as `kubeddp train` and `kubeddp launch` take it, so kubeddp can stand
where `torchrun` stood:

    torchrun      --nproc_per_node=2 --nnodes=1 train.py --epochs 3
    kubeddp train --nproc_per_node=2 --nnodes=1 train.py --epochs 3
    kubeddp train --nproc 2 --script train.py --epochs 3
    kubeddp train --standalone --nproc-per-node 2 -m mypkg.train --epochs 3

As with torchrun, the program ends kubeddp's options: everything after it (the first word that
is not an option, or `--script PATH` / `--module NAME` / `-m NAME`) is the program's, as written,
even a word that is also an option of kubeddp's (`train.py --nproc 1` gives the script
`--nproc 1`). A `--` right after the program is a separator, not the program's (as torchrun's
parser drops it). Without a program, what follows `--` is the built-in trainer's (--config,
--set). Both spellings of each flag (--node-rank, --node_rank) are accepted; argparse also takes
an unambiguous prefix (--nnode), as torchrun's parser does. torchrun's other options (--tee,
--log-dir, --numa-binding...: torchrun_flags.py) are accepted too, with their torchrun meaning:
kubeddp passes them on to torchrun's agent.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from kubeddp.trainer.launcher.torchrun_flags import BY_DEST, DONE_HERE, PASSED_ON, TorchrunFlag
from kubeddp.trainer.launcher.user_input import rdzv_conf_problem

# torchrun's -m/--module is a flag: before another option it says the program word is a module.
BARE_MODULE_FLAGS = ("-m", "--module")
PROGRAM_DESTS = ("script", "module")  # the options that name the program and end kubeddp's
RDZV_BACKENDS = ("c10d", "static")  # what kubeddp starts: static with --master-addr, else c10d
PREFIX = "torchrun_"  # the passed-on options' dest in the parsed namespace


def spellings(name: str) -> list[str]:
    """`--node-rank` -> ["--node-rank", "--node_rank"] (torchrun documents both)."""
    underscored = name.replace("-", "_").replace("__", "--", 1)
    return [name] if underscored == name else [name, underscored]


def _action(parser: argparse.ArgumentParser, token: str) -> argparse.Action | None:
    """The action an option token selects: exact, `--opt=value`, `-mVALUE`, or a unique prefix
    of a long option."""
    name = token.split("=", 1)[0]
    actions = {opt: action for action in parser._actions for opt in action.option_strings}
    if name in actions:
        return actions[name]
    if not token.startswith("--") and token[:2] in actions and actions[token[:2]].nargs != 0:
        return actions[token[:2]]  # -mpkg.train: a short option with its value attached
    matches = {actions[opt] for opt in actions if opt.startswith(name) and name.startswith("--")}
    return matches.pop() if len(matches) == 1 else None


def _value_attached(token: str) -> bool:
    """`--script=t.py` or `-mpkg`: the option's value is in the same word."""
    return "=" in token if token.startswith("--") else len(token) > 2


def _program_rest(rest: list[str]) -> list[str]:
    """The program's arguments: a `--` right after the program is the separator of kubeddp's
    `--script PATH -- ARGS` form (torchrun's parser drops it too), not the program's."""
    return rest[1:] if rest[:1] == ["--"] else rest


def split_command_line(
    parser: argparse.ArgumentParser, argv: list[str], positional_program: bool = True
) -> tuple[list[str], list[str]]:
    """(kubeddp's own words, with `--script P` or `--module M` when a program is named; the
    program's arguments, or without a program what follows `--`). `positional_program`: the
    first word that is not an option is the program (torchrun's form)."""
    index, module = 0, False
    while index < len(argv):
        token = argv[index]
        if token == "--":
            return argv[:index], argv[index + 1 :]
        following = argv[index + 1] if index + 1 < len(argv) else None
        if positional_program and token in BARE_MODULE_FLAGS and (following or "x")[:1] == "-":
            module = True  # torchrun's bare -m/--module: the program word names a module
            argv = argv[:index] + argv[index + 1 :]
            continue
        if token.startswith("-") and token != "-":
            action = _action(parser, token)
            takes_value = action is not None and action.nargs != 0
            end = index + (1 if not takes_value or _value_attached(token) else 2)
            if action is not None and action.dest in PROGRAM_DESTS and end <= len(argv):
                return argv[:end], _program_rest(argv[end:])
            index = end
            continue
        if not positional_program:
            index += 1
            continue
        program = ["--module" if module else "--script", token]
        return [*argv[:index], *program], _program_rest(argv[index + 1 :])
    return argv, []


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


def _std(text: str) -> object:
    # imported here, and only when --tee/--redirects is given: torch costs the help 2 s
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


def _checked_text(flag: TorchrunFlag) -> Callable[[str], str]:
    """An argparse type that checks the value as torchrun would and keeps the text (it goes on
    to torchrun's own parser as written)."""
    convert = VALUE_CHECKS.get(flag.dest, flag.kind)

    def parse(text: str) -> str:
        try:
            convert(text)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
        return text

    return parse


def add_torchrun_options(parser: argparse.ArgumentParser) -> None:
    """torchrun's other options (torchrun_flags.PASSED_ON), with torchrun's choices and checks."""
    group = parser.add_argument_group(
        "torchrun's other options (passed on to its agent with torchrun's meaning; "
        "`torchrun --help` says more)"
    )
    for flag in PASSED_ON:
        helptext = flag.help.replace("%", "%%")
        if flag.since > (2, 4):
            helptext += f" (torch {flag.since[0]}.{flag.since[1]}+)"
        options: dict = {"dest": PREFIX + flag.dest, "help": helptext}
        if not flag.takes_value:
            options.update(action="store_true", default=False)
        else:
            options.update(default=None, type=_checked_text(flag), choices=flag.choices)
            options["metavar"] = flag.metavar or (None if flag.choices else flag.dest.upper())
        group.add_argument(*flag.options, **options)


def given(args: argparse.Namespace) -> list[TorchrunFlag]:
    return [
        flag for flag in PASSED_ON if getattr(args, PREFIX + flag.dest, None) not in (None, False)
    ]


def passed_on(args: argparse.Namespace) -> list[str]:
    """The torchrun flags given, as `--flag=value` words for torchrun's parser (one word each:
    a value can never be read as a flag of its own)."""
    flags = []
    for flag in given(args):
        if flag.dest in DONE_HERE:
            continue
        value = getattr(args, PREFIX + flag.dest)
        flags.append(flag.name if value is True else f"{flag.name}={value}")
    return flags


def torchrun_option(args: argparse.Namespace, dest: str) -> bool:
    """Whether torchrun's flag `dest` (no_python, run_path...) was given."""
    return bool(getattr(args, PREFIX + dest, False))


def too_new(args: argparse.Namespace, torch_release: tuple[int, ...] | None) -> str | None:
    """The one line for a flag this torch's torchrun does not have yet; None when all are
    known to it (or its version cannot be read: torchrun then says)."""
    if torch_release is None:
        return None
    for flag in given(args):
        if BY_DEST[flag.dest].since > torch_release[:2]:
            wanted = ".".join(map(str, flag.since))
            installed = ".".join(map(str, torch_release))
            return (
                f"{flag.name} needs torch {wanted} or later (its torchrun added it), and torch "
                f"{installed} is installed; upgrade torch or drop {flag.name}"
            )
    return None
