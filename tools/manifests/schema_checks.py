"""Schema checks of one manifest document; each returns `(field path, message)` pairs.

- core kinds: the strict Kubernetes OpenAPI schemas bundled in tools/manifests/schemas (unknown
fields
  fail); other core kinds through `kubernetes-validate` where that is installed
- PyTorchJob offline: the `kubeflow-training` SDK models' `openapi_types`/`attribute_map`, walked,
  where the SDK is installed; else the bundled CRD schema (tools/manifests/schemas)
- TrainJob offline: the `kubeflow-trainer-api` pydantic models, extra keys rejected, strict types,
  where installed; else the bundled CRD schema
- any CRD kind online: the CRD's `openAPIV3Schema` read from the cluster, with unknown fields
  rejected (the API server would silently prune them)

The validation libraries are imported inside functions: they are an optional extra.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import typing
from typing import Any

from kubeddp.tools.manifests import bundled_schemas
from kubeddp.tools.manifests.bundled_schemas import KUBERNETES_SCHEMA_VERSION

Issue = tuple[str, str]
# Fields whose SDK type says `str` but which the API accepts as int-or-string quantities.
QUANTITY_MAPS = {"limits", "requests", "capacity"}
QUANTITY_FIELDS = {"sizeLimit", "storage"}


def join_path(path: list[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


class SchemaUnavailable(LookupError):
    """No schema for this apiVersion/kind in the offline sources."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


SECRET_VALUES = ("data", "stringData")  # a Secret's values: never in a message


def _message(doc: dict, path: list[Any], error: Any) -> str:
    """The error's message; for a value of a Secret, what is wrong without the value."""
    if doc.get("kind") != "Secret" or not path or path[0] not in SECRET_VALUES:
        return error.message
    if error.validator == "type":
        return f"must be of type {error.validator_value} (the value is not shown: a secret)"
    return f"is not valid ({error.validator}; the value is not shown: a secret)"


def core_issues(doc: dict) -> list[Issue]:
    import jsonschema

    validator = bundled_schemas.core_validator(f"{doc.get('apiVersion')}/{doc.get('kind')}")
    if validator is not None:
        error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
        if error is None:
            return []
        path = list(error.absolute_path)
        return [(join_path(path), _message(doc, path, error))]
    if not _installed("kubernetes_validate"):
        raise SchemaUnavailable(f"{doc.get('apiVersion')} {doc.get('kind')}")
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, KUBERNETES_SCHEMA_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        raise SchemaUnavailable(f"{doc.get('apiVersion')} {doc.get('kind')}") from None
    except kubernetes_validate.ValidationError as exc:
        return [(join_path(list(exc.absolute_path)), exc.message)]
    return []


def pod_template_issues(template: Any, path: list[Any]) -> list[Issue]:
    """Check an embedded PodTemplateSpec with the strict core schema of `v1 PodTemplate`."""
    doc = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "x"},
        "template": template,
    }
    return [(join_path(path) + p.removeprefix("template"), m) for p, m in core_issues(doc)]


# --- kubeflow-training (PyTorchJob): swagger-codegen models -------------------------------------

_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "datetime": (str,),
    "date": (str,),
}


def _swagger_class(name: str) -> type:
    from kubeflow.training import models as kf_models
    from kubernetes.client import models as k8s_models

    for module in (kf_models, k8s_models):
        if hasattr(module, name):
            return getattr(module, name)
    raise LookupError(f"no SDK model named {name}")


