"""The OpenAPI schema is generated from the code and the docs page works offline."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from tests.platform.openapi_contract import AnswerNotInSchema, check_answer, check_component, served_schema

pytestmark = pytest.mark.django_db


def schema_over_http() -> dict:
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    schema = response.json() if response["Content-Type"].startswith("application/json") else None
    if schema is None:
        import yaml  # pragma: no cover - drf-spectacular answers YAML by default

        schema = yaml.safe_load(response.content)
    return schema


def test_schema_lists_the_core_routes():
    paths = schema_over_http()["paths"]
    for path in ("/api/v1/models/", "/api/v1/datasets/", "/api/v1/jobs/", "/api/v1/jobs/{id}/report/", "/api/agent/v1/tasks/lease"):
        assert path in paths, path


def test_schema_validates_as_openapi_3_so_strict_client_generators_take_it():
    """openapi-spec-validator also checks each default against its own schema (a "" default with minLength 1 once failed)."""
    from openapi_spec_validator import validate

    validate(schema_over_http())


def test_docs_page_serves_swagger_from_this_server():
    response = APIClient().get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html
    assert "cdn.jsdelivr" not in html and "unpkg.com" not in html


def test_health_reports_the_database():
    body = APIClient().get("/api/v1/health/").json()
    assert body["status"] == "ok" and body["database"] in ("sqlite", "postgresql")


def _resolved(schema: dict, components: dict) -> dict:
    while "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def test_every_json_answer_states_its_shape():
    """No answer is a bare object: each has a serializer (the UI's types are generated from them, frontend/src/api/schema.ts)."""
    schema = served_schema()
    components = schema["components"]["schemas"]
    bare = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for status, answer in operation.get("responses", {}).items():
                body = (answer.get("content") or {}).get("application/json", {}).get("schema")
                if body is None:
                    continue
                body = _resolved(body, components)
                body = _resolved(body.get("items", body), components)
                if body.get("type") == "object" and not body.get("properties"):
                    bare.append(f"{method.upper()} {path} {status}")
    assert not bare, bare


def test_the_decision_is_one_typed_object_under_one_name():
    components = served_schema()["components"]["schemas"]
    device = components["ReportDevice"]["properties"]
    assert "Decision" in str(device["decision"])
    assert not {"verdict", "alternatives", "noise", "measurement"} & set(device)
    decision = components["Decision"]["properties"]
    for key in ("variant", "label", "effective_precision", "text", "comparison", "speedup", "tied_with", "alternatives", "noise",
                "measurement", "provisional"):
        assert key in decision, key
    # DESIGN.md section 5's core wire shapes stay: scripts written against them still work.
    assert {"recommended", "reason", "variants"} <= set(device)
    variant = components["ReportVariant"]["properties"]
    assert {"id", "backend", "precision", "recipe", "latency_ms", "throughput_per_s", "load_ms", "peak_memory_mb", "size_bytes", "accuracy",
            "artifact", "pareto"} <= set(variant)


def test_an_answer_is_checked_against_its_serializer_keys_and_types():
    check_component({"status": "ok", "database": "postgresql", "broker": "redis"}, "Health")
    with pytest.raises(AnswerNotInSchema, match="uptime"):
        check_component({"status": "ok", "database": "postgresql", "broker": "redis", "uptime": 3}, "Health")
    with pytest.raises(AnswerNotInSchema, match="database"):
        check_component({"status": "ok", "database": 5, "broker": "redis"}, "Health")
    with pytest.raises(AnswerNotInSchema, match="broker"):
        check_component({"status": "ok", "database": "postgresql"}, "Health")


def test_an_open_object_keeps_the_keys_it_does_not_list():
    """An accuracy carries every metric measured: the schema says it is open, so a key it does not list is no error."""
    check_component({"metric": "cosine", "value": 0.99, "drop": 0.01, "within_tolerance": True, "sqnr_db": 31.5}, "Accuracy")


def test_a_json_answer_the_schema_does_not_document_fails():
    with pytest.raises(AnswerNotInSchema, match="documents no such answer"):
        check_answer(method="GET", path="/api/v1/health/", status=202, content_type="application/json", body=b"{}")
    with pytest.raises(AnswerNotInSchema, match="does not list it"):
        check_answer(method="GET", path="/api/v1/nowhere/", status=200, content_type="application/json", body=b"{}")
    check_answer(method="GET", path="/api/v1/health/", status=404, content_type="application/json", body=b"{}")


REPO = Path(__file__).resolve().parents[2]
FRONTEND = REPO / "frontend"
GENERATOR = FRONTEND / "node_modules" / "openapi-typescript" / "bin" / "cli.js"


def _node() -> str | None:
    local = FRONTEND / ".nodeenv" / "bin" / "node"
    return str(local) if local.exists() else shutil.which("node")


def test_the_ui_types_are_generated_from_this_schema(tmp_path):
    """frontend/src/api/schema.ts is what `npm run gen:types` makes of the schema this code serves: a serializer changed
    without regenerating it fails here (and the UI's pages are type-checked against it by `npm run build`)."""
    node = _node()
    if node is None or not GENERATOR.exists():
        message = "openapi-typescript is not installed: run `bash frontend/build.sh` (npm ci)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    (tmp_path / "openapi.json").write_text(json.dumps(served_schema()))
    subprocess.run([node, str(GENERATOR), str(tmp_path / "openapi.json"), "--output", str(tmp_path / "schema.ts")], check=True, cwd=FRONTEND,
                   capture_output=True, timeout=120)
    generated = (tmp_path / "schema.ts").read_text()
    assert generated == (FRONTEND / "src" / "api" / "schema.ts").read_text(), (
        "frontend/src/api/schema.ts is stale: run `npm run gen:types` in frontend/ (KILN_PYTHON=path/to/python if not .venv)")
