"""MkDocs hook: pages made at build time, never stored in docs/.

- `reference/rest-api.md` and `reference/agent-api.md`: the REST API and the agent protocol, rendered from the OpenAPI
  schema drf-spectacular makes of the running code (`manage.py spectacular`), so the reference cannot drift from it;
  `reference/openapi.json` is that schema, served beside them.
- `benchmarks/results.md`: benchmarks/RESULTS.md (the latest run of each script), which stays beside the scripts, and
  `benchmarks/history/<date>.md`: the runs it superseded, one page per date, listed by `benchmarks/history/index.md`.
  Their links to other files of the repository are re-pointed at the site's pages.
"""
from __future__ import annotations

import json
import os
import posixpath
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, InclusionLevel

REST_PAGE = "reference/rest-api.md"
AGENT_PAGE = "reference/agent-api.md"
SCHEMA_FILE = "reference/openapi.json"
RESULTS_PAGE = "benchmarks/results.md"
RESULTS_SOURCE = "benchmarks/RESULTS.md"
HISTORY = "benchmarks/history"
MARKDOWN_LINK = re.compile(r"(\]\()([^)\s]+)(\))")
REST_PREFIX = "/api/v1/"
AGENT_PREFIX = "/api/agent/v1/"
METHODS = ("get", "post", "put", "patch", "delete")
# drf-spectacular writes Django's 64-bit id bounds on every integer; they say nothing to a reader.
INT64_BOUNDS = (-(2**63), 2**63 - 1)


def on_files(files, config):
    repo = Path(config.config_file_path).resolve().parent
    schema = openapi_schema(repo)
    files.append(File.generated(config, SCHEMA_FILE, content=json.dumps(schema, indent=1)))
    files.append(File.generated(config, REST_PAGE, content=rest_page(schema)))
    files.append(File.generated(config, AGENT_PAGE, content=agent_page(schema)))
    files.append(File.generated(config, RESULTS_PAGE, content=site_markdown(repo, RESULTS_SOURCE, RESULTS_PAGE)))
    dates = sorted(path.name for path in (repo / HISTORY).glob("*.md"))
    for name in dates:
        # Reached from the results page and the history's index, not listed one by one in the navigation.
        files.append(File.generated(config, f"{HISTORY}/{name}", content=site_markdown(repo, f"{HISTORY}/{name}", f"{HISTORY}/{name}"),
                                    inclusion=InclusionLevel.NOT_IN_NAV))
    files.append(File.generated(config, f"{HISTORY}/index.md", content=history_index(repo, dates)))
    return files


