"""`render`/`submit` options given as Python keywords (kubeddp.client): the same options as
`kubeddp render --help` lists, named as in Python (`--gpus-per-node` -> `gpus_per_node`), read
into what the command line's parser makes of them, so the same code checks and uses both.

Values: what the option takes on the command line, or its Python form: a dict for K=V options
(`env={"A": "1"}`) and for YAML mappings (`resources={...}`), a list for repeatable options and
YAML lists, `set={"train.epochs": 3}` for `--set`, True/False for a switch, a duration such as
"10m" or a number of seconds where a time is asked.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from kubeddp.tools.manifests.chart.render_options import (
    SPELLED,
    dest,
    takes_seconds,
    whole_seconds,
)
from kubeddp.tools.manifests.chart.value_types import Flag, OptionError
from kubeddp.tools.manifests.chart.values import FLAGS
from kubeddp.tools.manifests.kinds import KINDS

OPTIONS = {dest(flag): flag for flag, _ in FLAGS if flag.read not in ("kind", "program-args")}
# Keywords of options since renamed to torchrun's names (`--nodes` is `--nnodes`): still taken.
ALIASES = {"nodes": "nnodes"}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _read(flag: Flag, value: Any) -> Any:
    """The option's value as the parser would hold it; TypeError for a value of a wrong type."""
    read = flag.read
    if read == "int":
        if isinstance(value, str) and takes_seconds(flag):
            try:
                return whole_seconds(value)
            except argparse.ArgumentTypeError as exc:
                raise TypeError(str(exc)) from None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise TypeError(f"{value!r} is not an integer")
    if read == "switch":
        if isinstance(value, bool):
            return value
        raise TypeError(f"{value!r} is not True or False")
    if read in ("text", "config-file"):
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise TypeError(f"{value!r} is not text")
    if read in ("yaml-list", "yaml-map"):
        return _text(value)  # JSON is YAML: parsed and checked as the option's text is
    if read in ("pairs", "config-set") and isinstance(value, dict):
        return [f"{key}={_text(item)}" for key, item in value.items()]
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return list(value)
    raise TypeError(f"{value!r} is not a list of text")


def render_args(
    kind: str | None, options: dict[str, Any], program_args: list[str] | None = None
) -> argparse.Namespace:
    """The namespace `kubeddp render KIND --option ...` parses to; OptionError for an option
    that does not exist or a value it cannot take."""
    if kind is not None and kind not in KINDS:
        raise OptionError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    args = argparse.Namespace(kind=kind, program_args=program_args)
    for name in OPTIONS:
        setattr(args, name, None)
    twice = [alias for alias, name in ALIASES.items() if alias in options and name in options]
    if twice:
        raise OptionError(f"{twice[0]} and {ALIASES[twice[0]]} are one option; give one of them")
    for given, value in options.items():
        name = ALIASES.get(given, given)
        if given in ALIASES:  # errors name the option as given: --nodes
            setattr(args, SPELLED, {**getattr(args, SPELLED, {}), name: "--" + given})
        flag = OPTIONS.get(name)
        if flag is None:
            raise OptionError(
                f"{given!r} is not a render option; the options are those of kubeddp render "
                "--help, named with _ (e.g. gpus_per_node)"
            )
        if value is None:
            continue
        try:
            setattr(args, name, _read(flag, value))
        except TypeError as exc:
            raise OptionError(f"{name} ({flag.name}): {exc}") from None
    if program_args is not None and not all(isinstance(a, str) for a in program_args):
        raise OptionError("program_args: give the program's arguments as a list of text")
    return args
