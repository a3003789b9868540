"""Acceptance 3: keys hashed at rest, never logged, revocation across processes, rotation, scope."""

from __future__ import annotations

import datetime as dt
import logging
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncEngine
from tenancy_factories import ADMIN_CTX, SecretRegistry, make_key, make_tenant, utcnow

from tenancy.auth.key_format import KeyMinter, generate_key, is_well_formed
from tenancy.auth.key_verify import KeyCache, KeyVerifier
from tenancy.auth.principal import AuditContext, Principal
from tenancy.auth.scopes import Scope
from tenancy.crud.keys import list_keys, revoke_key, rotate_key
from tenancy.errors import InsufficientScope, InvalidApiKey, NotFound, ServiceUnavailable
from tenancy.ids import TenantId
from tenancy.sql.migrate import upgrade
from tenancy.sql.session import make_engine, make_sessionmaker

PEPPER = ("pepper-" + uuid.uuid4().hex).encode()
MINTER = KeyMinter(prefix="lg", pepper=PEPPER)
REPO = Path(__file__).resolve().parents[3]


class Clock:
    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self) -> dt.datetime:
        return self.now


@pytest.fixture
async def verifier(migrated_engine: AsyncEngine) -> AsyncIterator[tuple[KeyVerifier, Clock]]:
    clock = Clock()
    yield (
        KeyVerifier(
            minter=MINTER,
            sessionmaker=make_sessionmaker(migrated_engine),
            cache=KeyCache(ttl_s=1.0),
            now=clock,
        ),
        clock,
    )


@given(st.text(max_size=80))
def test_random_strings_are_not_keys(text: str) -> None:
    assert not is_well_formed(text, "lg")


@given(st.integers(min_value=3, max_value=51), st.sampled_from("0aZ9"))
def test_any_one_character_change_breaks_the_checksum(pos: int, char: str) -> None:
    key = generate_key("lg")
    assert is_well_formed(key, "lg") and len(key) == 52
    mutated = key[:pos] + char + key[pos + 1 :]
    assert mutated == key or not is_well_formed(mutated, "lg")


@pytest.mark.parametrize(
    "raw",
    [
        "' OR '1'='1",
        "lg_' UNION SELECT key_hash FROM api_keys --",
        "x" * 10_000,
        "lg_ключ" + "я" * 45,
        "",
        "Basic dXNlcjpwYXNz",
    ],
)
async def test_hostile_keys_are_refused_uniformly(
    verifier: tuple[KeyVerifier, Clock], raw: str
) -> None:
    with pytest.raises(InvalidApiKey) as info:
        await verifier[0].verify(raw)
    assert info.value.body()["error"]["message"] == "Incorrect API key provided."


