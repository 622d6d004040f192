"""Command-line parsing shared by every kubeddp command (launch, train, the worker, the CLI):
a bad option is one line and exit 2, and numbers are checked for range (nan and inf too)."""

from __future__ import annotations

import argparse
import math
import re
import typing
from collections.abc import Callable

from kubeddp.trainer.exit_codes import BAD_INPUT


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad options: one line naming the option and pointing to --help, exit 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(BAD_INPUT, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def number(
    kind: type, low: float, *, above: bool = False, high: float | None = None
) -> Callable[[str], float]:
    """An argparse type: a finite number >= low (> low when `above`), <= high when given. nan
    and inf are refused: a wait of nan seconds never ends."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        too_low = value < low or (above and value == low)
        if not math.isfinite(value) or too_low or (high is not None and value > high):
            bound = f"{'>' if above else '>='} {low:g}"
            if high is not None:
                bound += f" and <= {high:g}"
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number {bound}")
        return value

    return parse


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0}


def duration(low: float, *, above: bool = False) -> Callable[[str], float]:
    """An argparse type for seconds: a number (`90`) or Go-style units as kubectl and helm take
    them (`90s`, `10m`, `1h`, `1h30m`); the same range checks as `number`."""
    check = number(float, low, above=above)

    def parse(text: str) -> float:
        spec = text.strip()
        parts = _DURATION_PART.findall(spec)
        if parts and "".join(f"{amount}{unit}" for amount, unit in parts) == spec:
            return check(str(sum(float(amount) * _UNIT_SECONDS[unit] for amount, unit in parts)))
        try:
            return check(spec)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a duration; give seconds (90) or units (90s, 10m, 1h)"
            ) from None

    return parse
