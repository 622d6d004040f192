"""Every argument of the Python API (kubeddp.client) checked against its annotation before the
call does anything: a notebook widget or an environment variable hands a method the text
"false" or "0", and `delete(name, delete_pvc="false")` must not read that as true. So a bool is
True or False and nothing else (not 1, not "no"), an int is not a bool, text is text; a wrong
type is one KubeddpError line (exit code 2, as the command line's parser would end).

One check for every method, derived from the signatures that document them, so a new option
is checked without a line of its own (tests/unit/test_client_api.py sets every parameter of
every method to a value of the wrong type).
"""

from __future__ import annotations

import functools
import inspect
import os
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from kubeddp.tools.cli.client_errors import KubeddpError
from kubeddp.trainer import exit_codes

F = TypeVar("F", bound=Callable[..., Any])


def _name(hint: Any) -> str:
    if hint is type(None):
        return "None"
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_name(h) for h in typing.get_args(hint))
    if hint is bool:
        return "True or False"
    origin = typing.get_origin(hint)
    if origin is not None:
        return getattr(origin, "__name__", str(origin))
    return getattr(hint, "__name__", str(hint))


def fits(value: Any, hint: Any) -> bool:
    """Whether `value` is of the annotated type, strictly: bool only for bool, int not bool."""
    if hint is Any or isinstance(hint, TypeVar):
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, h) for h in typing.get_args(hint))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:  # a number of seconds: an int is fine, a bool is not
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple):
        (item, *_) = typing.get_args(hint) or (Any,)
        return isinstance(value, (list, tuple)) and all(fits(v, item) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if origin is not None and callable(value) and origin.__name__ == "Callable":
        return True
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # an annotation this check does not know: left to the method


def refusal(command: str, what: str, value: Any, hint: Any) -> KubeddpError:
    shown = repr(value) if len(repr(value)) <= 80 else f"{repr(value)[:77]}..."
    switch = hint is bool or (
        typing.get_origin(hint) in (typing.Union, types.UnionType) and bool in typing.get_args(hint)
    )
    return KubeddpError(
        f"{what}={shown} is a {type(value).__name__}, not {_name(hint)}"
        + ("; a switch takes True or False only, never text or a number" if switch else ""),
        exit_codes.BAD_INPUT,
        command,
    )


def checked_arguments(command: str) -> Callable[[F], F]:
    """The method's arguments checked against its annotations (keyword options that render
    takes, `**options`, are checked by render_call against the option's own type)."""

    def wrap(method: F) -> F:
        signature = inspect.signature(method)
        hints = typing.get_type_hints(method)

        @functools.wraps(method)
        def checked(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            for name, value in bound.arguments.items():
                parameter = signature.parameters[name]
                hint = hints.get(name)
                if name == "self" or hint is None or parameter.kind is parameter.VAR_KEYWORD:
                    continue
                values = value if parameter.kind is parameter.VAR_POSITIONAL else (value,)
                for one in values:
                    if isinstance(one, os.PathLike) and fits("", hint):
                        continue  # a path where a file name is asked
                    if not fits(one, hint):
                        raise refusal(command, name, one, hint)
            return method(*args, **kwargs)

        return typing.cast(F, checked)

    return wrap