async def test_no_clear_key_in_database_or_logs(
    migrated_engine: AsyncEngine,
    sqlite_url: str,
    verifier: tuple[KeyVerifier, Clock],
    secret_registry: SecretRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    logging.getLogger("sqlalchemy.engine").setLevel(logging.DEBUG)
    try:
        sm = make_sessionmaker(migrated_engine)
        created = []
        async with sm() as session:
            tenant = await make_tenant(session)
            for _ in range(5):
                created.append(await make_key(session, MINTER, tenant.id))
            rotated = await rotate_key(
                session, ctx=ADMIN_CTX, minter=MINTER, tenant_id=tenant.id,
                key_id=created[0].id, grace=dt.timedelta(hours=1), now=utcnow(),
            )  # fmt: skip
            created.append(rotated)
            listed = await list_keys(session, principal=ADMIN_CTX.principal, tenant_id=tenant.id)
        for c in created:
            secret_registry.add(c.key)
            assert (await verifier[0].verify(c.key)).tenant_id == tenant.id
        assert {k.id for k in listed} == {c.id for c in created}
        assert all(k.prefix.startswith("lg_") and len(k.last_four) == 4 for k in listed)
    finally:
        logging.getLogger("sqlalchemy.engine").setLevel(logging.WARNING)
    await migrated_engine.dispose()
    db_path = sqlite_url.split(":///", 1)[1]
    raw_bytes = Path(db_path).read_bytes()
    with sqlite3.connect(db_path) as conn:
        dump = "\n".join(conn.iterdump())
    assert caplog.records, "expected DEBUG records from the SQL layer"
    log_text = "\n".join(r.getMessage() for r in caplog.records)
    for c in created:
        body = c.key[3:-6]
        assert c.key not in dump and body not in dump and body.encode() not in raw_bytes
        assert c.key not in log_text and body not in log_text


async def test_rotation_grace_and_expiry(
    migrated_engine: AsyncEngine, verifier: tuple[KeyVerifier, Clock]
) -> None:
    v, clock = verifier
    sm = make_sessionmaker(migrated_engine)
    async with sm() as session:
        tenant = await make_tenant(session)
        old = await make_key(
            session, MINTER, tenant.id, expires_at=clock.now + dt.timedelta(days=2)
        )
        new = await rotate_key(
            session, ctx=ADMIN_CTX, minter=MINTER, tenant_id=tenant.id, key_id=old.id,
            grace=dt.timedelta(minutes=10), now=clock.now,
        )  # fmt: skip
    v._cache.clear()
    await v.verify(old.key)  # inside the grace period both work
    await v.verify(new.key)
    clock.now += dt.timedelta(minutes=11)
    with pytest.raises(InvalidApiKey):
        await v.verify(old.key)
    await v.verify(new.key)
    clock.now += dt.timedelta(days=2)  # the new key inherits the old one's expiry
    with pytest.raises(InvalidApiKey):
        await v.verify(new.key)


async def test_tenant_admin_cannot_widen_scope_or_cross_tenants(
    migrated_engine: AsyncEngine,
) -> None:
    sm = make_sessionmaker(migrated_engine)
    async with sm() as session:
        a = await make_tenant(session)
        b = await make_tenant(session)
        ta = AuditContext(Principal("key:ta", TenantId(a.id), frozenset({Scope.TENANT_ADMIN})))
        inf = AuditContext(Principal("key:inf", TenantId(a.id), frozenset({Scope.INFERENCE})))
        ok = await make_key(session, MINTER, a.id, (Scope.INFERENCE, Scope.TENANT_ADMIN), ctx=ta)
        assert set(ok.scopes) == {"inference", "tenant-admin"}
        with pytest.raises(InsufficientScope):
            await make_key(session, MINTER, a.id, (Scope.ADMIN,), ctx=ta)
        with pytest.raises(NotFound):
            await make_key(session, MINTER, b.id, (Scope.INFERENCE,), ctx=ta)
        with pytest.raises(InsufficientScope):
            await make_key(session, MINTER, a.id, (Scope.INFERENCE,), ctx=inf)
        admin_key = await make_key(session, MINTER, a.id, (Scope.ADMIN,))
        with pytest.raises(InsufficientScope):  # nor revoke or rotate a wider key
            await revoke_key(session, ctx=ta, tenant_id=a.id, key_id=admin_key.id, now=utcnow())


async def test_database_down_is_503_and_cached_keys_keep_working(
    tmp_path: Path, secret_registry: SecretRegistry
) -> None:
    db_dir = tmp_path / "db"
    db_dir.mkdir()
    engine = make_engine(f"sqlite+aiosqlite:///{db_dir / 'x.db'}")
    await upgrade(engine)
    sm = make_sessionmaker(engine)
    async with sm() as session:
        tenant = await make_tenant(session)
        cached = secret_registry.add((await make_key(session, MINTER, tenant.id)).key)
        uncached = secret_registry.add((await make_key(session, MINTER, tenant.id)).key)
    verifier = KeyVerifier(minter=MINTER, sessionmaker=sm, cache=KeyCache(ttl_s=2.0))
    await verifier.verify(cached)
    await engine.dispose()
    for f in db_dir.iterdir():
        f.unlink()
    db_dir.rmdir()  # the database is gone: every new connection fails
    await verifier.verify(cached)
    with pytest.raises(ServiceUnavailable) as info:
        await verifier.verify(uncached)
    assert info.value.status_code == 503
    await engine.dispose()


@pytest.mark.redis
async def test_revocation_reaches_a_second_process_within_2s(
    migrated_engine: AsyncEngine,
    sqlite_url: str,
    redis_url: str,
    aredis: aioredis.Redis,
    secret_registry: SecretRegistry,
    make_settings: Callable[..., object],
) -> None:
    channel = f"lgtest:{uuid.uuid4().hex}:revoked"
    sm = make_sessionmaker(migrated_engine)
    async with sm() as session:
        tenant = await make_tenant(session)
        key = await make_key(session, MINTER, tenant.id)
    secret_registry.add(key.key)
    here = KeyVerifier(
        minter=MINTER, sessionmaker=sm, cache=KeyCache(2.0), redis=aredis, channel=channel
    )
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("revocation_worker.py")),
         sqlite_url, redis_url, channel, PEPPER.decode()],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(key.key + "\n")
        proc.stdin.close()
        assert proc.stdout.readline().strip() == "READY"
        async with sm() as session:
            await revoke_key(
                session, ctx=ADMIN_CTX, tenant_id=tenant.id, key_id=key.id, now=utcnow()
            )
        revoked_at = time.time()
        await here.invalidate(key_id=key.id)
        line = proc.stdout.readline().split()
        assert line and line[0] == "REFUSED", "the second process never refused the key"
        assert float(line[1]) - revoked_at < 2.0
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(InvalidApiKey):
        await here.verify(key.key)
