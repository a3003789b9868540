"""Readiness tells the truth (issue 10): a dependency that is not configured is `null`, not
`true`; a database whose schema is not this code's is refused at start with the fix named, and
makes `/ready` fail if it changes underneath a running gateway."""

from __future__ import annotations

from pathlib import Path

import pytest
from gateway_harness import SecretScan, gateway_settings, running_gateway

from tenancy.sql.migrate import SchemaOutOfDate, downgrade
from tenancy.sql.session import make_engine


async def test_embedded_readiness_has_no_redis_and_checks_the_schema(
    tiny_model_dir: Path, tmp_path: Path, secret_scan: SecretScan
) -> None:
    async with running_gateway(gateway_settings(tiny_model_dir, tmp_path), secret_scan) as gw:
        r = await gw.client.get("/ready")
        assert r.status_code == 200, r.text
        checks = r.json()["checks"]
        assert checks == {"database": True, "schema": True, "redis": None, "engines": True}
        # The schema moves behind this code (an operator downgraded it): not ready any more.
        await downgrade(gw.state.tenancy.engine, "base")
        r = await gw.client.get("/ready")
        assert r.status_code == 503
        assert r.json()["checks"]["schema"] is False


async def test_an_unmigrated_database_is_refused_at_start_naming_the_fix(
    tiny_model_dir: Path, tmp_path: Path, secret_scan: SecretScan
) -> None:
    settings = gateway_settings(tiny_model_dir, tmp_path, auto_migrate=False)
    engine = make_engine(settings.database_url)  # the file exists, empty: never migrated
    async with engine.connect():
        pass
    await engine.dispose()
    with pytest.raises(SchemaOutOfDate, match="loragate admin migrate"):
        async with running_gateway(settings, secret_scan):
            pass
