"""The addresses a pod's environment names for its storage, checked by one rule before anything
waits on them: the checkpoint keeper (KUBEDDP_CHECKPOINT_KEEPER, http://HOST[:PORT]) and an
S3-compatible endpoint (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL: http(s)://HOST[:PORT]).

A port out of range, a broken IPv6 literal, a path, a query or a user and password are one line
(exit code 2, fatal: the manifest is wrong), never an internal error or a wait; the line never
shows a password written into the address.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import SplitResult, urlsplit

from kubeddp.trainer import constants, storage_rules

S3_ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


def shown(value: str) -> str:
    """`value` as a line may show it: a user and password in it replaced by ***."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return repr(value[:200])
    if parts.username is None and parts.password is None:
        return repr(value[:200])
    return repr(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()[:200])


def url_problem(name: str, value: str, schemes: tuple[str, ...]) -> str | None:
    """Why `value` (of the variable `name`) is not SCHEME://HOST[:PORT], or None."""
    form = f"{'|'.join(schemes)}://HOST[:PORT]"
    try:
        parts: SplitResult = urlsplit(value)
        port = parts.port
    except ValueError as exc:  # a port out of range or not a number, a broken IPv6 literal
        return f"{name}={shown(value)} is not {form} ({exc}); fix or unset it"
    if parts.scheme not in schemes or not parts.hostname:
        return f"{name}={shown(value)} is not {form}; fix or unset it"
    if port == 0:
        return f"{name}={shown(value)} has port 0; give the port it listens on, or none"
    if parts.username is not None or parts.password is not None:
        return (
            f"{name}={shown(value)} holds a user and password; give credentials their own "
            "variables (a Secret), never in an address the logs may show"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return f"{name}={shown(value)} has a path or query; give {form} alone"
    return None


def problems(env: Mapping[str, str], checkpoint_dir: str) -> list[str]:
    """Every address in `env` that is not one (checked at launch, before any wait): the
    keeper's when the manifest names one, the S3 endpoint's when checkpoint.dir is s3://."""
    found = []
    keeper = env.get(constants.ENV_CHECKPOINT_KEEPER)
    if keeper:
        found.append(url_problem(constants.ENV_CHECKPOINT_KEEPER, keeper, ("http",)))
    if storage_rules.object_store(checkpoint_dir) == "s3":
        for name in S3_ENDPOINT_ENVS:
            if env.get(name):
                found.append(url_problem(name, env[name], ("http", "https")))
    return [problem for problem in found if problem]
