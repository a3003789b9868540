"""A small app that mounts the admin routers with real dependencies (SQLite file, real runtime)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI

from gateway.admin import admin_router
from gateway.error_handlers import install_error_handlers
from gateway.middleware import EdgeMiddleware
from tenancy.auth.bootstrap import bootstrap_admin
from tenancy.runtime import TenancyRuntime, build_runtime
from tenancy.settings import TenancySettings
from tenancy.sql.migrate import upgrade


@dataclass
class Harness:
    app: FastAPI
    client: httpx.AsyncClient
    runtime: TenancyRuntime
    admin_key: str

    def auth(self, key: str) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"}

    async def call(
        self, method: str, path: str, key: str | None = None, **kw: Any
    ) -> httpx.Response:
        headers = {**self.auth(key or self.admin_key), **kw.pop("headers", {})}
        return await self.client.request(method, "/admin/v1" + path, headers=headers, **kw)


@asynccontextmanager
async def admin_harness(settings: TenancySettings, **runtime_kw: Any) -> AsyncIterator[Harness]:
    runtime = await build_runtime(settings, **runtime_kw)
    await upgrade(runtime.engine)
    app = FastAPI()
    app.state.tenancy = runtime
    install_error_handlers(app)
    app.add_middleware(EdgeMiddleware, hosts=["*"])  # as gateway/app.py: the last-resort 500
    app.include_router(admin_router())
    async with runtime.sessionmaker() as session:
        created = await bootstrap_admin(
            session,
            minter=runtime.minter,
            tiers=runtime.tier_names,
            default_tier=settings.default_tier,
        )
    transport = httpx.ASGITransport(app=app, client=("203.0.113.7", 4000))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        try:
            yield Harness(app=app, client=client, runtime=runtime, admin_key=created.key)
        finally:
            await runtime.close()
