"""The one error the Python API (kubeddp.client) raises, and the translation into it of every
error the commands' parts raise: the message is the line `kubeddp COMMAND: error: ...` prints,
the exit code the one the command ends with (docs/exit-codes.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from kubeddp.trainer import exit_codes

# Imported in functions: the error classes of a command's parts, once a command has failed:
# `kubeddp --help` imports this module, and validate and helm_engine each add about 50 modules.

CLI_EXTRA_MODULES = ("jsonschema",)  # what the `cli` extra brings (render, validate, submit)
INSTALL_CLI_EXTRA = "pip install 'kubeddp[cli]'"


class KubeddpError(Exception):
    """A command failed. `str(exc)`: what is wrong and what to do, one line (several problems:
    each in `lines`); `exit_code`: the exit code the command line ends with (2 bad input, 3 the
    cluster, 124 a wait that timed out; docs/exit-codes.md); `command`: which command;
    `done`: what it had done before it failed (objects created or deleted)."""

    def __init__(
        self,
        message: str,
        exit_code: int,
        command: str,
        lines: Sequence[str] = (),
        done: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.exit_code, self.command = exit_code, command
        self.lines, self.done = list(lines) or [message], list(done)

    def cli_lines(self) -> list[str]:
        """What the command line prints on stderr."""
        return [f"kubeddp {self.command}: error: {line}" for line in self.lines]


class WaitTimeout(KubeddpError):
    """`wait`: the job is still running when the timeout is up (exit code 124)."""


@contextlib.contextmanager
def failing_as(command: str, done: list[str] | None = None) -> Iterator[None]:
    """Within it, every error a command's parts raise becomes a KubeddpError of `command`."""
    try:
        yield
    except KubeddpError:
        raise
    except Exception as exc:
        converted = _converted(exc, command, [] if done is None else done)
        if converted is None:
            raise
        raise converted from None


def _converted(exc: Exception, command: str, done: list[str]) -> KubeddpError | None:
    """The KubeddpError for an error of a command's parts; None for anything else (a bug)."""
    from kubeddp.tools.cluster.kube_errors import KubeError
    from kubeddp.tools.cluster.storage_classes import StorageProblem
    from kubeddp.tools.manifests.chart.render import RenderError  # imported here: only on an error
    from kubeddp.tools.manifests.chart.value_types import OptionError
    from kubeddp.tools.manifests.helm_engine import HelmUnavailable
    from kubeddp.tools.manifests.validate import ManifestError

    if isinstance(exc, KubeError):
        return KubeddpError(str(exc), exc.exit_code, command, done=done)
    if isinstance(exc, (ManifestError, OptionError, RenderError, StorageProblem, HelmUnavailable)):
        return KubeddpError(str(exc), exit_codes.BAD_INPUT, command, done=done)
    missing = (exc.name or "") if isinstance(exc, ModuleNotFoundError) else ""
    if missing.split(".")[0] in CLI_EXTRA_MODULES:  # a plain `pip install kubeddp`: no `cli`
        return KubeddpError(
            f"this command needs the CLI's libraries ({missing} is not installed); "
            f"install them with: {INSTALL_CLI_EXTRA}",
            exit_codes.BAD_INPUT,
            command,
        )
    return None
