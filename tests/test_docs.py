"""Acceptance 5 (issue 10): README.md and docs/ name only settings, routes, files and metrics that
exist, and the code cites no documentation that lives outside the repository.

- Settings: the settings table of docs/operations.md lists exactly the environment variables
  `GatewaySettings` reads (derived from `model_fields`, nested models recursively: a nested field
  is both `LORAGATE_FIELD` as JSON and `LORAGATE_FIELD__SUB`), with the code's defaults; every
  `LORAGATE_*` named anywhere in README.md or docs/ exists.
- Routes: every route the gateway app serves is listed in docs/openai-api.md and every route of
  the engine server in docs/tokens-api.md (written "`GET /v1/models`"); every route the docs
  name exists.
- Files: every repository path in backticks (or a relative link) in README.md and docs/ exists.
- Metrics: the metrics tables of docs/operations.md list exactly what the gateway and the engine
  export; every metric named anywhere in the docs exists.
- Docstrings: no module under engine/, gateway/, tenancy/, lora/, kernels/ or bench/ cites
  `spec/`, `../shared` or the team's working notes (DESIGN.md, STYLE.md, SECURITY.md): readers
  of the repository never see them; docs/ is the documentation.

Each failure names exactly what is missing or extra, with the file and line where it applies.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from gateway.settings import GatewaySettings

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
OPERATIONS = DOCS / "operations.md"
OPENAI_API = DOCS / "openai-api.md"
TOKENS_API = DOCS / "tokens-api.md"

# Packages whose modules must not cite material outside the repository.
CODE_PACKAGES = ("engine", "gateway", "tenancy", "lora", "kernels", "bench")
OUTSIDE_DOCS = re.compile(
    r"(?<![\w-])spec/|\.\./shared|(?<![\w-])shared/spec\b|\b(?:DESIGN|STYLE|SECURITY)\.md\b"
)

HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
ROUTE_MENTION = re.compile(r"`(" + "|".join(HTTP_METHODS) + r") (/[^`\s]*)`")
PATH_PARAM = re.compile(r"\{[^}]*\}")

# Paths that exist only once something has run (created at run time, ignored by git).
RUNTIME_PATHS = (".cache/", ".venv/", "data/", "bench/out/")
PATH_SUFFIXES = (".py", ".md", ".yml", ".yaml", ".toml")

ENV_MENTION = re.compile(r"LORAGATE_[A-Z0-9_]*")
METRIC_MENTION = re.compile(r"(?:loragate_(?:gateway|engine)_[a-z0-9_]*|vllm:[a-z0-9_:]+)\*?")
METRIC_SUFFIXES = ("", "_bucket", "_sum", "_count", "_created")


# ---- reading the docs -----------------------------------------------------------------------------


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def without_fences(text: str) -> str:
    """The text with fenced code blocks blanked (line numbers kept), so inline code pairs up."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else line)
    return "\n".join(out)


def inline_code(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, content) of every inline code span outside fenced blocks."""
    text = without_fences(path.read_text(encoding="utf-8"))
    for match in re.finditer(r"`([^`]+)`", text):
        yield text.count("\n", 0, match.start()) + 1, match.group(1)


def section(path: Path, heading: str) -> list[tuple[int, str]]:
    """(line number, line) of the `## heading` section, up to the next level-2 heading."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[tuple[int, str]] = []
    inside = False
    for number, line in enumerate(lines, start=1):
        if line.startswith("## "):
            inside = line[3:].strip() == heading
            continue
        if inside:
            out.append((number, line))
    assert out, f"{rel(path)} has no '## {heading}' section"
    return out


def cells(line: str) -> list[str]:
    """A markdown table row's cells (`\\|` is a literal bar)."""
    parts = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [part.strip().replace("\\|", "|") for part in parts]


def first_cell_names(rows: list[tuple[int, str]], pattern: str) -> dict[str, list[tuple[int, str]]]:
    """name -> [(line, other cells joined)] for table rows whose first cell is one `name`."""
    found: dict[str, list[tuple[int, str]]] = {}
    for number, line in rows:
        if not line.lstrip().startswith("|"):
            continue
        row = cells(line)
        match = re.fullmatch(r"`(" + pattern + r")`", row[0])
        if match:
            found.setdefault(match.group(1), []).append((number, "|".join(row[1:])))
    return found


# ---- settings -------------------------------------------------------------------------------------


