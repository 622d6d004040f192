"""The string formats kubeddp checks (names, quantities, env names), each with what it means.

The chart's values.schema.json takes its `pattern`s from here, and `kubeddp render` explains a
value that does not match with the description (instead of printing the regex).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Pattern:
    regex: str
    means: str  # completes "VALUE is not ..."

    def __post_init__(self) -> None:
        _MEANINGS.setdefault(self.regex, self.means)

    def match(self, text: str) -> bool:
        return re.fullmatch(self.regex, text) is not None


_MEANINGS: dict[str, str] = {}  # every Pattern made, by regex


def meaning(regex: str) -> str | None:
    """What a pattern used in the chart's schema stands for, in words."""
    return _MEANINGS.get(regex)


_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1035 = Pattern(
    r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
    "a DNS-1035 label (lower-case letters, digits and '-', starting with a letter)",
)
DNS1123_LABEL = Pattern(f"^{_LABEL}$", "a DNS-1123 label (lower-case letters, digits and '-')")
DNS1123_SUBDOMAIN = Pattern(
    rf"^{_LABEL}(\.{_LABEL})*$",
    "a DNS-1123 subdomain (lower-case letters, digits, '-' and '.')",
)
QUANTITY = Pattern(
    r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$",
    "a Kubernetes quantity (e.g. 500m, 4, 16Gi)",
)
# A quantity's suffix -> its factor (the API's resource.Quantity): the chart turns
# checkpoints.size into bytes with it (templates/_keeper.tpl); an `e`/`E` exponent is the rest.
QUANTITY_FACTORS: dict[str, float] = {
    "": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
}  # fmt: skip
# A whole number with an optional unit: the chart multiplies it by the GPU count.
WHOLE_QUANTITY = Pattern(
    r"^[0-9]+(Ki|Mi|Gi|Ti|m|k|M|G|T)?$",
    "a Kubernetes quantity without a decimal point (e.g. 2, 500m, 8Gi)",
)
ENV_NAME = Pattern(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", "a variable name (e.g. MY_VAR)")
# What kubeddp, torchrun and the operators set in a training container: a user's entry of the
# same name would replace theirs (or be replaced), so the chart refuses it.
RESERVED_ENV_NAME = Pattern(
    r"^(KUBEDDP_.*|PET_.*|TORCHELASTIC_.*|MASTER_ADDR|MASTER_PORT|RANK|LOCAL_RANK|WORLD_SIZE|"
    r"GROUP_RANK|GROUP_WORLD_SIZE|LOCAL_WORLD_SIZE|ROLE_RANK|ROLE_WORLD_SIZE|ROLE_NAME|"
    r"JOB_COMPLETION_INDEX|PROMETHEUS_MULTIPROC_DIR|PATH)$",
    "a name kubeddp, torchrun or the operator sets (KUBEDDP_*, PET_*, TORCHELASTIC_*, "
    "MASTER_ADDR/PORT, RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK, LOCAL_WORLD_SIZE, PATH...); "
    "a value of yours would replace theirs: choose another name (or the kubeddp option for it)",
)
# A ConfigMap or Secret key (the API server's rule).
CONFIG_KEY = Pattern(
    r"^[-._a-zA-Z0-9]+$", "a ConfigMap/Secret key (letters, digits, '-', '_', '.')"
)
QUALIFIED_NAME = Pattern(
    rf"^({_LABEL}(\.{_LABEL})*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    "a label or annotation key (an optional DNS prefix and '/', then letters, digits, '-_.')",
)
# An extended resource a device plugin advertises: a domain, '/', a name (rdma/ib,
# vpc.amazonaws.com/efa, nvidia.com/hostdev).
EXTENDED_RESOURCE = Pattern(
    rf"^{_LABEL}(\.{_LABEL})*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    "an extended resource name (a domain, '/', a name: e.g. rdma/ib)",
)
LABEL_VALUE = Pattern(
    r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",
    "a label value (letters, digits and '-_.', at most 63 characters)",
)
IMAGE_REPOSITORY = Pattern(
    r"^[^\s:@]+(:[0-9]+)?(/[^\s:@]+)*$",
    "an image repository (e.g. ghcr.io/org/name, without tag or digest)",
)
IMAGE_TAG = Pattern(r"^([\w][\w.-]{0,127})?$", "an image tag (letters, digits, '_.-')")
IMAGE_DIGEST = Pattern(
    r"^([a-z0-9]+([+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,})?$",
    "an image digest (e.g. sha256:<64 hex digits>)",
)
RDZV_ID = Pattern(r"^[-._a-zA-Z0-9]*$", "a rendezvous id (letters, digits and '-._')")
DURATION = Pattern(r"^(([0-9]+(ms|s|m|h))+)?$", "a Prometheus duration (e.g. 15s, 1m)")
# Whole seconds, or hours, minutes and seconds in that order (Go's units, as kubectl takes them)
TIME_LIMIT = Pattern(
    r"^([0-9]+|([0-9]+h)?([0-9]+m)?([0-9]+s)?)$", "a duration such as 90m, 12h or 1h30m"
)


# An absolute path without a trailing '/', '.' or '..' parts (RE2: no look-ahead).
_PATH_PART = r"([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+)"
ABSOLUTE_PATH = Pattern(
    rf"^(/|(/{_PATH_PART})+)$",
    "an absolute path (e.g. /data) without a trailing '/', '.' or '..'",
)
RELATIVE_PATH = Pattern(
    rf"^({_PATH_PART}(/{_PATH_PART})*)?$",
    "a relative path inside the volume (no leading '/', no '..')",
)
PYTHON_MODULE = Pattern(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$",
    "a Python module name (e.g. mypkg.train)",
)


def paths_and_parents(paths: tuple[str, ...]) -> Pattern:
    """Any of `paths`, a path inside one of them, or a folder above one of them."""
    parents: set[str] = set()
    for path in paths:
        while path != "/":
            path = posixpath.dirname(path)
            parents.add(path)
    parents -= set(paths)
    inside = "|".join(re.escape(p) for p in paths)
    above = "|".join(re.escape(p) for p in sorted(parents))
    return Pattern(
        f"^({inside})(/.*)?$|^({above})$",
        f"a path the image or kubeddp needs ({', '.join(paths)}), inside one, or a folder "
        "above one; mount elsewhere, e.g. /data",
    )


def count_or(words: tuple[str, ...]) -> Pattern:
    """A positive count, or one of these words."""
    return Pattern(f"^({'|'.join(words)}|[1-9][0-9]*)$", f"a count or one of {', '.join(words)}")


def optional(pattern: Pattern) -> Pattern:
    """The same format, or the empty string ("not set")."""
    return Pattern(f"^({pattern.regex[1:-1]})?$", f"{pattern.means}, or empty")
