"""torchrun's command line as `kubeddp train` takes it, so `kubeddp train` can stand where
`torchrun` stood:

    torchrun      --nproc_per_node=2 --nnodes=1 train.py --epochs 3
    kubeddp train --nproc_per_node=2 --nnodes=1 train.py --epochs 3
    kubeddp train --standalone --nproc-per-node 2 -m mypkg.train --epochs 3

The first word that is not an option (or the word after -m) is the program; what follows it is
the program's, as written. Both spellings of each flag (--node-rank, --node_rank) are accepted;
argparse also takes an unambiguous prefix (--nnode), as torchrun's parser does.
"""

from __future__ import annotations

import argparse

# torchrun's -m starts the program; kubeddp's own --module NAME stays an option among others.
MODULE_FLAGS = ("-m",)
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
    index = 0
    while index < len(argv):
        token = argv[index]
        if token == "--":
            return None
        if token in MODULE_FLAGS and index + 1 < len(argv):
            return argv[:index], ["--module", argv[index + 1]], argv[index + 2 :]
        if token.startswith("-") and token != "-":
            action = _action(parser, token)
            takes_value = action is not None and action.nargs != 0
            index += 2 if takes_value and "=" not in token else 1
            continue
        return argv[:index], ["--script", token], argv[index + 1 :]
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
