"""`loragate demo`: the one-command demo on the embedded default (what `make run` starts).

Prepares a state directory (generated secrets kept in a 0600 file, a SQLite database), a demo
tenant with a quota policy, two demo LoRA adapters and a fresh inference key (printed once;
earlier demo keys are revoked), then serves the gateway with the in-process engine and prints a curl line and an
OpenAI SDK snippet that work as printed.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import socket
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.demo.adapters import demo_adapter_files
from gateway.server.serve import load_settings, metrics_guarded, run_server
from gateway.settings import GatewaySettings
from tenancy.adapters.service import AdapterService
from tenancy.adapters.validation import FormatChecksValidator
from tenancy.auth.key_format import KeyMinter
from tenancy.auth.principal import AuditContext, Principal
from tenancy.auth.scopes import Scope
from tenancy.crud.adapters import register_adapter
from tenancy.crud.keys import create_key, revoke_key
from tenancy.crud.quotas import put_policy
from tenancy.crud.tenants import create_tenant
from tenancy.schemas import ApiKeyCreate, QuotaLimitsIn, TenantCreate
from tenancy.sql.migrate import upgrade
from tenancy.sql.models import Adapter, ApiKey, Tenant
from tenancy.sql.session import make_engine, make_sessionmaker
from tenancy.state_dir import state_settings

DEMO_TENANT = "demo"
# The name of the key each start prints (and the next start revokes).
DEMO_KEY_NAME = "demo-printed-key"
DEMO_ADAPTERS = ("pirate", "poet")  # random weights: the names only tell them apart
DEMO_MODEL_NAME = "tiny"
DEMO_CTX = AuditContext(
    principal=Principal(subject="system:demo", tenant_id=None, scopes=frozenset({Scope.ADMIN}))
)
DEMO_LIMITS = QuotaLimitsIn(
    requests_per_minute=120,
    tokens_per_minute=200_000,
    max_concurrent=8,
    daily_token_budget=5_000_000,
)


def add_subcommands(subparsers: Any) -> None:
    demo = subparsers.add_parser(
        "demo", help="the embedded demo: a demo tenant and key, then the gateway on this machine"
    )
    demo.add_argument("--model", type=Path, default=Path(".cache/models/tiny"))
    demo.add_argument("--dir", type=Path, default=Path(".cache/demo"), help="state directory")
    demo.add_argument("--host", default="127.0.0.1")
    demo.add_argument("--port", type=int, default=8000)
    demo.add_argument("--no-serve", action="store_true", help="prepare and print, do not serve")
    demo.set_defaults(handler=_demo)


def demo_settings(model: Path, state_dir: Path) -> GatewaySettings | None:
    return load_settings(
        model=model,
        served_model_name=DEMO_MODEL_NAME,
        auto_migrate=True,
        **state_settings(state_dir, create=True),
    )


async def prepare(settings: GatewaySettings) -> str:
    """Migrate; create the demo tenant and policy if missing; return a fresh inference key."""
    engine = make_engine(settings.database_url)
    try:
        await upgrade(engine)
        minter = KeyMinter(
            prefix=settings.key_prefix, pepper=settings.key_pepper.get_secret_value().encode()
        )
        async with make_sessionmaker(engine)() as session:
            tenant = (
                await session.scalars(select(Tenant).where(Tenant.name == DEMO_TENANT))
            ).first()
            if tenant is None:
                tenant = await create_tenant(
                    session,
                    ctx=DEMO_CTX,
                    data=TenantCreate(name=DEMO_TENANT),
                    tiers=frozenset(settings.tiers),
                    default_tier=settings.default_tier,
                )
                await put_policy(session, ctx=DEMO_CTX, tenant_id=tenant.id, limits=DEMO_LIMITS)
            now = dt.datetime.now(dt.UTC)
            # Only the key a previous start printed: keys an operator made for the tenant stay.
            old = await session.scalars(
                select(ApiKey.id).where(
                    ApiKey.tenant_id == tenant.id,
                    ApiKey.name == DEMO_KEY_NAME,
                    ApiKey.revoked_at.is_(None),
                )
            )
            for key_id in list(old.all()):
                await revoke_key(session, ctx=DEMO_CTX, tenant_id=tenant.id, key_id=key_id, now=now)
            created = await create_key(
                session,
                ctx=DEMO_CTX,
                minter=minter,
                tenant_id=tenant.id,
                data=ApiKeyCreate(name=DEMO_KEY_NAME, scopes=[Scope.INFERENCE]),
                now=now,
            )
            await add_demo_adapters(session, settings, tenant.id)
        return created.key
    finally:
        await engine.dispose()


async def add_demo_adapters(
    session: AsyncSession, settings: GatewaySettings, tenant_id: str
) -> None:
    """The two demo adapters, owned by the demo tenant, validated like an admin upload."""
    existing = set(
        (
            await session.scalars(select(Adapter.name).where(Adapter.owner_tenant_id == tenant_id))
        ).all()
    )
    service = AdapterService(settings=settings, validator=FormatChecksValidator(settings))
    for seed, name in enumerate(DEMO_ADAPTERS, start=1):
        if name not in existing:
            await register_adapter(
                session,
                ctx=DEMO_CTX,
                service=service,
                tenant_id=tenant_id,
                name=name,
                uploads=demo_adapter_files(settings.base_model, seed=seed),
            )


def banner(
    key: str, *, host: str, port: int, model: str, state_dir: Path = Path(".cache/demo")
) -> str:
    base = f"http://{host}:{port}/v1"
    root = f"http://{host}:{port}"
    return f"""
