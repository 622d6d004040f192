"""The pieces the chart's value definitions are made of: `Value`, `Flag`, `Section`, helpers
that write a value's JSON schema, and the converters of `kubeddp render` options that are not
one value (an image reference, MIN:MAX, pull secret names)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubeddp.tools.manifests import patterns as P

Converter = Callable[[Any], dict[str, Any]]


@dataclass(frozen=True)
class Flag:
    """A `kubeddp render` option. `read` says how argparse takes it:

    text/int: one value; pairs: repeatable K=V into a mapping; list: repeatable; switch:
    --x/--no-x; yaml-list/yaml-map: inline YAML/JSON or a file; config-file / config-set: the
    trainer config file / `section.key=value` overrides; program-args: what follows `--` on
    the command line (no option of its own).
    """

    options: tuple[str, ...]
    read: str = "text"
    help: str = ""  # empty: the value's doc
    metavar: str | None = None
    sets: tuple[str, ...] = ()  # empty: the value it is attached to
    convert: Converter | None = None  # the parsed option -> {value path: value}

    @property
    def name(self) -> str:
        """The option's one name (its first long spelling; the others are aliases): errors,
        the docs and the Python keyword (kubeddp.client) use it."""
        return next((o for o in self.options if o.startswith("--")), self.options[-1])


@dataclass(frozen=True)
class Value:
    path: str
    schema: dict[str, Any]
    default: Any
    doc: str
    group: str
    flags: tuple[Flag, ...] = ()


@dataclass(frozen=True)
class Section:
    """A mapping of values; its doc heads the block in values.yaml."""

    path: str
    doc: str


# --- schema helpers ---------------------------------------------------------------------------


def text(pattern: P.Pattern | None = None, nullable: bool = False, **more: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"type": ["string", "null"] if nullable else "string", **more}
    if pattern:
        node["pattern"] = pattern.regex
    return node


INT32_MAX = 2**31 - 1  # every count of the Kubernetes API is an int32


def integer(minimum: int | None = None, nullable: bool = False) -> dict[str, Any]:
    node: dict[str, Any] = {
        "type": ["integer", "null"] if nullable else "integer",
        "maximum": INT32_MAX,
    }
    if minimum is not None:
        node["minimum"] = minimum
    return node


def choice(options: tuple, nullable: bool = False) -> dict[str, Any]:
    if nullable:
        return {"type": ["string", "null"], "enum": [None, *options]}
    return {"type": "string", "enum": list(options)}


def k8s(definition: str) -> dict[str, Any]:
    """A Kubernetes type: its definition comes from kubernetes-validate (see
    tools/generate/chart_files.py)."""
    return {"$ref": f"#/definitions/io.k8s.api.core.v1.{definition}"}


def k8s_list(definition: str) -> dict[str, Any]:
    return {"type": "array", "items": k8s(definition)}


def string_map(key: P.Pattern | None = None, value: P.Pattern | None = None) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "object", "additionalProperties": text(value)}
    if key:
        node["propertyNames"] = {"pattern": key.regex}
    return node


def env_name(user_settings: tuple[str, ...]) -> dict[str, Any]:
    """A container env name as the API server takes it, and none that kubeddp, torchrun or the
    operator sets (but the KUBEDDP_* settings a user may give)."""
    return {
        "pattern": P.ENV_NAME.regex,
        "if": {"not": {"enum": list(user_settings)}},
        "then": {"not": {"pattern": P.RESERVED_ENV_NAME.regex}},
    }


def env_entries(user_settings: tuple[str, ...]) -> dict[str, Any]:
    """`extraEnv`: Kubernetes EnvVar objects, with the names and references the API server
    would refuse refused here (the EnvVar definition has no patterns)."""
    reference = {
        "type": "object",
        "properties": {
            "name": text(P.DNS1123_SUBDOMAIN, maxLength=253),
            "key": text(P.CONFIG_KEY, maxLength=253),
        },
    }
    checks = {
        "type": "object",
        "properties": {
            "name": {"type": "string", **env_name(user_settings)},
            "valueFrom": {
                "type": "object",
                "properties": {"secretKeyRef": reference, "configMapKeyRef": reference},
            },
        },
    }
    return {"type": "array", "items": {"allOf": [k8s("EnvVar"), checks]}}


def label_map() -> dict[str, Any]:
    node = string_map(P.QUALIFIED_NAME, P.LABEL_VALUE)
    node["propertyNames"]["maxLength"] = 316  # 253 prefix + '/' + 63 name
    node["additionalProperties"]["maxLength"] = 63
    return node


def boolean() -> dict[str, Any]:
    return {"type": "boolean"}


# --- converters of options that are not one value ------------------------------------------


def image_values(reference: str) -> dict[str, Any]:
    """repo[:port]/name[:tag][@digest] -> image.repository/tag/digest (no tag: latest)."""
    name, _, digest = reference.partition("@")
    repository, tag = name, ""
    slash, colon = name.rfind("/"), name.rfind(":")
    if colon > slash:
        repository, tag = name[:colon], name[colon + 1 :]
    if not tag and not digest:
        tag = "latest"  # what Kubernetes pulls for a reference without tag
    return {"image.repository": repository, "image.tag": tag, "image.digest": digest}


class OptionError(ValueError):
    """A render option cannot be read; the message starts with the option."""


def nnodes_values(text_value: str) -> dict[str, Any]:
    """torchrun's --nnodes: N pods, or MIN:MAX for an elastic job (as --elastic MIN:MAX)."""
    if ":" in text_value:
        low, _, high = text_value.partition(":")
        if low.isdigit() and high.isdigit():
            return elastic_values(text_value)
    elif text_value.isdigit():
        return {"nodes": int(text_value)}
    raise OptionError(
        f"--nnodes: {text_value!r} is neither N nor MIN:MAX; write e.g. --nnodes 4, or "
        "--nnodes 2:4 for an elastic job"
    )