def _nested_models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field holds directly (itself, or inside an Optional / union).
    Models inside lists, tuples or dicts are not separate variables: the field is JSON."""
    members = [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = list(typing.get_args(annotation))
    return [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]


def settings_variables() -> dict[str, FieldInfo]:
    """Every environment variable GatewaySettings reads -> its field."""
    config = GatewaySettings.model_config
    prefix = str(config.get("env_prefix", "")).upper()
    delimiter = config.get("env_nested_delimiter") or "__"
    found: dict[str, FieldInfo] = {}

    def walk(model: type[BaseModel], head: str) -> None:
        for name, field in model.model_fields.items():
            variable = head + name.upper()
            if head == prefix and isinstance(field.validation_alias, str):
                variable = field.validation_alias.upper()  # an alias replaces the prefix
            found[variable] = field
            for nested in _nested_models(field.annotation):
                walk(nested, variable + delimiter)

    walk(GatewaySettings, prefix)
    return found


def documented_settings() -> dict[str, list[tuple[int, str]]]:
    return first_cell_names(section(OPERATIONS, "Settings"), r"LORAGATE_[A-Z0-9_]+")


def default_text(field: FieldInfo) -> str:
    """The default as the table writes it (used to suggest rows for missing settings)."""
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "the fields below"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict | list | tuple):
        return f"`{json.dumps(_jsonable(value))}`"
    return f"`{value}`"


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def default_mismatch(cell: str, field: FieldInfo) -> str | None:
    """Why a default cell disagrees with the code, or None.

    `required` must match a required field (and a required field must say so); a cell starting
    with `unset` means a default of None; a cell starting with a `literal` is compared with the
    code's default by type; other text (e.g. "from the checkpoint") is not compared."""
    cell = cell.strip()
    if field.is_required() or cell == "required":
        if field.is_required() and cell == "required":
            return None
        return "the code has no default" if field.is_required() else "the code has a default"
    default = field.get_default(call_default_factory=True)
    if cell.startswith("unset"):
        return None if default is None else f"the code's default is {default!r}, not unset"
    literal = re.match(r"`([^`]*)`", cell)
    if literal is None:
        return None
    text = literal.group(1)
    if isinstance(default, SecretStr | BaseModel):
        return None
    if default is None:
        ok = False
    elif isinstance(default, bool):
        ok = text == str(default).lower()
    elif isinstance(default, int | float):
        try:
            ok = float(text) == float(default)
        except ValueError:
            ok = False
    elif isinstance(default, Path):
        ok = Path(text) == default
    elif isinstance(default, dict | list | tuple):
        try:
            ok = json.loads(text) == _jsonable(default)
        except ValueError:
            ok = False
    else:
        ok = text == str(default)
    return None if ok else f"the table says {text!r}; the code's default is {default!r}"


def test_settings_table_lists_exactly_the_settings() -> None:
    actual = settings_variables()
    documented = documented_settings()
    missing = sorted(set(actual) - set(documented))
    extra = sorted(set(documented) - set(actual))
    twice = sorted(name for name, rows in documented.items() if len(rows) > 1)
    problems = []
    if missing:
        rows = "\n".join(f"  | `{v}` | {default_text(actual[v])} | ... |" for v in missing)
        problems.append(f"settings missing from {rel(OPERATIONS)} (add rows like):\n{rows}")
    if extra:
        lines = "\n".join(f"  line {documented[v][0][0]}: {v}" for v in extra)
        problems.append(f"{rel(OPERATIONS)} lists settings the code does not read:\n{lines}")
    if twice:
        problems.append(f"listed more than once: {', '.join(twice)}")
    assert not problems, "\n".join(problems)


def test_settings_table_defaults_match_the_code() -> None:
    actual = settings_variables()
    wrong = []
    for variable, rows in sorted(documented_settings().items()):
        if variable not in actual:
            continue  # reported by the test above
        line, rest = rows[0]
        reason = default_mismatch(cells(rest)[0], actual[variable])
        if reason is not None:
            wrong.append(f"  line {line}: {variable}: {reason}")
    assert not wrong, f"defaults in {rel(OPERATIONS)} disagree with the code:\n" + "\n".join(wrong)


def test_every_setting_named_in_the_docs_exists() -> None:
    from tenancy.admin_cli.profile import ENVIRONMENT  # the admin CLI's, not the gateway's

    actual = set(settings_variables()) | set(ENVIRONMENT)
    unknown = []
    for path in doc_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for name in ENV_MENTION.findall(line):
                if name.endswith("_"):  # a prefix (`LORAGATE_*`, `LORAGATE_ENGINE__*`)
                    ok = any(v.startswith(name) for v in actual)
                else:
                    ok = name in actual
                if not ok:
                    unknown.append(f"  {rel(path)}:{number}: {name}")
    assert not unknown, "settings named in the docs that the code does not read:\n" + "\n".join(
        unknown
    )


