"""`--script PATH` / `--module NAME`: a user's own program instead of the built-in trainer.

Launch checks the program here, before torch is imported or a worker starts, so a typo is one
line and exit 2, not a traceback per worker. With a program, everything after it is the
program's own arguments (as with torchrun: torchrun_cli.split_command_line), and launch's
--config/--set configure launch only: the metrics endpoint and the SIGTERM grace. A --set that
only the built-in trainer reads is refused rather than silently ignored.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.machinery
import importlib.util
import os
import pkgutil
import shutil
import sys
from collections.abc import Callable

from kubeddp.trainer import constants, yaml_io
from kubeddp.trainer.config import ConfigError, parse_override
from kubeddp.trainer.constants import PROGRAM_CONFIG_KEYS
from kubeddp.trainer.worker.program import Program

LOCAL_RANK_MACRO = constants.LOCAL_RANK_MACRO


class ProgramError(ValueError):
    """The program named on the command line cannot run; one line with the fix."""


class ProgramNotHere(ProgramError):
    """The program is not on this machine (it may be in the image): a dry run only notes it."""


def add_program_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "your own program (instead of the built-in trainer): it ends kubeddp's options, and "
        "everything after it is the program's, as with torchrun"
    )
    group.add_argument(
        "--script",
        metavar="PATH",
        help="run this Python file on every worker, as `python PATH ARGS` under torchrun "
        "(torchrun's form, PATH ARGS with no option name, works too)",
    )
    group.add_argument(
        "-m",
        "--module",
        metavar="NAME",
        help="run this module on every worker, as `python -m NAME ARGS` under torchrun",
    )
    group.add_argument(
        "--spawns-workers",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the program starts its own workers (mp.spawn, mp.Process): run it once, on one "
        "node (default: detected in the script)",
    )


def applies_to_program(key: str) -> bool:
    """Whether config key `section.key` still means something with --script/--module."""
    return any(key == allowed or key.startswith(allowed + ".") for allowed in PROGRAM_CONFIG_KEYS)


def check_overrides(overrides: list[str], option: str) -> None:
    """Refuse a --set that only the built-in trainer reads."""
    for text in overrides:
        (section, key), _ = parse_override(text)
        if not applies_to_program(f"{section}.{key}"):
            raise ConfigError(
                f"--set {text} configures the built-in trainer, which {option} replaces; pass "
                "your program's own options after the program, or drop it (with a program only "
                f"{' and '.join(PROGRAM_CONFIG_KEYS)} apply)"
            )


# Written by kubeddp's own manifests into every job's config file (the claim's mount point):
# not the user's choice, so not refused with a program.
RENDERED_CONFIG_KEYS = ("checkpoint.dir",)


def check_config_file(path: str | None, option: str) -> None:
    """Refuse a config file key that only the built-in trainer reads, as --set is refused.
    A file that cannot be read is left to the config loader, which says why in one line."""
    if not path:
        return
    try:
        data = yaml_io.load_file(path, f"config file {path}")
    except (OSError, yaml_io.YamlInputError):
        return
    if not isinstance(data, dict):
        return
    for section, keys in data.items():
        names = [f"{section}.{key}" for key in keys] if isinstance(keys, dict) else [section]
        for name in names:
            if not applies_to_program(name) and name not in RENDERED_CONFIG_KEYS:
                raise ConfigError(
                    f"config file {path}: {name} configures the built-in trainer, which "
                    f"{option} replaces; pass your program's own options after the program, or "
                    f"drop it (with a program only {' and '.join(PROGRAM_CONFIG_KEYS)} apply)"
                )


def _check_script(path: str) -> None:
    if not os.path.exists(path):
        raise ProgramNotHere(
            f"--script {path}: no such file (from {os.getcwd()}); give the path of your "
            "training script"
        )
    if not os.path.isfile(path):
        raise ProgramError(
            f"--script {path}: not a file; give the path of a Python file (for a package, "
            "use --module NAME)"
        )


def _find_in(fullname: str, search: list[str]) -> importlib.machinery.ModuleSpec | None:
    """`fullname` in the directories `search`, as `import` would find it. PathFinder.find_spec
    is not used: for a namespace package (a directory without __init__.py, like many repos'
    `tests/`) it looks its parent up in sys.modules, where nothing was imported."""
    portions: list[str] = []
    for entry in search:
        finder = pkgutil.get_importer(entry)
        spec = finder.find_spec(fullname) if finder is not None else None
        if spec is None:
            continue
        if spec.loader is not None:
            return spec
        portions.extend(spec.submodule_search_locations or [])  # a namespace package's part
    if not portions:
        return None
    spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
    spec.submodule_search_locations = portions
    return spec


def _find_module(name: str) -> importlib.machinery.ModuleSpec:
    """The module's spec, found without importing anything: importlib.util.find_spec imports a
    dotted name's parents, which would run the user's code here (`train.py` imports `train`).
    Each part is looked up by the path finder in its parent package's directories; a top-level
    name may also be a built-in or frozen module."""
    parts = name.split(".")
    # The workers run `python -m`, which puts the working directory first on sys.path.
    search: list[str] | None = [os.getcwd(), *sys.path]
    spec = None
    for depth in range(len(parts)):
        if search is None:
            raise ProgramError(
                f"--module {name}: {'.'.join(parts[:depth])} is a module, not a package, so it "
                "has no submodules; give the module's own name"
            )
        fullname = ".".join(parts[: depth + 1])
        spec = _find_in(fullname, search)
        if spec is None and depth == 0 and name in sys.builtin_module_names:
            return importlib.util.find_spec(name)  # a top-level name: nothing is imported
        if spec is None:
            error = ProgramNotHere if depth == 0 else ProgramError
            raise error(
                f"--module {name}: cannot import it (ModuleNotFoundError: no module named "
                f"{fullname!r}); install it in the image, run from its parent directory, or "
                "put that directory on PYTHONPATH"
            )
        search = list(spec.submodule_search_locations or []) or None
    assert spec is not None
    return spec


def _check_module(name: str) -> None:
    if name.endswith(".py") or os.sep in name or (os.altsep and os.altsep in name):
        raise ProgramError(
            f"--module {name} is a file, not a module name; run a file with --script {name} "
            f"(or the module with --module {name.removesuffix('.py').replace(os.sep, '.')})"
        )
    if not name or not all(part.isidentifier() for part in name.split(".")):
        raise ProgramError(
            f"--module {name!r} is not a module name (dotted Python identifiers, as after "
            "`python -m`)"
        )
    locations = _find_module(name).submodule_search_locations
    if locations is not None:  # a package runs as `python -m` only through its __main__
        main = _find_in(f"{name}.__main__", list(locations))
        if main is None:
            raise ProgramError(
                f"--module {name} is a package without __main__.py, so `python -m {name}` "
                f"cannot run it; name the module to run (--module {name}.train) or add "
                f"{name}/__main__.py"
            )


def _check_executable(program: str) -> None:
    """torchrun --no-python runs the program as it is: a path, or a name found on PATH."""
    if os.sep not in program:
        if shutil.which(program) is None:
            raise ProgramNotHere(
                f"{program}: no such program on PATH; give its path, or install it in the image"
            )
        return
    _check_script(program)
    if not os.access(program, os.X_OK):
        raise ProgramError(
            f"--no-python {program}: not executable; chmod +x it, or drop --no-python to run "
            "a Python file"
        )


def program_from_options(
    script: str | None,
    module: str | None,
    program_args: list[str],
    note: Callable[[str], None] | None = None,
    no_python: bool = False,
) -> Program | None:
    """The user's program, checked; None when the built-in trainer runs. With `note` (a dry
    run, which previews a plan for an image from anywhere) a program that is not on this
    machine is only noted. `no_python` (torchrun's --no-python): the script is an executable,
    run as it is."""
    if script is not None and module is not None:
        raise ProgramError(
            f"--script {script} and --module {module} are both given; run one program"
        )
    if no_python and module is not None:
        raise ProgramError(
            f"--no-python runs a program as it is, not a module (-m {module}); drop one of them"
        )
    try:
        if script is not None:
            (_check_executable if no_python else _check_script)(script)
        elif module is not None:
            _check_module(module)
    except ProgramNotHere as exc:
        if note is None:
            raise
        note(f"note: {exc} (not on this machine: the plan assumes the image has it)")
    if script is not None:
        return Program("executable" if no_python else "script", script, tuple(program_args))
    if module is not None:
        return Program("module", module, tuple(program_args))
    return None


def program_fingerprint(program: Program) -> str:
    """The program as a finished run names it: its command line and the sha256 of the file that
    runs (the script, the executable, the module's or package's __main__ file), so an edited
    program with the same path and arguments is another run. Files it imports are not read."""
    path: str | None = program.target
    if program.mode == "executable" and os.sep not in program.target:
        path = shutil.which(program.target)
    elif program.mode == "module":
        try:
            spec = _find_module(program.target)
            if spec.submodule_search_locations is not None:
                spec = _find_in(f"{program.target}.__main__", list(spec.submodule_search_locations))
            path = spec.origin if spec is not None else None
        except (ProgramError, ImportError, ValueError):
            path = None
    return f"{program.command_line()} (sha256 {_file_sha256(path) if path else 'unreadable'})"


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return "unreadable"
    return digest.hexdigest()


def program_spawns_workers(program: Program, flag: bool | None) -> bool:
    """Whether the program starts its own workers: the flag, else what the script shows."""
    if flag is not None:
        return flag
    if program.mode != "script":
        return False  # a module is not read: --spawns-workers says so
    # the script reader (4 modules), only for a script: `kubeddp train --help` imports this module
    from kubeddp.trainer.script_check.spawn import spawns_workers

    return spawns_workers(program.target)


def script_spawn_refusal(script: str, nodes: str | int | None, flag: bool | None) -> str | None:
    """`kubeddp render/submit --script`: launch's refusal, said before the job exists, when the
    program starts its own workers on several nodes (`flag`: --spawns-workers/--no-...; else
    read from the script when it is on this machine; an image path is left to the pod)."""
    program = Program("script", script)
    if flag is None and not os.path.isfile(script):
        return None
    return (
        spawn_refusal(program, str(nodes or 1)) if program_spawns_workers(program, flag) else None
    )


def spawn_refusal(program: Program, nnodes: str) -> str | None:
    """Why a program that spawns its own workers cannot run on these nodes (None: it can):
    launch's, render's and submit's one line."""
    if nnodes.rsplit(":", 1)[-1].strip() == "1":
        return None
    return (
        f"{program.shown} starts its own workers (mp.spawn/mp.Process), so every one of the "
        f"{nnodes} nodes would train its own copy; convert it to torchrun style (read "
        "LOCAL_RANK, init_process_group() without rank/world_size, no mp.spawn: "
        "docs/your-own-script.md) or run it on one node"
    )


def torchrun_worker_args(program: Program) -> list[str]:
    """The runner's arguments as torchrun must be given them.

    torchrun runs every worker argument through string.Template (to replace ${local_rank}),
    which also turns `$$` into `$` and replaces `$local_rank`: escape every other `$`, so the
    program receives its arguments exactly as written, with only ${local_rank} replaced.
    """
    return [_escape_dollars(arg) for arg in program.runner_args()]


def _escape_dollars(arg: str) -> str:
    return LOCAL_RANK_MACRO.join(part.replace("$", "$$") for part in arg.split(LOCAL_RANK_MACRO))
