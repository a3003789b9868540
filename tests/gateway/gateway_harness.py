"""A real gateway app (real engine on the tiny model, SQLite, real quota store) for the tests.

`running_gateway` runs the app's lifespan and talks to it through httpx's ASGI transport;
tests that need sockets (disconnects, the OpenAI SDK) run uvicorn instead. Tenants, keys and
quota policies are created through the tenancy CRUD functions, as the admin API does.
"""

from __future__ import annotations

import datetime as dt
import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from engine.protocol import GenerateRequest, StructuredSpec
from gateway.app import create_app
from gateway.engines.api import EngineClient, EngineStream
from gateway.policy import AdapterRef
from gateway.settings import GatewaySettings
from gateway.state import GatewayState
from tenancy.auth.principal import AuditContext, Principal
from tenancy.auth.scopes import Scope
from tenancy.crud.keys import create_key
from tenancy.crud.quotas import put_policy
from tenancy.crud.tenants import create_tenant
from tenancy.schemas import ApiKeyCreate, QuotaLimitsIn, TenantCreate
from tenancy.sql.models import UsageRecord

ADMIN_CTX = AuditContext(
    principal=Principal(subject="test:admin", tenant_id=None, scopes=frozenset({Scope.ADMIN}))
)
MODEL = "tiny"
TIMEOUT_S = 60.0


def gateway_settings(model_dir: Path, tmp: Path, **overrides: Any) -> GatewaySettings:
    values: dict[str, Any] = {
        "model": model_dir,
        "served_model_name": MODEL,
        "database_url": f"sqlite+aiosqlite:///{tmp / 'gateway.db'}",
        "key_pepper": secrets.token_urlsafe(32),
        "salt_secret": secrets.token_urlsafe(32),
        "adapter_store_dir": tmp / "adapters",
        "auto_migrate": True,
        "usage_flush_interval_s": 0.05,
    }
    # `engine={...}` overrides single engine options over these.
    engine = {"num_kv_blocks": 1024, "max_num_seqs": 16, **overrides.pop("engine", {})}
    values.update(overrides, engine=engine)
    return GatewaySettings(**values)


@dataclass(frozen=True)
class TenantKey:
    tenant_id: str
    key: str
    tier: str

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}"}


class RecordingClient:
    """The real engine client, recording every request the gateway sends it."""

    def __init__(self, inner: EngineClient) -> None:
        self.inner = inner
        self.requests: list[GenerateRequest] = []
        self.traceparents: list[str | None] = []
        self.model_name = inner.model_name
        self.max_model_len = inner.max_model_len
        self.vocab_size = inner.vocab_size

    async def start(self) -> None:
        await self.inner.start()

    async def open(
        self, request: GenerateRequest, adapter: AdapterRef | None, traceparent: str | None = None
    ) -> EngineStream:
        self.requests.append(request)
        self.traceparents.append(traceparent)
        return await self.inner.open(request, adapter, traceparent)

    def start_unload(self, engine_name: str) -> None:
        self.inner.start_unload(engine_name)

    async def check_constraint(self, spec: StructuredSpec) -> None:
        await self.inner.check_constraint(spec)

    async def check_ready(self) -> dict[str, bool]:
        return await self.inner.check_ready()

    async def close(self) -> None:
        await self.inner.close()


class SecretScan:
    """Keys, salts and prompt texts of a test run: none may appear in any log record."""

    def __init__(self) -> None:
        self.values: set[str] = set()

    def add(self, value: str) -> str:
        self.values.add(value)
        return value

    def leaked(self, lines: list[str]) -> list[str]:
        return [v[:6] + "..." for v in self.values if any(v in line for line in lines)]


@dataclass
class Gateway:
    state: GatewayState
    client: httpx.AsyncClient
    scan: SecretScan = field(default_factory=SecretScan, repr=False)

    async def tenant(
        self,
        *,
        tier: str = "standard",
        scopes: tuple[Scope, ...] = (Scope.INFERENCE,),
        **limits: int,
    ) -> TenantKey:
        runtime = self.state.tenancy
        async with runtime.sessionmaker() as session:
            tenant = await create_tenant(
                session,
                ctx=ADMIN_CTX,
                data=TenantCreate(name=f"t-{uuid.uuid4().hex[:10]}", tier=tier),
                tiers=runtime.tier_names,
                default_tier=runtime.settings.default_tier,
            )
            created = await create_key(
                session,
                ctx=ADMIN_CTX,
                minter=runtime.minter,
                tenant_id=tenant.id,
                data=ApiKeyCreate(name="k", scopes=list(scopes)),
                now=dt.datetime.now(dt.UTC),
            )
            if limits:
                await put_policy(
                    session, ctx=ADMIN_CTX, tenant_id=tenant.id, limits=QuotaLimitsIn(**limits)
                )
        self.scan.add(created.key)
        self.scan.add(self.state.tenancy.salts.salt(tenant.id, 0))  # type: ignore[arg-type]
        return TenantKey(tenant_id=tenant.id, key=created.key, tier=tier)

    def salt_of(self, tenant: TenantKey) -> str:
        return self.state.tenancy.salts.salt(tenant.tenant_id, 0)  # type: ignore[arg-type]

    def record_requests(self) -> RecordingClient:
        recorder = RecordingClient(self.state.engine)
        self.state.engine = recorder
        self.state.lifecycle.engine = recorder
        return recorder

    def stop_recording(self, recorder: RecordingClient) -> None:
        self.state.engine = recorder.inner
        self.state.lifecycle.engine = recorder.inner

    async def usage_records(self, tenant: TenantKey) -> list[UsageRecord]:
        await self.state.usage.flush()
        async with self.state.tenancy.sessionmaker() as session:
            rows = await session.scalars(
                select(UsageRecord).where(UsageRecord.tenant_id == tenant.tenant_id)
            )
            return list(rows.all())

    def chat_body(self, content: str, **fields: Any) -> dict[str, Any]:
        if len(content) >= 16:
            self.scan.add(content)  # prompt text never reaches a log either
        return {"model": MODEL, "messages": [{"role": "user", "content": content}],
                "temperature": 0, **fields}  # fmt: skip


@asynccontextmanager
async def running_gateway(
    settings: GatewaySettings, scan: SecretScan | None = None
) -> AsyncIterator[Gateway]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=("203.0.113.9", 5000))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway", timeout=TIMEOUT_S
        ) as client:
            yield Gateway(state=app.state.gateway, client=client, scan=scan or SecretScan())