# ---- routes ---------------------------------------------------------------------------------------


def normalize_route(method: str, path: str) -> tuple[str, str]:
    """Path parameters compare by position only (`{model_id:path}` and `{id}` are `{}`)."""
    return method.upper(), PATH_PARAM.sub("{}", path.split("?", 1)[0])


def app_routes(app: FastAPI) -> set[tuple[str, str]]:
    """Every (method, path) the app serves: its OpenAPI schema (every included router, whatever
    FastAPI's internal route types) plus any plain route mounted on the app itself."""
    routes = {
        normalize_route(method, path)
        for path, operations in app.openapi().get("paths", {}).items()
        for method in operations
        if method.upper() in HTTP_METHODS
    }
    for route in app.routes:
        path, methods = getattr(route, "path", None), getattr(route, "methods", None)
        if isinstance(path, str) and methods:
            routes |= {normalize_route(m, path) for m in methods if m in HTTP_METHODS}
    return routes


@pytest.fixture(scope="module")
def gateway_routes(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> set:
    from gateway.app import create_app

    tmp = tmp_path_factory.mktemp("docs-gateway")
    settings = GatewaySettings(
        model=tiny_model_dir,
        key_pepper=SecretStr(secrets.token_urlsafe(32)),
        salt_secret=SecretStr(secrets.token_urlsafe(32)),
        database_url=f"sqlite+aiosqlite:///{tmp / 'docs.db'}",
        adapter_store_dir=tmp / "adapters",
    )
    return app_routes(create_app(settings))  # the lifespan never runs: nothing is loaded


@pytest.fixture(scope="module")
def engine_routes() -> set:
    """The engine server's app, built around a stand-in engine (no model is loaded); if its
    factory ever needs more, the routes of every APIRouter in engine/server.py."""
    from fastapi import APIRouter

    import engine.server as server

    stand_in = types.SimpleNamespace(model_name="docs", stats=lambda: None, config=None)
    try:
        app = server.create_app(stand_in)  # type: ignore[arg-type]
    except (TypeError, AttributeError):
        app = FastAPI()
        for router in vars(server).values():
            if isinstance(router, APIRouter):
                app.include_router(router)
    return app_routes(app)


def route_mentions(path: Path) -> list[tuple[int, tuple[str, str], str]]:
    return [
        (number, normalize_route(*m.groups()), f"{m.group(1)} {m.group(2)}")
        for number, code in inline_code(path)
        for m in [ROUTE_MENTION.fullmatch(f"`{code}`")]
        if m is not None
    ]


def _undocumented(routes: set[tuple[str, str]], doc: Path, what: str) -> None:
    named = {route for _, route, _ in route_mentions(doc)}
    missing = sorted(routes - named)
    listing = "\n".join(f"  `{method} {path}`" for method, path in missing)
    assert not missing, f"{what} routes missing from {rel(doc)}:\n{listing}"


def test_every_gateway_route_is_documented(gateway_routes: set) -> None:
    _undocumented(gateway_routes, OPENAI_API, "gateway")


def test_every_engine_route_is_documented(engine_routes: set) -> None:
    _undocumented(engine_routes, TOKENS_API, "engine server")


def test_every_route_the_docs_name_exists(gateway_routes: set, engine_routes: set) -> None:
    """docs/openai-api.md names gateway routes, docs/tokens-api.md engine routes, and every
    other page either."""
    serving = {OPENAI_API: gateway_routes, TOKENS_API: engine_routes}
    unknown = []
    for path in doc_files():
        routes = serving.get(path, gateway_routes | engine_routes)
        for number, route, written in route_mentions(path):
            if route not in routes:
                unknown.append(f"  {rel(path)}:{number}: `{written}`")
    assert not unknown, "routes named in the docs that are not served:\n" + "\n".join(unknown)


# ---- files ----------------------------------------------------------------------------------------


def repository_path(code: str) -> str | None:
    """The repository path an inline code span names, or None if it is not one."""
    text = code.strip()
    if not text or any(c in text for c in " <>{}=$\"'") or "://" in text:
        return None
    if text.startswith(("/", "-", "~")):
        return None  # a URL path, a flag, a home directory: not the repository
    candidate = text.removeprefix("./")
    if candidate.startswith(RUNTIME_PATHS):
        return None
    if text.startswith("../") or candidate.endswith(PATH_SUFFIXES):
        return text
    if "/" in candidate and (ROOT / candidate.split("/", 1)[0]).exists():
        return text  # under a top-level entry of the repository
    return None


def _slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    lines = without_fences(path.read_text(encoding="utf-8")).splitlines()
    return {_slug(line.lstrip("#")) for line in lines if re.match(r"#{1,6} ", line)}


def test_every_file_the_docs_name_exists() -> None:
    missing = []
    for doc in doc_files():
        for number, code in inline_code(doc):
            name = repository_path(code)
            if name is None:
                continue
            target = (ROOT / name).resolve() if not name.startswith("../") else None
            exists = target is not None and (
                any(ROOT.glob(name)) if "*" in name else target.exists()
            )
            if not exists:
                missing.append(f"  {rel(doc)}:{number}: `{code}`")
        text = without_fences(doc.read_text(encoding="utf-8"))
        for match in re.finditer(r"\]\(([^)\s]+)\)", text):
            link = match.group(1)
            if re.match(r"[a-z]+:", link):
                continue  # http:, https:, mailto:
            number = text.count("\n", 0, match.start()) + 1
            file_part, _, anchor = link.partition("#")
            target = (doc.parent / file_part).resolve() if file_part else doc
            if not target.exists() or ROOT not in (target, *target.parents):
                missing.append(f"  {rel(doc)}:{number}: link ({link})")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                missing.append(f"  {rel(doc)}:{number}: link ({link}): no such heading")
    assert not missing, (
        "paths named in the docs that do not exist in the repository:\n" + "\n".join(missing)
    )


# ---- metrics --------------------------------------------------------------------------------------


def _zeros(cls: type) -> dict[str, Any]:
    """Zero for every required field of a stats dataclass."""
    return {
        f.name: 0
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }


def exported_metrics() -> set[str]:
    """The names a scrape shows: counters with `_total`, gauges and histograms as named."""
    from engine.metrics import EngineMetrics
    from engine.outputs import EngineStats, LoRAStats
    from gateway.metrics import GatewayMetrics

    stats = EngineStats(**{**_zeros(EngineStats), "lora": LoRAStats(**_zeros(LoRAStats))})
    registries = [
        GatewayMetrics(max_tenants=1, max_models=1).registry,
        EngineMetrics(model_name="docs", stats=lambda: stats).registry,
    ]
    return {
        family.name + ("_total" if family.type == "counter" else "")
        for registry in registries
        for family in registry.collect()
    }


def test_metrics_tables_list_exactly_the_exported_metrics() -> None:
    actual = exported_metrics()
    documented = first_cell_names(section(OPERATIONS, "Metrics"), r"[a-z_:][a-z0-9_:]*")
    missing = sorted(actual - set(documented))
    extra = sorted(set(documented) - actual)
    problems = []
    if missing:
        problems.append(f"metrics missing from {rel(OPERATIONS)}: {', '.join(missing)}")
    if extra:
        lines = ", ".join(f"{m} (line {documented[m][0][0]})" for m in extra)
        problems.append(f"{rel(OPERATIONS)} lists metrics nothing exports: {lines}")
    assert not problems, "\n".join(problems)


def test_every_metric_the_docs_name_exists() -> None:
    names = {name + suffix for name in exported_metrics() for suffix in METRIC_SUFFIXES}
    unknown = []
    for path in doc_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for mention in METRIC_MENTION.findall(line):
                if mention.endswith(("*", "_")):  # a prefix: `loragate_engine_adapter*`
                    ok = any(n.startswith(mention.rstrip("*")) for n in names)
                else:
                    ok = mention in names
                if not ok:
                    unknown.append(f"  {rel(path)}:{number}: {mention}")
    assert not unknown, "metrics named in the docs that nothing exports:\n" + "\n".join(unknown)


# ---- the code cites only what the repository holds --------------------------------------------


def test_no_module_cites_documentation_outside_the_repository() -> None:
    offenders = []
    for package in CODE_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            for number, line in enumerate(text.splitlines(), start=1):
                if OUTSIDE_DOCS.search(line):
                    offenders.append(f"  {rel(path)}:{number}: {line.strip()}")
    assert not offenders, (
        "modules cite documentation outside the repository (cite docs/*.md instead):\n"
        + "\n".join(offenders)
    )
