"""The documentation site: it builds strictly, fetches nothing from elsewhere, documents every setting, and the README
stays a landing page whose links resolve and whose old sections all have a home in docs/."""
from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

from tests.docs.conftest import REPO, mkdocs_build

DOCS = REPO / "docs"
README = REPO / "README.md"
# What the code reads: settings and the modules they use, the workers, the agent, the client.
CODE_READING_SETTINGS = [REPO / "platform" / "kiln", REPO / "workers", REPO / "devices", REPO / "kiln_contract", REPO / "kiln_client"]
# Where a documented variable may be read besides the code above (the tests' own settings, the Makefile, CI, compose).
OTHER_READERS = [REPO / "tests", REPO / "Makefile", REPO / ".ci" / "run", REPO / "docker-compose.yml", REPO / "Dockerfile",
                 REPO / "distributions"]
VARIABLE = re.compile(r"^(KILN_[A-Z0-9_]*[A-Z0-9]|DATABASE_URL|REDIS_URL|CELERY_BROKER_URL)$")
README_MAX_LINES = 250


# -- the build ---------------------------------------------------------------------------------

def test_the_site_builds_with_every_page_and_the_generated_references(built_site):
    for page in ["index.html", "getting-started/index.html", "guides/browser/index.html", "guides/cli/index.html",
                 "guides/devices/index.html", "guides/datasets/index.html", "guides/pytorch/index.html",
                 "guides/quantization/index.html", "guides/accuracy/index.html", "guides/measurement/index.html",
                 "api/index.html", "configuration/index.html", "several-hosts/index.html", "operations/backups/index.html",
                 "operations/upgrades/index.html", "tensorrt/index.html", "security/index.html", "threat-model/index.html",
                 "benchmarks/index.html", "benchmarks/results/index.html", "status/index.html", "search/search_index.json"]:
        assert (built_site / page).is_file(), page
    schema = json.loads((built_site / "reference" / "openapi.json").read_text())
    rest = (built_site / "reference" / "rest-api" / "index.html").read_text()
    agent = (built_site / "reference" / "agent-api" / "index.html").read_text()
    for path, item in schema["paths"].items():
        page = agent if path.startswith("/api/agent/v1/") else rest
        for method in item:
            if method in ("get", "post", "put", "patch", "delete"):
                assert f'id="{item[method]["operationId"]}"' in page, f"{method.upper()} {path} is not in the reference"
    # The schemas the routes take are described field by field, e.g. the job a script creates.
    assert 'id="schema-jobcreaterequest"' in rest and "budget_minutes" in rest
    assert "/api/agent/v1/tasks/lease" in agent and "/api/v1/jobs/" not in agent
    # RESULTS.md is included whole, with the anchors the benchmarks page links to.
    assert 'id="real-pretrained-models-issue-8"' in (built_site / "benchmarks" / "results" / "index.html").read_text()


