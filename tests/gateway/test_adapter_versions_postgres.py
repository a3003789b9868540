"""Issue 44, acceptance 2 on PostgreSQL: the alias switched while 200 requests are in flight
through a real gateway (tiny model, in-process engine) whose database is PostgreSQL; each
request served wholly by one version, the one its usage row records; the version the alias
serves cannot be deleted while the name has another."""

from __future__ import annotations

from pathlib import Path

import pytest
from gateway_harness import SecretScan, gateway_settings, running_gateway
from version_checks import admin_headers, switch_under_load, upload_version

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


async def test_switch_under_load_on_postgres(
    tiny_model_dir: Path, tmp_path: Path, postgres_url: str, secret_scan: SecretScan
) -> None:
    settings = gateway_settings(tiny_model_dir, tmp_path, database_url=postgres_url)
    async with running_gateway(settings, secret_scan) as gw:
        admin = await admin_headers(gw)
        tenant = await gw.tenant()
        v1 = await upload_version(gw, admin, tenant.tenant_id, seed=61)
        v2 = await upload_version(gw, admin, tenant.tenant_id, seed=62)
        alias = f"/admin/v1/tenants/{tenant.tenant_id}/adapter-aliases/support"
        assert (await gw.client.put(alias, headers=admin, json={"version": 1})).status_code == 200
        await switch_under_load(gw, admin, tenant, alias, {v1["id"]: 1, v2["id"]: 2})
        r = await gw.client.delete(
            f"/admin/v1/tenants/{tenant.tenant_id}/adapters/{v2['id']}", headers=admin
        )
        assert r.status_code == 409 and "alias 'support'" in r.json()["error"]["message"]
