"""`loragate admin bootstrap`: migrates, creates the first admin key, prints it once."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest
from tenancy_factories import SecretRegistry

from gateway.cli import build_parser
from tenancy.auth.key_format import KeyMinter
from tenancy.auth.key_verify import KeyCache, KeyVerifier
from tenancy.auth.scopes import Scope
from tenancy.sql.session import make_engine, make_sessionmaker


def test_bootstrap_prints_a_working_admin_key_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    secret_registry: SecretRegistry,
) -> None:
    pepper = secrets.token_urlsafe(32)
    url = f"sqlite+aiosqlite:///{tmp_path / 'sub' / 'lg.db'}"
    monkeypatch.setenv("LORAGATE_DATABASE_URL", url)
    monkeypatch.setenv("LORAGATE_KEY_PEPPER", pepper)
    monkeypatch.setenv("LORAGATE_SALT_SECRET", secrets.token_urlsafe(32))
    args = build_parser().parse_args(["admin", "bootstrap"])
    assert args.handler(args) == 0
    out = capsys.readouterr()
    key = secret_registry.add(out.out.strip())
    assert key.startswith("lg_") and "shown once" in out.err

    async def verify() -> frozenset[Scope]:
        engine = make_engine(url)
        verifier = KeyVerifier(
            minter=KeyMinter(prefix="lg", pepper=pepper.encode()),
            sessionmaker=make_sessionmaker(engine),
            cache=KeyCache(1.0),
        )
        scopes = (await verifier.verify(key)).scopes
        await engine.dispose()
        return scopes

    assert asyncio.run(verify()) == frozenset({Scope.ADMIN})
    # A second bootstrap refuses rather than minting admin keys silently.
    assert args.handler(args) == 1
    assert "admin key exists" in capsys.readouterr().err


def test_unsafe_settings_are_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LORAGATE_KEY_PEPPER", "changeme")
    monkeypatch.setenv("LORAGATE_SALT_SECRET", "changeme")
    args = build_parser().parse_args(["admin", "bootstrap"])
    assert args.handler(args) == 2
    err = capsys.readouterr().err
    assert "key_pepper" in err and "changeme" not in err


def test_missing_secrets_say_what_and_where_the_demo_keeps_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("LORAGATE_KEY_PEPPER", raising=False)
    monkeypatch.delenv("LORAGATE_SALT_SECRET", raising=False)
    args = build_parser().parse_args(["admin", "bootstrap"])
    assert args.handler(args) == 2
    err = capsys.readouterr().err
    assert "LORAGATE_KEY_PEPPER" in err and "--dir .cache/demo" in err
    assert ".cache/demo/secrets.env" in err
    # A state directory that nothing created yet: said so, not a stack trace.
    args = build_parser().parse_args(["admin", "bootstrap", "--dir", str(tmp_path / "none")])
    assert args.handler(args) == 2
    assert "loragate demo" in capsys.readouterr().err
