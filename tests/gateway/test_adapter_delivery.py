"""The internal adapter endpoint (gateway/routes/internal.py) and the embedded engine's loads
through the store (issue 44, item 1).

SECURITY: only the engine token opens `GET /internal/v1/adapters/{id}`; with it, any tenant's
adapter is served (engines are trusted), but no API key (the owner's, another tenant's, an
admin's) and no malformed header fetches a bundle, and with no engine token configured nobody
does. The embedded engine fetches through the same store: an adapter whose recorded hash is
wrong, or whose stored bytes are cut short, is refused with a clear 502, never served."""

from __future__ import annotations

import hashlib
import io
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from gateway_harness import ADMIN_CTX, Gateway, SecretScan, gateway_settings, running_gateway

from gateway.demo.adapters import demo_adapter_files
from gateway.errors import EngineFailed
from gateway.policy import AdapterRef
from lora.adapter_format import read_bundle
from tenancy.auth.bootstrap import bootstrap_admin
from tenancy.crud.adapters import register_adapter
from tenancy.sql.models import Adapter, AdapterBlob

pytestmark = pytest.mark.asyncio(loop_scope="module")

ENGINE_TOKEN = secrets.token_urlsafe(32)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, secret_scan: SecretScan
) -> AsyncIterator[Gateway]:
    secret_scan.add(ENGINE_TOKEN)
    settings = gateway_settings(
        tiny_model_dir, tmp_path_factory.mktemp("delivery"), engine_admin_token=ENGINE_TOKEN
    )
    async with running_gateway(settings, secret_scan) as gateway:
        yield gateway


async def _adapter(gw: Gateway, tenant_id: str, name: str, seed: int) -> Adapter:
    async with gw.state.tenancy.sessionmaker() as session:
        return await register_adapter(
            session, ctx=ADMIN_CTX, service=gw.state.tenancy.adapters, tenant_id=tenant_id,
            name=name, uploads=demo_adapter_files(gw.state.settings.base_model, seed=seed),
        )  # fmt: skip


async def _fetch(gw: Gateway, adapter_id: str, authorization: str | None) -> Any:
    headers = {} if authorization is None else {"authorization": authorization}
    return await gw.client.get(f"/internal/v1/adapters/{adapter_id}", headers=headers)


async def test_the_engine_token_fetches_any_tenants_bundle(gw: Gateway) -> None:
    owner, other = await gw.tenant(), await gw.tenant()
    row = await _adapter(gw, owner.tenant_id, "fetched", seed=21)
    r = await _fetch(gw, row.id, f"Bearer {ENGINE_TOKEN}")
    assert r.status_code == 200, r.text
    assert r.headers["x-loragate-sha256"] == row.sha256
    assert int(r.headers["content-length"]) == len(r.content)
    assert hashlib.sha256(r.content).hexdigest() == row.sha256
    files = read_bundle(io.BytesIO(r.content), max_bytes=len(r.content))
    uploaded = {
        f.filename: f.data for f in demo_adapter_files(gw.state.settings.base_model, seed=21)
    }
    assert files == uploaded
    # another tenant's id changes nothing for an engine; an unknown one is a 404
    assert (await _fetch(gw, "no-such-adapter", f"Bearer {ENGINE_TOKEN}")).status_code == 404
    assert other.tenant_id != owner.tenant_id


async def test_no_api_key_fetches_a_bundle(gw: Gateway) -> None:
    owner = await gw.tenant()
    row = await _adapter(gw, owner.tenant_id, "guarded", seed=22)
    runtime = gw.state.tenancy
    async with runtime.sessionmaker() as session:
        admin = await bootstrap_admin(
            session, minter=runtime.minter, tiers=runtime.tier_names,
            default_tier=runtime.settings.default_tier, force=True,
        )  # fmt: skip
    gw.scan.add(admin.key)
    refused = [
        None,
        f"Bearer {owner.key}",  # the owner's own inference key
        f"Bearer {(await gw.tenant()).key}",  # another tenant's
        f"Bearer {admin.key}",  # even an admin's
        f"Bearer {ENGINE_TOKEN}x",
        f"Bearer {ENGINE_TOKEN[:-1]}",
        f"Basic {ENGINE_TOKEN}",
        ENGINE_TOKEN,
        "Bearer ",
        "Bearer ' OR '1'='1",
        "Bearer " + "k" * 10_000,
    ]
    for authorization in refused:
        r = await _fetch(gw, row.id, authorization)
        assert r.status_code == 401, (authorization or "")[:12]
        assert r.json()["error"]["code"] == "invalid_api_key" and not r.headers.get(
            "x-loragate-sha256"
        )


async def test_without_an_engine_token_nobody_fetches(
    tiny_model_dir: Path, tmp_path: Path, secret_scan: SecretScan
) -> None:
    settings = gateway_settings(tiny_model_dir, tmp_path)
    async with running_gateway(settings, secret_scan) as bare:
        owner = await bare.tenant()
        row = await _adapter(bare, owner.tenant_id, "closed", seed=23)
        for authorization in (None, "Bearer ", "Bearer None", f"Bearer {owner.key}"):
            assert (await _fetch(bare, row.id, authorization)).status_code == 401


async def _chat(gw: Gateway, key: Any, model: str) -> Any:
    body = gw.chat_body("Through the store, please.", model=model, max_tokens=3)
    return await gw.client.post("/v1/chat/completions", headers=key.headers, json=body)


async def test_the_embedded_engine_loads_through_the_store_and_refuses_bad_bytes(
    gw: Gateway,
) -> None:
    tenant = await gw.tenant()
    good = await _adapter(gw, tenant.tenant_id, "good", seed=24)
    assert (await _chat(gw, tenant, "good")).status_code == 200
    assert good.storage_path is None  # the database store: no file anywhere but the cache
    # The engine asked for a hash its bytes do not have (what a wrong row, or a store that
    # changed under it, would do): refused, never loaded.
    wrong = await _adapter(gw, tenant.tenant_id, "wrong-hash", seed=25)
    engine = gw.state.engine
    ref = AdapterRef(
        adapter_id=wrong.id, name=wrong.name, owner_tenant_id=tenant.tenant_id, path="",
        created_at=0.0, sha256="0" * 64,
    )  # fmt: skip
    with pytest.raises(EngineFailed) as caught:
        await engine._ensure_loaded(ref)  # type: ignore[attr-defined]
    assert caught.value.status_code == 502 and "0" * 64 in caught.value.message
    # The stored bytes cut short: the hash the row records no longer matches them.
    cut = await _adapter(gw, tenant.tenant_id, "cut-short", seed=26)
    async with gw.state.tenancy.sessionmaker() as session:
        blob = await session.get(AdapterBlob, cut.sha256)
        assert blob is not None and blob.data is not None
        blob.data = blob.data[:-1000]
        await session.commit()
    gw.state.policy.forget_adapters()  # uploaded a moment ago: list it now
    r = await _chat(gw, tenant, "cut-short")
    assert r.status_code == 502, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("The adapter could not be loaded") and "refused" in message
    assert (await _chat(gw, tenant, "good")).status_code == 200  # the others still serve
