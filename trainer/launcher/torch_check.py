"""The installed torch against what kubeddp was tested with.

An older torch than the declared lower bound (pyproject.toml: the oldest release tested) is
refused: it lacks APIs kubeddp calls, and would fail later with a traceback from deep inside
torch. There is no upper bound: a torch newer than any tested (NEWEST_TESTED_TORCH, the
newest release the CI's torch-range job runs) launches, with one line saying so. The lower
bound is read from the installed distribution's metadata, so it is the one pip resolved
against; without metadata (kubeddp run from a source tree) there is nothing to check.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from importlib import metadata

from kubeddp.trainer.constants import ENV_SKIP_TORCH_CHECK

DISTRIBUTION = "kubeddp"
# The newest torch release the workflow's torch-range job tests (tests/unit/test_torch_range.py
# keeps the two equal). A newer one is not refused: launch says it once, and goes on.
NEWEST_TESTED_TORCH = "2.15.0"

# `torch>=2.4.1`, `torch (>=2.4)`, `torch[extra]>=2.4; python_version >= "3.10"`; not
# `torchvision>=0.19`.
_REQUIREMENT_RE = re.compile(
    r"^\s*torch\s*(?:\[[^\]]*\])?\s*(?P<spec>[(<>=!~][^;]*?)?\s*(?:;(?P<marker>.*))?$",
    re.IGNORECASE,
)


def declared_torch_spec(requires: list[str] | None) -> str | None:
    """The version specifier of the plain `torch` requirement ('>=2.4.1'); None when
    there is none (or only one behind an extra)."""
    for line in requires or []:
        found = _REQUIREMENT_RE.match(line)
        if found and "extra" not in (found["marker"] or ""):
            return (found["spec"] or "").strip("() ") or None
    return None


def release(version: str | None) -> tuple[int, ...] | None:
    """The release numbers of a version ('2.6.0a0+git1' -> (2, 6, 0)); None if unreadable."""
    found = re.match(r"^\s*v?(\d+(?:\.\d+)*)", version or "")
    return tuple(int(part) for part in found.group(1).split(".")) if found else None


def _padded(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


_ORDER: dict[str, Callable[[tuple, tuple], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}


def _clause_holds(version: tuple[int, ...], clause: str) -> bool | None:
    """One clause of a specifier, on release numbers; None for what this does not know."""
    found = re.match(r"^(~=|==|!=|>=|<=|>|<)\s*(\d+(?:\.\d+)*)(\.\*)?$", clause.strip())
    if not found:
        return None
    op, bound_text, wildcard = found.groups()
    bound = tuple(int(part) for part in bound_text.split("."))
    if wildcard:
        if op not in ("==", "!="):
            return None
        prefix_matches = version[: len(bound)] == bound
        return prefix_matches if op == "==" else not prefix_matches
    if op == "~=":  # ~=2.4 means >=2.4, ==2.*
        if len(bound) < 2:
            return None
        left, right = _padded(version, bound)
        return left >= right and version[: len(bound) - 1] == bound[:-1]
    left, right = _padded(version, bound)
    if op in ("==", "!="):
        return (left == right) == (op == "==")
    return _ORDER[op](left, right)


def fallback_contains(spec: str, version: str) -> bool | None:
    """`version` within `spec`, comparing release numbers only; None when unsure."""
    numbers = release(version)
    if numbers is None:
        return None
    results = [_clause_holds(numbers, clause) for clause in spec.split(",") if clause.strip()]
    if any(result is None for result in results):
        return None
    return all(results)


def spec_contains(spec: str, version: str) -> bool | None:
    """`version` within `spec` (PEP 440, pre-releases and local builds such as NVIDIA's
    2.6.0a0+ecf3bae40a.nv25.01 included); None when either cannot be read."""
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import InvalidVersion, Version
    except ImportError:
        return fallback_contains(spec, version)
    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return fallback_contains(spec, version)


def torch_version_problem(installed: str | None, spec: str | None) -> str | None:
    """The one-line error for `installed` torch outside `spec`; None when fine or unknown."""
    if not installed or not spec:
        return None
    if spec_contains(spec, installed) is not False:
        return None
    return (
        f"torch {installed} is installed, but kubeddp supports torch{spec}; install a torch "
        f"in that range (set {ENV_SKIP_TORCH_CHECK}=1 to launch anyway)"
    )


def newer_than_tested(installed: str | None, newest: str = NEWEST_TESTED_TORCH) -> str | None:
    """The one line for a torch of a later minor than the newest tested (a nightly of the next
    minor too: 2.16.0a0); None when it is not, or its version cannot be read."""
    numbers, tested = release(installed), release(newest)
    if numbers is None or tested is None or numbers[:2] <= tested[:2]:
        return None
    return (
        f"torch {installed} is newer than any kubeddp was tested with (the newest: {newest}); "
        "launching anyway: a problem it causes is worth a report naming both versions"
    )


def _installed() -> tuple[str | None, str | None]:
    """(the installed torch's version, kubeddp's declared torch specifier): metadata only,
    no torch import; None for what is not there."""
    try:
        installed = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None, None
    try:
        spec = declared_torch_spec(metadata.requires(DISTRIBUTION))
    except metadata.PackageNotFoundError:
        spec = None
    return installed, spec


def installed_torch_problem() -> str | None:
    """torch_version_problem for this environment (reads metadata only, imports no torch)."""
    return torch_version_problem(*_installed())


def installed_torch_note() -> str | None:
    """newer_than_tested for this environment (reads metadata only, imports no torch)."""
    return newer_than_tested(_installed()[0])
