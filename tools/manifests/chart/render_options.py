"""The `kubeddp render` options, made from the chart's value definitions, and their values.

`add_render_options` adds one option per `Flag` of tools/manifests/chart/values.py;
`values_from_args` turns what the user gave into chart values (only those: the chart's defaults do
the rest) and records which option set each value, so an error names the option.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

from kubeddp.tools.manifests.chart.kind_notes import flag_help
from kubeddp.tools.manifests.chart.value_types import Flag, OptionError, Value
from kubeddp.tools.manifests.chart.values import (
    DEFAULT_JOB_NAME,
    FLAGS,
    GROUPS,
    MANAGED_BY,
    flag_sets,
)
from kubeddp.tools.manifests.kinds import KINDS
from kubeddp.trainer import yaml_io
from kubeddp.trainer.arguments import duration
from kubeddp.trainer.config import ConfigError, config_from_dict, parse_override

APPENDED = ("pairs", "list", "config-set")
Provenance = dict[str, str]  # value path -> the option that set it


def dest(flag: Flag) -> str:
    return flag.name.lstrip("-").replace("-", "_").lower()


def whole_seconds(text: str) -> int:
    """An argparse type for a time in whole seconds: `90`, `90s`, `10m`, `1h30m`."""
    seconds = duration(0)(text)
    if seconds != int(seconds):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds")
    return int(seconds)


def takes_seconds(flag: Flag) -> bool:
    """An integer option that is a time (--ttl-seconds-after-finished): durations too."""
    return flag.read == "int" and "seconds" in flag.name


def _help(flag: Flag, value: Value) -> str:
    text = flag_help(flag, value)
    if not flag.sets and flag.read in ("text", "int") and value.default not in (None, ""):
        text += f" (default {value.default})"
    return text.replace("%", "%%")


SPELLED = "spelled"  # the namespace's map: dest -> the spelling given of an option with aliases


class _SpelledStore(argparse._StoreAction):
    """Stores the value and which spelling was given (`--nodes` for `--nnodes`): an error
    names the option as the user wrote it."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001
        super().__call__(parser, namespace, values, option_string)
        spelled = dict(getattr(namespace, SPELLED, None) or {})
        spelled[self.dest] = option_string
        setattr(namespace, SPELLED, spelled)


def add_render_options(parser: argparse.ArgumentParser) -> None:
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    for flag, value in FLAGS:
        if flag.read == "program-args":
            continue  # cli.py takes what follows `--` off the command line
        if flag.read == "kind":
            parser.add_argument(
                "kind",
                choices=list(KINDS),
                nargs="?",  # not given: render's offline kind, submit's discovered one
                help=_help(flag, value),
            )
            continue
        options: dict[str, Any] = {"dest": dest(flag), "help": _help(flag, value), "default": None}
        if flag.metavar:
            options["metavar"] = flag.metavar
        elif "enum" in value.schema and not flag.sets:  # show the choices; the schema checks
            options["metavar"] = "{" + ",".join(c for c in value.schema["enum"] if c) + "}"
        if flag.read == "int":
            options["type"] = whole_seconds if takes_seconds(flag) else int
        elif flag.read == "switch":
            options["action"] = argparse.BooleanOptionalAction
        elif flag.read in APPENDED:
            options["action"] = "append"
        elif sum(option.startswith("--") for option in flag.options) > 1:
            options["action"] = _SpelledStore
        groups[value.group].add_argument(*flag.options, **options)


# --- reading option values ------------------------------------------------------------------