def _swagger_walk(value: Any, type_name: str, path: list[Any], issues: list[Issue]) -> None:
    if type_name.startswith("list["):
        if not isinstance(value, list):
            issues.append((join_path(path), f"must be a list, got {type(value).__name__}"))
            return
        for index, item in enumerate(value):
            _swagger_walk(item, type_name[5:-1], [*path, index], issues)
        return
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            issues.append((join_path(path), f"must be a mapping, got {type(value).__name__}"))
            return
        inner = type_name[type_name.index(",") + 1 : -1].strip()
        for key, item in value.items():
            if path and path[-1] in QUANTITY_MAPS and isinstance(item, (int, float)):
                continue
            _swagger_walk(item, inner, [*path, key], issues)
        return
    if type_name == "object":
        return
    if type_name in _PRIMITIVES:
        if path and path[-1] in QUANTITY_FIELDS and isinstance(value, (int, float)):
            return
        wanted = _PRIMITIVES[type_name]
        bad_bool = isinstance(value, bool) and bool not in wanted
        if bad_bool or not isinstance(value, wanted):
            issues.append(
                (join_path(path), f"must be {type_name}, got {type(value).__name__} {value!r}")
            )
        return
    model = _swagger_class(type_name)
    if not isinstance(value, dict):
        issues.append(
            (join_path(path), f"must be a mapping ({type_name}), got {type(value).__name__}")
        )
        return
    by_json_name = {json_name: attr for attr, json_name in model.attribute_map.items()}
    for key, item in value.items():
        if key not in by_json_name:
            known = ", ".join(sorted(by_json_name))
            issues.append((join_path([*path, key]), f"unknown field (known here: {known})"))
            continue
        _swagger_walk(item, model.openapi_types[by_json_name[key]], [*path, key], issues)


def pytorchjob_issues(doc: dict) -> list[Issue]:
    if _installed("kubeflow.training"):
        return pytorchjob_sdk_issues(doc)
    return crd_issues(doc, bundled_schemas.crd_schema("kubeflow.org/v1/PyTorchJob"))


def trainjob_issues(doc: dict) -> list[Issue]:
    if _installed("kubeflow_trainer_api"):
        return trainjob_sdk_issues(doc)
    return crd_issues(doc, bundled_schemas.crd_schema("trainer.kubeflow.org/v1alpha1/TrainJob"))


def pytorchjob_sdk_issues(doc: dict) -> list[Issue]:
    issues: list[Issue] = []
    _swagger_walk(doc, "KubeflowOrgV1PyTorchJob", [], issues)
    return issues


# --- kubeflow-trainer-api (TrainJob): pydantic models ---------------------------------------


def _unwrap(annotation: Any) -> list[Any]:
    """Optional[X] / Annotated[X, ...] / Union -> the concrete alternatives."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        out = []
        for arg in typing.get_args(annotation):
            if arg is not type(None):
                out += _unwrap(arg)
        return out
    return [annotation]


@functools.cache
def _type_adapter(annotation: Any) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(annotation)


def _leaf_issue(value: Any, annotation: Any) -> str | None:
    import pydantic

    try:
        _type_adapter(annotation).validate_python(value, strict=True)
    except pydantic.ValidationError as exc:
        return exc.errors()[0]["msg"]
    return None


def _is_one_of(model: type) -> bool:
    """The SDK's oneOf wrappers (Quantity, IntOrString) hold a scalar, not a mapping."""
    return "actual_instance" in model.model_fields


def _pydantic_walk(value: Any, annotation: Any, path: list[Any], issues: list[Issue]) -> None:
    from pydantic import BaseModel

    alternatives = _unwrap(annotation)
    for alt in alternatives:
        if isinstance(alt, type) and issubclass(alt, BaseModel) and _is_one_of(alt):
            try:
                alt.from_json(json.dumps(value))
            except ValueError:
                issues.append((join_path(path), f"{value!r} is not a valid {alt.__name__}"))
            return
    containers = [
        alt
        for alt in alternatives
        if typing.get_origin(alt) in (list, dict)
        or (isinstance(alt, type) and issubclass(alt, BaseModel))
    ]
    if not containers:
        message = _leaf_issue(value, annotation)
        if message:
            issues.append((join_path(path), f"{message}, got {type(value).__name__} {value!r}"))
        return
    if not any(
        isinstance(value, list if typing.get_origin(alt) is list else dict) for alt in containers
    ):
        wanted = "a list" if typing.get_origin(containers[0]) is list else "a mapping"
        issues.append((join_path(path), f"must be {wanted}, got {type(value).__name__}"))
        return
    for alt in alternatives:
        origin = typing.get_origin(alt)
        if origin is list and isinstance(value, list):
            (item_type,) = typing.get_args(alt)
            for index, item in enumerate(value):
                _pydantic_walk(item, item_type, [*path, index], issues)
        elif origin is dict and isinstance(value, dict):
            item_type = typing.get_args(alt)[1]
            for key, item in value.items():
                _pydantic_walk(item, item_type, [*path, key], issues)
        elif isinstance(alt, type) and issubclass(alt, BaseModel) and isinstance(value, dict):
            by_alias = {(f.alias or name): f for name, f in alt.model_fields.items()}
            for key, item in value.items():
                if key not in by_alias:
                    known = ", ".join(sorted(by_alias))
                    issues.append((join_path([*path, key]), f"unknown field (known here: {known})"))
                    continue
                _pydantic_walk(item, by_alias[key].annotation, [*path, key], issues)


