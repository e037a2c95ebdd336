"""The docs: the site (mkdocs.yml, docs/) builds with `--strict`, so a broken link, a
missing anchor or a page left out of the nav fails the suite; the README stays a short
front page whose links lead somewhere; and every `curl` example in the README and the
docs names a route and method that the API's OpenAPI document has, with a JSON body that
parses. The document is the app's own, built in this process (no server, no Redis)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from api.app import create_app
from harness.inprocess import inprocess_settings
from tuning.deployment import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 300
SHELL_FENCES = {"sh", "bash", "shell", "console"}
HOSTS = ("localhost:8000", "127.0.0.1:8000")
WHOLE_PATH_PARAMS = {"key"}
"""Path parameters that take the rest of the path, slashes included (`/v1/files/{key:path}`
in api/routes/files.py); every other parameter is one segment."""
BODY_OPTIONS = {"-d", "--data", "--data-raw", "--data-binary", "--json"}
FORM_OPTIONS = {"-F", "--form"}
METHOD_OPTIONS = {"-X", "--request"}
VALUE_OPTIONS = {
    *BODY_OPTIONS,
    *FORM_OPTIONS,
    *METHOD_OPTIONS,
    *("-H", "--header", "-o", "--output", "-u", "--user", "-w", "--write-out"),
}
"""curl's options that take a value (the next word); any other `-…` word is a flag."""
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


@dataclass(frozen=True)
class Curl:
    where: str
    """`FILE:LINE` of the command's first line."""
    words: tuple[str, ...]
    """curl's arguments, as the shell splits them."""

    def __str__(self) -> str:
        return self.where


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def shell_commands(block: str) -> Iterator[tuple[int, str]]:
    """Each command of a shell block with the offset of its first line: lines joined where
    a `\\` ends one or a quote is still open; comment lines skipped."""
    pending, first = "", 0
    for offset, line in enumerate(block.splitlines()):
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not pending:
            first = offset
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        yield first, pending.replace("\\\n", " ")
        pending = ""
    assert not pending, f"a shell block ends inside a command: {pending!r}"


def curls_in(command: str) -> Iterator[tuple[str, ...]]:
    """The arguments of each `curl` in a command line (`a; curl …`, `until curl …; do`)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    args: list[str] | None = None
    for word in lexer:
        if args is not None and re.fullmatch(r"[();<>|&]+", word):
            yield tuple(args)
            args = None
        elif args is not None:
            args.append(word)
        elif word == "curl":
            args = []
    if args is not None:
        yield tuple(args)


def curl_examples() -> list[Curl]:
    examples: list[Curl] = []
    for page in pages():
        text = page.read_text()
        for fence in FENCE.finditer(text):
            if fence.group("lang") not in SHELL_FENCES:
                continue
            start = text.count("\n", 0, fence.start("body")) + 1
            for offset, command in shell_commands(fence.group("body")):
                where = f"{page.relative_to(REPO)}:{start + offset}"
                examples += [Curl(where, words) for words in curls_in(command)]
    return examples


@dataclass
class Request:
    method: str
    path: str
    bodies: list[str]


def request_of(curl: Curl) -> Request:
    method: str | None = None
    urls: list[str] = []
    bodies: list[str] = []
    forms = False
    words = iter(curl.words)
    for word in words:
        if word in VALUE_OPTIONS:
            value = next(words, None)
            assert value is not None, f"{curl}: {word} without a value"
            if word in METHOD_OPTIONS:
                method = value.upper()
            bodies += [value] if word in BODY_OPTIONS else []
            forms = forms or word in FORM_OPTIONS
        elif not word.startswith("-"):
            urls.append(word)
    assert len(urls) == 1, f"{curl}: one URL expected, got {urls}"
    host = next((h for h in HOSTS if h in urls[0]), None)
    assert host, f"{curl}: the URL {urls[0]!r} is not at {' or '.join(HOSTS)}"
    path = re.split(r"[?#]", urls[0].split(host, 1)[1], maxsplit=1)[0] or "/"
    return Request(method or ("POST" if bodies or forms else "GET"), path, bodies)


def template_pattern(template: str) -> re.Pattern[str]:
    """`/v1/jobs/{job_id}/cancel` as a pattern: a parameter is one segment (ids and
    placeholders such as `job_…`), or the rest of the path (`WHOLE_PATH_PARAMS`)."""

    def parameter(match: re.Match[str]) -> str:
        return ".+" if match.group(1) in WHOLE_PATH_PARAMS else "[^/]+"

    return re.compile(re.sub(r"\\\{(\w+)\\\}", parameter, re.escape(template)))


EXAMPLES = curl_examples()


@pytest.fixture(scope="module")
def openapi(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The app's document, built without its lifespan: nothing connects to Redis."""
    settings = inprocess_settings("redis://127.0.0.1:1/0", tmp_path_factory.mktemp("data"))
    return create_app(settings).openapi()


def test_the_site_builds_with_strict_links_and_anchors(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "index.html").exists()
    assert (tmp_path / "console-overview.png").exists()


def test_the_readme_is_a_short_front_page_whose_links_lead_somewhere() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    targets = [m.group("target") for m in LINK.finditer(text)]
    local = [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:", t)]
    assert any(t.startswith("docs/") for t in local)
    missing = [t for t in local if t and not (REPO / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_there_are_curl_examples_to_check() -> None:
    where = {example.where.split(":")[0] for example in EXAMPLES}
    assert len(EXAMPLES) > 40 and "README.md" in where and "docs/api/jobs.md" in where


def test_whole_path_parameters_are_the_apis(openapi: dict[str, Any]) -> None:
    templates = " ".join(openapi["paths"])
    assert all(f"{{{name}}}" in templates for name in WHOLE_PATH_PARAMS)


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_each_curl_example_names_a_route_of_the_api(example: Curl, openapi: dict[str, Any]) -> None:
    request = request_of(example)
    methods = {
        method.upper()
        for template, operations in openapi["paths"].items()
        if template_pattern(template).fullmatch(request.path)
        for method in operations
    }
    assert request.method in methods, (
        f"{example}: {request.method} {request.path} is not in the OpenAPI document"
        f" (methods at that path: {sorted(methods) or 'none'})"
    )
    for body in request.bodies:
        try:
            json.loads(body)
        except ValueError as e:
            pytest.fail(f"{example}: the body is not JSON ({e}): {body}")


def python_examples() -> list[tuple[Path, str]]:
    """(page, code) of every ```python block of the README and the docs."""
    found = []
    for page in [README, *sorted(DOCS.rglob("*.md"))]:
        for code in re.findall(r"^```python\n(.*?)^```", page.read_text(), re.M | re.S):
            found.append((page, code))
    return found


def test_each_python_example_compiles_and_the_pipeline_one_is_the_source() -> None:
    """Every Python example parses; the pipeline a newcomer copies is `pipelines/noop.py`
    as it is (its classes, line for line). The client's example is run against a real
    deployment by tests/test_quickstart.py."""
    examples = python_examples()
    assert len(examples) >= 3
    for page, code in examples:
        compile(code, f"{page.relative_to(REPO)}", "exec")
    noop = (REPO / "pipelines" / "noop.py").read_text()
    (pipeline,) = [c for p, c in examples if p.name == "adding-a-pipeline.md"]
    assert pipeline.strip() in noop
    clients = [c for p, c in examples if "from mmq.client import Client" in c]
    assert clients, "the Python client's example is gone"