def parse_pairs(option: str, items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise OptionError(f"{option}: {item!r} is not K=V; write e.g. {option} KEY=value")
        out[key] = value
    return out


def _is_file(text: str) -> bool:
    try:
        return Path(text).is_file()
    except (OSError, ValueError):  # longer than a file name can be, or a NUL byte
        return False


def parse_yaml_option(option: str, text: str, want: type) -> Any:
    """A YAML/JSON value given inline or as a path to a file."""
    try:
        if _is_file(text):
            value = yaml_io.load_file(text, f"{option} file {text}")
        else:
            value = yaml_io.load_one(text, f"{option} {text[:80]!r}")
    except OSError as exc:
        raise OptionError(f"{option}: cannot read {text} ({exc.strerror or exc})") from None
    except yaml_io.YamlInputError as exc:
        if exc.syntax and not _is_file(text):
            raise OptionError(
                f"{option}: {text[:80]!r} is neither a file nor valid YAML/JSON; "
                "pass a file path or an inline value"
            ) from None
        raise OptionError(str(exc)) from None
    if not isinstance(value, want):
        raise OptionError(
            f"{option}: must be a YAML {want.__name__}, got "
            f"{type(value).__name__}; see `kubectl explain pod.spec`"
        )
    return json.loads(json.dumps(value))  # plain types only


def read_trainer_config(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = yaml_io.load_file(path, f"--config: {path}")
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise OptionError(f"--config: cannot read {path} ({why}); check the path") from None
    except yaml_io.YamlInputError as exc:
        raise OptionError(str(exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise OptionError(f"--config: {path} must hold a mapping of sections (workload, train...)")
    return json.loads(json.dumps(data))  # plain types only


def trainer_config(path: str | None, overrides: list[str]) -> tuple[dict[str, Any], Provenance]:
    """--config FILE, then --set section.key=value on top: the keys given, typed and checked
    by the trainer's own config rules (so `3e-4` becomes a number, as the trainer reads it)."""
    data = read_trainer_config(path)
    provenance: Provenance = {"config": "--config"} if path else {}
    for text in overrides:
        try:
            (section, key), value = parse_override(text)
        except ConfigError as exc:
            raise OptionError(f"--set: {exc}; use --set section.key=value") from None
        if data.get(section) is None:
            data[section] = {}
        if not isinstance(data[section], dict):
            raise OptionError(f"--config: config key '{section}' must be a mapping")
        data[section][key] = value
        provenance[f"config.{section}.{key}"] = "--set"
    try:
        config = config_from_dict(copy.deepcopy(data))
    except ConfigError as exc:
        option = "--set" if overrides else "--config"
        raise OptionError(
            f"{option}: {exc}; fix the trainer config (see `kubeddp train --help`)"
        ) from None
    typed = {
        section: {key: getattr(getattr(config, section), key) for key in keys or {}}
        for section, keys in data.items()
    }
    return typed, provenance


def _read(flag: Flag, given: Any) -> Any:
    if flag.read == "pairs":
        return parse_pairs(flag.name, given)
    if flag.read == "yaml-list":
        return parse_yaml_option(flag.name, given, list)
    if flag.read == "yaml-map":
        return parse_yaml_option(flag.name, given, dict)
    if flag.read == "kind":
        return KINDS[given].chart_kind
    return given


def set_path(values: dict[str, Any], path: str, value: Any) -> None:
    """Set a value; a list adds to what another option already put there (--volume and
    --volumes both fill `volumes`)."""
    *parents, key = path.split(".")
    node = values
    for part in parents:
        node = node.setdefault(part, {})
    if isinstance(node.get(key), list) and isinstance(value, list):
        value = node[key] + value
    node[key] = value


def values_from_args(args: argparse.Namespace) -> tuple[dict[str, Any], Provenance]:
    """The chart values the given options stand for, and which option set each one."""
    values: dict[str, Any] = {}
    provenance: Provenance = {}
    spelled = getattr(args, SPELLED, None) or {}
    for flag, value in FLAGS:
        given = getattr(args, "program_args" if flag.read == "program-args" else dest(flag), None)
        if given is None or flag.read.startswith("config-"):
            continue
        option = spelled.get(dest(flag), flag.name)
        parsed = _read(flag, given)
        try:
            assigned = flag.convert(parsed) if flag.convert else {flag_sets(flag, value)[0]: parsed}
        except OptionError as exc:  # it names the option by its name: say the one given
            raise OptionError(str(exc).replace(flag.name, option, 1)) from None
        for path, item in assigned.items():
            set_path(values, path, item)
            provenance[path] = option
    if args.config is not None or args.set:
        config, config_provenance = trainer_config(args.config, args.set or [])
        values["config"] = config
        provenance.update(config_provenance)
    values.setdefault("fullnameOverride", DEFAULT_JOB_NAME)
    values["managedBy"] = MANAGED_BY[1]  # plain manifests: no Helm labels
    return values, provenance
