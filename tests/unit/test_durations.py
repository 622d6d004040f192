"""Durations on the command line: seconds or kubectl/helm-style units."""

from __future__ import annotations

import argparse

import pytest

from kubeddp.tools.cli.main import parse_command
from kubeddp.trainer.arguments import duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("2.5", 2.5), ("90s", 90.0), ("10m", 600.0), ("1h", 3600.0),
     ("1h30m", 5400.0), ("1.5m", 90.0), ("0s", 0.0)],
)  # fmt: skip
def test_duration_accepts_seconds_and_units(text: str, seconds: float) -> None:
    assert duration(0)(text) == seconds


@pytest.mark.parametrize("text", ["10x", "m", "", "1h 30m", "-5m", "nan", "inf", "10mm"])
def test_duration_refuses_with_the_forms_it_takes(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        duration(0)(text)


def test_zero_interval_is_refused() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="> 0"):
        duration(0, above=True)("0s")


def test_wait_takes_minutes() -> None:
    args = parse_command(["wait", "demo", "--timeout", "10m", "--interval", "30s"])
    assert (args.timeout, args.interval) == (600.0, 30.0)


def test_every_time_of_the_cluster_commands_takes_a_duration() -> None:
    for command in ("status", "logs", "wait", "delete", "diagnose"):
        args = parse_command([command, "demo", "--request-timeout", "30s"])
        assert args.request_timeout == 30.0
    args = parse_command(["render", "pytorchjob", "--request-timeout", "2m"])
    assert args.request_timeout == 120.0


def test_render_options_in_seconds_take_durations() -> None:
    args = parse_command(["render", "pytorchjob", "--ttl-seconds-after-finished", "1h",
                          "--termination-grace-period-seconds", "90s"])  # fmt: skip
    assert (args.ttl_seconds_after_finished, args.termination_grace_period_seconds) == (3600, 90)
    with pytest.raises(SystemExit):
        parse_command(["render", "pytorchjob", "--ttl-seconds-after-finished", "1.5s"])
