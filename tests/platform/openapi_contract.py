"""Every JSON answer of the API, checked against the OpenAPI schema the code makes.

Views that build their answers as dicts (the report, the agent protocol) state their shape with serializers that do not
render (kiln.core.schema): this is what keeps the two true to each other. tests/platform/conftest.py runs every answer the
API tests receive through `check_answer`; a key the schema does not list fails as surely as a missing or mistyped one,
except inside objects the schema leaves open (`additionalProperties`).
"""
from __future__ import annotations

import copy
import json
import re
from functools import cache

from openapi_schema_validator import OAS30ReadValidator

METHODS = ("get", "post", "put", "patch", "delete")


class AnswerNotInSchema(AssertionError):
    """A JSON answer whose shape the schema does not state, or states otherwise."""


@cache
def served_schema() -> dict:
    """The schema as `GET /api/schema/` serves it (JSON types only)."""
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.renderers import OpenApiJsonRenderer

    return json.loads(OpenApiJsonRenderer().render(SchemaGenerator().get_schema(request=None, public=True)))


def closed(schema):
    """The schema with every object that lists its properties closed to others: `additionalProperties: false` where the
    schema left it unsaid (an object that says `additionalProperties` stays open).

    drf-spectacular writes a nullable component as `{"allOf": [{"$ref"}], "nullable": true}`, which openapi-typescript
    reads as `X | null`; a strict OpenAPI 3.0 validator applies `nullable` to the outer schema only, so it is said here
    as "X, or null"."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {key: closed(value) for key, value in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema:
        schema["additionalProperties"] = False
    if schema.get("nullable") and "allOf" in schema:
        rest = {key: value for key, value in schema.items() if key not in ("allOf", "nullable")}
        schema = {**rest, "anyOf": [{"allOf": schema["allOf"]}, {"enum": [None]}]}
    return schema


@cache
def _components() -> dict:
    return closed(copy.deepcopy(served_schema()["components"]))


@cache
def _routes() -> list[tuple[re.Pattern, str]]:
    """Each path of the schema as a pattern, the most literal first (`agents/setup/` before `agents/{id}/`)."""
    routes = []
    for template in served_schema()["paths"]:
        literal = re.sub(r"\{[^/]+\}", "", template)
        pattern = re.compile("^" + re.sub(r"\\\{[^/]+\\\}", "[^/]+", re.escape(template)) + "$")
        routes.append((len(literal), pattern, template))
    return [(pattern, template) for _, pattern, template in sorted(routes, key=lambda route: -route[0])]


def operation_of(path: str, method: str) -> tuple[str, dict] | None:
    """(the schema's path template, its operation) for a request; None for a path the schema does not list."""
    template = next((template for pattern, template in _routes() if pattern.match(path)), None)
    if template is None:
        return None
    operation = served_schema()["paths"][template].get(method.lower())
    return (template, operation) if operation is not None else None


def answer_schema(operation: dict, status: int) -> dict | None:
    content = (operation.get("responses", {}).get(str(status)) or {}).get("content") or {}
    return (content.get("application/json") or {}).get("schema")


@cache
def _validator(schema_json: str) -> OAS30ReadValidator:
    return OAS30ReadValidator({**closed(json.loads(schema_json)), "components": _components()})


def check(body, schema: dict, where: str) -> None:
    """`body` against `schema` (a schema of the document, its `$ref`s into its components), closed as `closed` says."""
    validator = _validator(json.dumps(schema, sort_keys=True))
    errors = sorted(validator.iter_errors(body), key=lambda error: list(error.absolute_path))
    if errors:
        lines = [f"- at {'/'.join(map(str, error.absolute_path)) or '(top)'}: {error.message[:300]}" for error in errors[:10]]
        raise AnswerNotInSchema(f"{where}: the answer does not have the shape the OpenAPI schema states:\n" + "\n".join(lines))


def check_component(body, name: str) -> None:
    check(body, {"$ref": f"#/components/schemas/{name}"}, name)


def check_answer(*, method: str, path: str, status: int, content_type: str, body: bytes) -> None:
    """One answer of the API against the schema: a JSON success under /api/ must be documented, with its shape."""
    if not path.startswith("/api/") or not 200 <= status < 300 or not content_type.startswith("application/json") or path == "/api/schema/":
        return
    found = operation_of(path, method)
    if found is None:
        raise AnswerNotInSchema(f"{method} {path} answered {status} with JSON, and the schema does not list it")
    template, operation = found
    schema = answer_schema(operation, status)
    if schema is None:
        raise AnswerNotInSchema(f"{method} {template} answered {status} with JSON, and the schema documents no such answer")
    check(json.loads(body), schema, f"{method} {template} {status}")