def trainjob_sdk_issues(doc: dict) -> list[Issue]:
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    return _trainer_sdk_issues(doc, TrainerV1alpha1TrainJob)


def trainingruntime_issues(doc: dict) -> list[Issue]:
    """The TrainingRuntime kubeddp renders beside a TrainJob: the SDK's model where installed,
    else the bundled CRD schema."""
    if not _installed("kubeflow_trainer_api"):
        key = "trainer.kubeflow.org/v1alpha1/TrainingRuntime"
        return crd_issues(doc, bundled_schemas.crd_schema(key))
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainingRuntime

    return _trainer_sdk_issues(doc, TrainerV1alpha1TrainingRuntime)


def _trainer_sdk_issues(doc: dict, model: Any) -> list[Issue]:
    import pydantic

    issues: list[Issue] = []
    _pydantic_walk(doc, model, [], issues)
    if issues:
        return issues
    try:  # what the walk cannot see: required fields, the models' own validators
        model.from_dict(doc)
    except pydantic.ValidationError as exc:
        for error in exc.errors():
            issues.append((join_path(list(error["loc"])), f"{error['msg']} (in {exc.title})"))
    return issues


# --- a CRD's openAPIV3Schema (read from the cluster) ------------------------------------------


def strict_crd_schema(schema: dict) -> dict:
    """Reject what the API server would prune: objects with `properties` get
    additionalProperties false, unless they preserve unknown fields; int-or-string becomes anyOf.
    """
    schema = copy.deepcopy(schema)

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("x-kubernetes-int-or-string") and "anyOf" not in node:
                node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for child in node.values():
                visit(child)
        elif isinstance(node, list):
            for child in node:
                visit(child)

    visit(schema)
    return schema


_validators: dict[int, tuple[dict, Any]] = {}  # id(schema) -> (schema, validator)


def crd_issues(doc: dict, openapi_v3_schema: dict) -> list[Issue]:
    import jsonschema

    cached = _validators.get(id(openapi_v3_schema))
    if cached is None or cached[0] is not openapi_v3_schema:
        validator = jsonschema.Draft7Validator(strict_crd_schema(openapi_v3_schema))
        _validators[id(openapi_v3_schema)] = (openapi_v3_schema, validator)
    validator = _validators[id(openapi_v3_schema)][1]
    issues: list[Issue] = []
    for error in sorted(validator.iter_errors(doc), key=lambda e: str(e.absolute_path)):
        path = list(error.absolute_path)
        unknown = _unknown_fields(error)
        if unknown is None:
            issues.append((join_path(path), error.message))
            continue
        known = ", ".join(sorted(error.schema.get("properties", {})))
        issues += [
            (join_path([*path, key]), f"unknown field (known here: {known})") for key in unknown
        ]
    return issues


def _unknown_fields(error: Any) -> list[str] | None:
    """The keys an `additionalProperties: false` error is about (named in the path, as the SDK
    check names them); None for any other error."""
    if error.validator != "additionalProperties" or not isinstance(error.instance, dict):
        return None
    known = error.schema.get("properties", {})
    return sorted(key for key in error.instance if key not in known) or None