def elastic_values(text_value: str) -> dict[str, Any]:
    low, sep, high = text_value.partition(":")
    if not (sep and low.isdigit() and high.isdigit()):
        raise OptionError(f"--elastic: {text_value!r} is not MIN:MAX; write e.g. --elastic 2:4")
    return {"elastic.enabled": True, "elastic.minNodes": int(low), "elastic.maxNodes": int(high)}


def pull_secrets(secret_names: list[str]) -> dict[str, Any]:
    return {"imagePullSecrets": [{"name": secret} for secret in secret_names]}


# --- data and credentials: a volume with its mount, envFrom, env from a Secret key -----------

# Volume sources a user's volume may have (hostPath is not one: the restricted Pod Security
# Standard refuses it), with their Kubernetes definitions.
VOLUME_SOURCES = {
    "persistentVolumeClaim": "PersistentVolumeClaimVolumeSource",
    "configMap": "ConfigMapVolumeSource",
    "secret": "SecretVolumeSource",
    "csi": "CSIVolumeSource",
    "ephemeral": "EphemeralVolumeSource",
    "emptyDir": "EmptyDirVolumeSource",
    "nfs": "NFSVolumeSource",
    "projected": "ProjectedVolumeSource",
}
MAX_PATH_CHARS = 4095  # Linux's PATH_MAX, less the terminating NUL
# `--volume TYPE:NAME:PATH[:ro]`: TYPE -> (volume source, the key that names the object)
SHORT_VOLUME_TYPES = {
    "claim": ("persistentVolumeClaim", "claimName"),
    "configmap": ("configMap", "name"),
    "secret": ("secret", "secretName"),
}
SHORT_ENV_FROM_TYPES = {"secret": "secretRef", "configmap": "configMapRef"}