def openapi_schema(repo: Path) -> dict:
    """The schema of this checkout's code, made by drf-spectacular in a child process (Django set up there, not here)."""
    with tempfile.TemporaryDirectory() as scratch:
        target = Path(scratch) / "openapi.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "platform"), os.environ.get("PYTHONPATH", "")])}
        env.setdefault("KILN_DATA_DIR", str(Path(scratch) / "data"))
        result = subprocess.run([sys.executable, str(repo / "platform" / "manage.py"), "spectacular", "--format", "openapi-json",
                                 "--file", str(target)], check=False, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        if result.returncode != 0 or not target.exists():
            raise PluginError(f"manage.py spectacular failed ({result.returncode}):\n{result.stderr[-3000:]}")
        return json.loads(target.read_text())


# -- benchmark results --------------------------------------------------------------------------

def site_page(repo_path: str) -> str | None:
    """The site's page for a repository file the results link to (None: not on the site)."""
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/"):]
    if repo_path == RESULTS_SOURCE:
        return RESULTS_PAGE
    if repo_path.startswith(f"{HISTORY}/") and repo_path.endswith(".md"):
        return repo_path
    return None


def site_markdown(repo: Path, source: str, page: str) -> str:
    """Repository file `source` as the site's `page`: relative links outside code blocks point at the site's pages."""

    def repoint(match: re.Match) -> str:
        target, _, anchor = match.group(2).partition("#")
        if not target or "://" in target or target.startswith(("/", "mailto:")):
            return match.group(0)
        site = site_page(posixpath.normpath(posixpath.join(posixpath.dirname(source), target)))
        if site is None:
            return match.group(0)
        relative = posixpath.relpath(site, posixpath.dirname(page))
        return f"{match.group(1)}{relative}{'#' + anchor if anchor else ''}{match.group(3)}"

    lines, fenced = [], False
    for line in (repo / source).read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        lines.append(line if fenced else MARKDOWN_LINK.sub(repoint, line))
    return "\n".join(lines) + "\n"


def history_index(repo: Path, dates: list[str]) -> str:
    """The earlier runs, one page per date, oldest first, each with its first heading."""
    lines = ["# Earlier benchmark runs", "",
             "Runs a later run of the same script replaced, kept verbatim, one page per date (oldest first). The current "
             "results are on [Full results](../results.md).", ""]
    for name in dates:
        heading = next((line[2:] for line in (repo / HISTORY / name).read_text().splitlines() if line.startswith("# ")), name)
        lines.append(f"- [{name.removesuffix('.md')}]({name}): {heading}")
    return "\n".join(lines) + "\n"


# -- pages -------------------------------------------------------------------------------------

def rest_page(schema: dict) -> str:
    intro = [
        "# REST API reference",
        "",
        "Every route under `/api/v1/`, generated when this site was built from the OpenAPI schema the server serves at "
        "`/api/schema/` (drf-spectacular; the same schema as a file: [openapi.json](openapi.json); browsable on a running "
        "server at `/api/docs/`). The contract in prose, with the wire shapes scripts may rely on, is the "
        "[API contract](../api.md); the same calls from a shell are in [the REST API with curl](curl.md).",
        "",
        "Scripts authenticate with `Authorization: Bearer kiln_pat_…` (an API token); the browser UI uses its session and "
        "CSRF. Errors are JSON `{\"error\", \"code\"}` with a 4xx status for bad input. Where a field's type reads *any "
        "JSON*, the schema leaves its shape open (a variant's build options, a runtime's settings); the API contract says what "
        "it holds.",
    ]
    return render_page(schema, REST_PREFIX, intro)


def agent_page(schema: dict) -> str:
    intro = [
        "# Agent protocol reference",
        "",
        "The calls a device agent makes under `/api/agent/v1/`, generated when this site was built from the server's OpenAPI "
        "schema ([openapi.json](openapi.json)). Agents authenticate with `Authorization: Bearer kiln_agt_…`, the token "
        "`register` returned; the protocol's rules (pull only, leases, attempts, retries) are in the "
        "[API contract](../api.md#agent-protocol-apiagentv1).",
    ]
    return render_page(schema, AGENT_PREFIX, intro)


def render_page(schema: dict, prefix: str, intro: list[str]) -> str:
    components = schema.get("components", {}).get("schemas", {})
    groups: dict[str, list[tuple[str, str, dict]]] = {}
    for path, item in sorted(schema["paths"].items()):
        if not path.startswith(prefix):
            continue
        group = path[len(prefix):].split("/", 1)[0] or "root"
        for method in METHODS:
            if method in item:
                groups.setdefault(group, []).append((path, method, item[method]))
    lines = [*intro, ""]
    used: set[str] = set()
    for group, operations in groups.items():
        lines += [f"## {group.replace('-', ' ').capitalize()}", ""]
        for path, method, operation in operations:
            lines += operation_lines(path, method, operation, used)
    lines += ["## Schemas", "", "The bodies the routes above take and answer with.", ""]
    for name in sorted(schema_closure(used, components)):
        lines += schema_lines(name, components[name])
    return "\n".join(lines) + "\n"


def operation_lines(path: str, method: str, operation: dict, used: set[str]) -> list[str]:
    lines = [f"### `{method.upper()} {path}` {{ #{operation['operationId']} }}", ""]
    if operation.get("description"):
        lines += [operation["description"].strip(), ""]
    parameters = operation.get("parameters", [])
    if parameters:
        lines += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for parameter in parameters:
            lines.append(row(f"`{parameter['name']}`", parameter["in"], type_text(parameter.get("schema", {}), used),
                             "yes" if parameter.get("required") else "no", parameter.get("description", "")))
        lines.append("")
    body = operation.get("requestBody")
    if body:
        kinds = ", ".join(f"`{kind}`" for kind in body.get("content", {}))
        first = next(iter(body.get("content", {}).values()), {})
        required = "required" if body.get("required") else "optional"
        lines += [f"Request body ({required}; {kinds}): {type_text(first.get('schema', {}), used)}", ""]
    lines += ["| status | body | description |", "|---|---|---|"]
    for status, response in operation.get("responses", {}).items():
        content = response.get("content", {})
        bodies = "; ".join(f"`{kind}` {type_text(value.get('schema', {}), used)}" for kind, value in content.items()) or "none"
        lines.append(row(status, bodies, response.get("description", "")))
    return lines + [""]


def schema_lines(name: str, schema: dict) -> list[str]:
    lines = [f"### {name} {{ #schema-{name.lower()} }}", ""]
    if schema.get("description"):
        lines += [schema["description"].strip(), ""]
    if "enum" in schema:
        return lines + [f"One of {', '.join(f'`{value}`' for value in schema['enum'])}.", ""]
    properties = schema.get("properties")
    if not properties:
        return lines + [f"Type: {type_text(schema, set())}.", ""]
    required = set(schema.get("required", []))
    lines += ["| field | type | required | description |", "|---|---|---|---|"]
    for field, spec in properties.items():
        lines.append(row(f"`{field}`", type_text(spec, set()), "yes" if field in required else "no", describe(spec)))
    return lines + [""]


def schema_closure(names: set[str], components: dict) -> set[str]:
    """The named schemas, and every schema they refer to, transitively."""
    seen: set[str] = set()
    pending = list(names)
    while pending:
        name = pending.pop()
        if name in seen or name not in components:
            continue
        seen.add(name)
        pending.extend(references(components[name]))
    return seen


def references(node) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"].rsplit("/", 1)[-1]] if "$ref" in node else []
        return found + [name for value in node.values() for name in references(value)]
    if isinstance(node, list):
        return [name for value in node for name in references(value)]
    return []


# -- types and cells ---------------------------------------------------------------------------

def type_text(schema: dict, used: set[str]) -> str:
    """A schema in a few words: a link for a named schema, `array of …`, a type with its format."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        used.add(name)
        return f"[{name}](#schema-{name.lower()})"
    for combinator, joiner in (("oneOf", " or "), ("anyOf", " or "), ("allOf", " and ")):
        if combinator in schema:
            text = joiner.join(type_text(part, used) for part in schema[combinator])
            return text + (" or null" if schema.get("nullable") else "")
    kind = schema.get("type")
    if kind == "array":
        text = f"array of {type_text(schema.get('items', {}), used)}"
    elif kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        text = f"object of {type_text(schema['additionalProperties'], used)}"
    elif kind:
        text = f"{kind} ({schema['format']})" if schema.get("format") else kind
    else:
        text = "any JSON"
    return text + (" or null" if schema.get("nullable") else "")


def describe(spec: dict) -> str:
    """A field's description followed by its constraints, as the schema states them."""
    notes = []
    if spec.get("readOnly"):
        notes.append("read-only")
    if spec.get("writeOnly"):
        notes.append("write-only")
    if "enum" in spec:
        notes.append("one of " + ", ".join(f"`{value}`" for value in spec["enum"] if value is not None))
    for key, label in (("minimum", "at least"), ("maximum", "at most"), ("minLength", "length at least"),
                       ("maxLength", "length at most"), ("minItems", "items at least"), ("maxItems", "items at most")):
        if key in spec and spec[key] not in INT64_BOUNDS:
            notes.append(f"{label} {spec[key]}")
    if "pattern" in spec:
        notes.append(f"pattern `{spec['pattern']}`")
    if "default" in spec:
        notes.append(f"default `{json.dumps(spec['default'])}`")
    text = spec.get("description", "").strip()
    return "; ".join(part for part in [text, ", ".join(notes)] if part)


def row(*cells: str) -> str:
    return "| " + " | ".join(cell_text(cell) for cell in cells) + " |"


def cell_text(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\r", "").replace("\n\n", "<br>").replace("\n", " ")