loragate demo: the gateway with the in-process engine on the tiny model.

Demo tenant API key (shown once; a new one is made each time the demo starts):

    {key}

Try it with curl:

    curl -s {base}/chat/completions -H "Authorization: Bearer {key}" \\
      -H "Content-Type: application/json" \\
      -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 32}}'

Or with the OpenAI SDK (Python):

    from openai import OpenAI
    client = OpenAI(base_url="{base}", api_key="{key}")
    reply = client.chat.completions.create(
        model="{model}", messages=[{{"role": "user", "content": "Hello!"}}], max_tokens=32
    )
    print(reply.choices[0].message.content)

Two demo LoRA adapters belong to the demo tenant: use "model": "{DEMO_ADAPTERS[0]}" or
"{DEMO_ADAPTERS[1]}" instead of "{model}" (one batch mixes all three).
Models this key may use: curl -s {base}/models -H "Authorization: Bearer {key}"
Metrics: http://{host}:{port}/metrics   Readiness: http://{host}:{port}/ready
(The tiny model has random weights: expect fluent-looking nonsense.)

Operators: an admin key first (printed once; --force makes another):

    loragate admin bootstrap --dir {state_dir}

Dashboard (log in with that key): {root}/dashboard    API docs: {root}/docs
Admin CLI, over the REST API (the key from the environment, never an argument):

    export LORAGATE_ADMIN_URL={root}
    read -rs LORAGATE_ADMIN_KEY && export LORAGATE_ADMIN_KEY   # paste the admin key
    loragate admin tenants list
    loragate admin quotas state <tenant id>        # live: used, remaining, resets
    loragate admin usage <tenant id>
    loragate admin --help
"""


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _demo(args: argparse.Namespace) -> int:
    if not (args.model / "config.json").is_file():
        print(f"no model at {args.model}; run `loragate make-model {args.model}`", file=sys.stderr)
        return 2
    if not args.no_serve and not _port_is_free(args.host, args.port):
        # checked first: a start mints a new demo key and revokes the one in use
        print(
            f"{args.host}:{args.port} is in use (a demo already running keeps its key); stop it, "
            f"or serve on another port: `make run PORT=8001` (`--port` here)",
            file=sys.stderr,
        )
        return 2
    settings = demo_settings(args.model, args.dir)
    if settings is None or not metrics_guarded(settings, args.host):
        return 2
    key = asyncio.run(prepare(settings))
    text = banner(
        key, host=args.host, port=args.port, model=settings.model_name, state_dir=args.dir
    )
    print(text, flush=True)
    if not args.no_serve:
        run_server(settings, host=args.host, port=args.port, log_level="info")
    return 0