def data_volume(
    volume_name: P.Pattern, taken_names: tuple[str, ...], reserved_paths: P.Pattern
) -> dict[str, Any]:
    """One entry of `volumes`: a Kubernetes volume (its name and one source) and where the
    training container mounts it."""
    properties: dict[str, Any] = {
        "name": {**text(volume_name, maxLength=63), "not": {"enum": list(taken_names)}},
        "mountPath": {
            **text(P.ABSOLUTE_PATH, maxLength=MAX_PATH_CHARS),
            "not": {"pattern": reserved_paths.regex},
        },
        "readOnly": boolean(),
        "subPath": text(P.RELATIVE_PATH),
    }
    properties.update({key: k8s(definition) for key, definition in VOLUME_SOURCES.items()})
    for source, key in SHORT_VOLUME_TYPES.values():  # the object names the API server checks
        properties[source] = {"allOf": [properties[source], _named(key)]}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "mountPath"],
        "properties": properties,
    }


def _named(key: str) -> dict[str, Any]:
    return {"type": "object", "properties": {key: text(P.DNS1123_SUBDOMAIN, maxLength=253)}}


def _volume_name(mount_path: str) -> str:
    """A DNS label from the mount path (unique, as mount paths are): /data/train -> data-train."""
    label = "".join(c if c.isalnum() else "-" for c in mount_path.lower()).strip("-")
    return ("vol-" + label)[:63].rstrip("-") if label else "vol"


def volume_values(specs: list[str]) -> dict[str, Any]:
    """`--volume claim:NAME:/data[:ro]` (also configmap:, secret:) -> `volumes` entries."""
    entries = []
    for spec in specs:
        parts = spec.split(":")
        read_only = len(parts) == 4 and parts[3] == "ro"
        if len(parts) not in (3, 4) or parts[0] not in SHORT_VOLUME_TYPES or not all(parts[:3]):
            raise OptionError(
                f"--volume: {spec!r} is not TYPE:NAME:PATH[:ro] with TYPE "
                f"{', '.join(SHORT_VOLUME_TYPES)}; e.g. --volume claim:datasets:/data:ro "
                "(--volumes YAML for CSI and ephemeral volumes)"
            )
        if len(parts) == 4 and not read_only:
            raise OptionError(f"--volume: {spec!r} ends in {parts[3]!r}; the only flag is :ro")
        source, key = SHORT_VOLUME_TYPES[parts[0]]
        entry: dict[str, Any] = {
            "name": _volume_name(parts[2]),
            "mountPath": parts[2],
            source: {key: parts[1]},
        }
        if read_only:
            entry["readOnly"] = True
        entries.append(entry)
    return {"volumes": entries}


def env_from_values(specs: list[str]) -> dict[str, Any]:
    """`--env-from secret:NAME` / `configmap:NAME` -> `envFrom` entries."""
    entries = []
    for spec in specs:
        kind, sep, name = spec.partition(":")
        if not sep or kind not in SHORT_ENV_FROM_TYPES or not name:
            raise OptionError(
                f"--env-from: {spec!r} is not secret:NAME or configmap:NAME; e.g. "
                "--env-from secret:hub-token"
            )
        entries.append({SHORT_ENV_FROM_TYPES[kind]: {"name": name}})
    return {"envFrom": entries}


def env_secret_values(specs: list[str]) -> dict[str, Any]:
    """`--env-secret VAR=SECRET:KEY` -> `extraEnv` entries with valueFrom.secretKeyRef."""
    entries = []
    for spec in specs:
        var, sep, ref = spec.partition("=")
        secret, colon, key = ref.partition(":")
        if not (sep and colon and var and secret and key):
            raise OptionError(
                f"--env-secret: {spec!r} is not VAR=SECRET:KEY; e.g. --env-secret "
                "HF_TOKEN=hub-credentials:token"
            )
        entries.append({"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    return {"extraEnv": entries}


def resource(section: str, name: str, option: str, help_text: str) -> Flag:
    path = f"resources.{section}.{name}"
    return Flag((option,), help=help_text, sets=(path,))


def switch(option: str, help_text: str = "") -> Flag:
    return Flag((option,), read="switch", help=help_text)


def pairs(option: str, help_text: str = "") -> Flag:
    return Flag((option,), read="pairs", metavar="K=V", help=help_text)