def test_superseded_benchmark_runs_have_a_page_per_date_that_the_results_link_to(built_site):
    """benchmarks/history/<date>.md is on the site beside the current results, listed oldest first under Earlier runs."""
    dates = sorted(path.stem for path in (REPO / "benchmarks" / "history").glob("*.md"))
    assert dates, "no superseded runs in benchmarks/history/"
    results = (built_site / "benchmarks" / "results" / "index.html").read_text()
    index = (built_site / "benchmarks" / "history" / "index.html").read_text()
    for date in dates:
        assert (built_site / "benchmarks" / "history" / date / "index.html").is_file(), date
        assert f'href="../history/{date}/' in results, f"the results page does not link to {date}"
    assert [index.index(f'href="{date}/') for date in dates] == sorted(index.index(f'href="{date}/') for date in dates)
    # A link from the repository's files to docs/ is re-pointed at the site's page, anchor kept.
    assert 'href="../../threat-model/#6-fuzzed-parsers"' in results


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    """--strict with anchor validation: the CI build would refuse a page that links to nothing."""
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copytree(DOCS, copy / "docs")
    for shared in ("platform", "workers", "devices", "benchmarks"):
        (copy / shared).symlink_to(REPO / shared, target_is_directory=True)
    with (copy / "docs" / "guides" / "cli.md").open("a") as page:
        page.write("\nSee [the tolerance](accuracy.md#no-such-heading).\n")
    result = mkdocs_build(copy / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-heading" in result.stdout + result.stderr


def test_nothing_is_fetched_from_another_origin(built_site):
    """Scripts, styles, images, fonts and frames all come from the site itself: it works offline, under the strict CSP."""
    remote = re.compile(r"""(?:https?:)?//[^\s"')]+""")
    for page in built_site.rglob("*.html"):
        html = page.read_text()
        for tag, attribute in (("script", "src"), ("link", "href"), ("img", "src"), ("iframe", "src"), ("source", "src")):
            for value in re.findall(rf"<{tag}\b[^>]*\b{attribute}=\"([^\"]*)\"", html):
                assert not remote.match(value), f"{page.relative_to(built_site)} loads {value}"
    for sheet in built_site.rglob("*.css"):
        css = sheet.read_text()
        for value in re.findall(r"""@import\s+(?:url\()?["']?([^"')\s;]+)|url\(["']?([^"')]+)""", css):
            target = value[0] or value[1]
            assert not remote.match(target) or target.startswith("http://www.w3.org/2000/svg"), f"{sheet.name} loads {target}"
    assert not any("fonts.googleapis" in page.read_text() for page in built_site.rglob("*.html"))


# -- configuration -----------------------------------------------------------------------------

def variables_read(roots: list[Path]) -> set[str]:
    """Every string constant in the Python code under `roots` that names an environment variable Kiln reads."""
    names = set()
    for root in roots:
        for source in root.rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and VARIABLE.match(node.value):
                    names.add(node.value)
    return names


def documented_variables() -> set[str]:
    """The variables named in the first column of the configuration page's tables."""
    names = set()
    for line in (DOCS / "configuration.md").read_text().splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            names.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", first_cell))
    return names


def test_every_variable_the_code_reads_is_documented():
    missing = variables_read(CODE_READING_SETTINGS) - documented_variables()
    assert not missing, f"not on docs/configuration.md: {sorted(missing)}"


def test_every_documented_variable_is_read_somewhere():
    readers = " ".join(path.read_text(errors="replace") for root in OTHER_READERS if root.exists()
                       for path in ([root] if root.is_file() else root.rglob("*")) if path.is_file() and path.suffix in ("", ".py", ".yml", ".toml", ".sh"))
    stale = {name for name in documented_variables() - variables_read(CODE_READING_SETTINGS) if name not in readers}
    assert not stale, f"documented but read nowhere: {sorted(stale)}"


# -- the README --------------------------------------------------------------------------------

def markdown_links(text: str) -> list[str]:
    without_code = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return re.findall(r"\]\(([^)\s]+)\)", without_code)


def heading_anchors(markdown: str) -> set[str]:
    """The anchors Python-Markdown's toc (and GitHub, for these headings) gives a page's headings."""
    from markdown.extensions.toc import slugify

    without_code = re.sub(r"```.*?```", "", markdown, flags=re.DOTALL)
    return {slugify(re.sub(r"[`*]", "", title), "-") for title in re.findall(r"^#{1,6} (.+?)\s*$", without_code, flags=re.MULTILINE)}


def test_the_readme_is_a_landing_page():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    for expected in ("make up", "make test", "/docs/", "Five minutes", "What works today", "Not yet"):
        assert expected in text


def test_every_link_in_the_readme_resolves():
    links = markdown_links(README.read_text())
    assert len(links) >= 20
    for link in links:
        assert not link.startswith(("http://", "https://")), f"the README links outside the repository: {link}"
        path, _, anchor = link.partition("#")
        target = (REPO / path).resolve()
        assert target.is_file(), f"README links to {link}, which does not exist"
        if anchor:
            assert anchor in heading_anchors(target.read_text()), f"README links to {link}: no such heading"


# Where each section of the README as it was before the docs site (1,732 lines) now lives, with a phrase that shows it.
README_SECTIONS = {
    "The two commands": ("getting-started.md", "tests/run_shards.py"),
    "Three installables": ("getting-started.md", "`pip install kiln-client` installs no ONNX Runtime or OpenVINO"),
    "Walk-through (browser)": ("guides/browser.md", "**Compare** puts two"),
    "Walk-through (command line)": ("guides/cli.md", "kiln perf --estimate 2"),
    "Adding a device": ("guides/devices.md", "loginctl enable-linger"),
    "Agents on Arm64": ("guides/devices.md", "qemu-aarch64-static"),
    "Operator support before compiling": ("guides/devices.md", "record_ep_graph_assignment_info"),
    "Phones and boards: LiteRT": ("guides/devices.md", "Why LiteRT rather than ExecuTorch"),
    "PyTorch models": ("guides/pytorch.md", "KILN_SANDBOX_ALLOW_UNCONFINED=true"),
    "Quantization that learns": ("guides/quantization.md", "Learned rounding (AdaRound)"),
    "Accuracy that fits the model": ("guides/accuracy.md", "kiln.metrics"),
    "Configuration": ("configuration.md", "KILN_STORAGE_QUOTA_BYTES"),
    "Architecture": ("architecture.md", "Libraries we rely on rather than rewrite"),
    "Security": ("security.md", "created_by_token"),
    "Benchmarks": ("benchmarks/index.md", "Agent harness overhead"),
    "What works today": ("status.md", "Fleet at scale"),
    "What works today: the search": ("guides/quantization.md", "budget_minutes"),
    "What works today: datasets": ("guides/datasets.md", "calibration_subset"),
    "What works today: measurements": ("guides/measurement.md", "KILN_RETIME_MAX_ROUNDS"),
    "Not yet": ("status.md", "A per-package encryption key"),
    "Appendix: the REST API with curl": ("reference/curl.md", "create_api_token"),
}


def test_every_section_of_the_old_readme_has_a_home():
    for section, (page, phrase) in README_SECTIONS.items():
        assert phrase in (DOCS / page).read_text(), f"{section}: {phrase!r} is not in docs/{page}"
