"""The settings table of docs/operations.md lists exactly the environment variables the gateway
reads, with the code's defaults, and every `LORAGATE_*` the docs name exists (see
docs_reading.py for the whole suite)."""

from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from gateway.settings import GatewaySettings
from tests.docs.docs_reading import OPERATIONS, cells, doc_files, first_cell_names, rel, section

ENV_MENTION = re.compile(r"LORAGATE_[A-Z0-9_]*")


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
    from lora.remote.vllm_plugin import ENVIRONMENT as PLUGIN  # vLLM's plugin's (and engines')
    from tenancy.admin_cli.profile import ENVIRONMENT  # the admin CLI's, not the gateway's

    actual = set(settings_variables()) | set(ENVIRONMENT) | set(PLUGIN)
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
