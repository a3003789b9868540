"""Everything the tenancy layer needs at run time, built once from settings by the app factory."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from tenancy.adapters.service import AdapterService
from tenancy.adapters.validation import AdapterValidator, FormatChecksValidator
from tenancy.auth.key_format import KeyMinter
from tenancy.auth.key_verify import KeyCache, KeyVerifier
from tenancy.auth.oidc import OidcConfig, OidcVerifier
from tenancy.crud.usage import spent_to_date
from tenancy.priority import PriorityMapper
from tenancy.quota.memory_store import InProcessQuotaStore
from tenancy.quota.pipelined import PipelinedRedis
from tenancy.quota.redis_store import RedisQuotaStore
from tenancy.quota.rejections import InProcessRejectionLog, RedisRejectionLog, RejectionLog
from tenancy.quota.store import BudgetCharge, QuotaStore
from tenancy.quota.subjects import key_subject, tenant_subject
from tenancy.redis_client import RedisClient, make_redis
from tenancy.salts import SaltDeriver
from tenancy.settings import TenancySettings
from tenancy.sql.session import make_engine, make_sessionmaker


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass
class TenancyRuntime:
    settings: TenancySettings
    engine: AsyncEngine
    sessionmaker: async_sessionmaker[AsyncSession]
    minter: KeyMinter
    keys: KeyVerifier
    quotas: QuotaStore
    salts: SaltDeriver
    priority: PriorityMapper
    adapters: AdapterService
    oidc: OidcVerifier | None = None
    redis: RedisClient | None = None
    # Rejected inference requests per subject over the last hour; beside the quota store.
    rejections: RejectionLog = field(default_factory=InProcessRejectionLog)
    http: httpx.AsyncClient | None = None
    now: Callable[[], dt.datetime] = field(default=_utcnow)

    @property
    def tier_names(self) -> frozenset[str]:
        return frozenset(self.settings.tiers)

    async def restore_budgets(self) -> int:
        """An in-process quota store starts empty: charge it what the usage ledger holds for
        this UTC day and month (per tenant and per key, on every model and on each served base
        model, as admissions count: tenancy/quota/subjects.py). The Redis store keeps its own
        counters, so this does nothing there. Returns the number of ledger groups read."""
        if not isinstance(self.quotas, InProcessQuotaStore):
            return 0
        try:
            async with self.sessionmaker() as session:
                spent = await spent_to_date(session, now=self.now())
        except (OperationalError, DBAPIError) as exc:
            raise RuntimeError(
                "the usage ledger could not be read to restore the quota budgets "
                "(is the database migrated? `loragate admin migrate`)"
            ) from exc
        served = set(self.adapters.base_models)
        charges: list[BudgetCharge] = []
        for row in spent:
            amounts = (row.day_tokens, row.month_tokens, row.day_micros, row.month_micros)
            model = row.base_model
            if model is not None and row.is_adapter:
                model = self.adapters.serving_model(model)  # as the request was counted
            models: list[str | None] = [None, model] if model in served else [None]
            for each in models:
                charges.append(BudgetCharge(tenant_subject(row.tenant_id, each), *amounts))
                if row.api_key_id is not None:
                    charges.append(BudgetCharge(key_subject(row.api_key_id, each), *amounts))
        self.quotas.restore_budgets(charges)  # a subject's rows add up (keys, models)
        return len(spent)

    async def close(self) -> None:
        await self.keys.stop()
        await self.quotas.close()
        if self.http is not None:
            await self.http.aclose()
        if self.redis is not None:
            await self.redis.aclose()
        await self.engine.dispose()


async def build_runtime(
    settings: TenancySettings,
    *,
    validator: AdapterValidator | None = None,
    http: httpx.AsyncClient | None = None,
) -> TenancyRuntime:
    """`validator` is the seam for the LoRA loader's checks; format checks are the default."""
    engine = make_engine(settings.database_url)
    sessionmaker = make_sessionmaker(engine)
    cluster = settings.redis_cluster
    redis = make_redis(settings.redis_url, cluster=cluster) if settings.redis_url else None
    minter = KeyMinter(
        prefix=settings.key_prefix, pepper=settings.key_pepper.get_secret_value().encode()
    )
    keys = KeyVerifier(
        minter=minter,
        sessionmaker=sessionmaker,
        cache=KeyCache(settings.key_cache_ttl_s),
        redis=redis,
        channel=settings.key_revocation_channel,
    )
    quotas: QuotaStore
    rejections: RejectionLog = InProcessRejectionLog()
    if settings.quota_store == "redis":
        assert redis is not None  # settings validation guarantees redis_url
        # A single server: one pipelined connection (tenancy/quota/pipelined.py); a cluster
        # needs redis-py's slot routing.
        url = settings.redis_url or ""
        quotas = RedisQuotaStore(
            make_redis(url, cluster=True) if cluster else PipelinedRedis(url),
            prefix=settings.redis_key_prefix,
            lease_ttl_s=settings.lease_ttl_s,
        )
        rejections = RedisRejectionLog(redis, prefix=settings.redis_key_prefix)
    else:
        quotas = InProcessQuotaStore(lease_ttl_s=settings.lease_ttl_s)
    oidc = None
    if settings.oidc_issuer and settings.oidc_audience and settings.oidc_jwks_url:
        http = http or httpx.AsyncClient()
        oidc = OidcVerifier(
            OidcConfig(
                issuer=settings.oidc_issuer,
                audience=settings.oidc_audience,
                jwks_url=settings.oidc_jwks_url,
                algorithms=tuple(settings.oidc_algorithms),
                role_claim=settings.oidc_role_claim,
                admin_role=settings.oidc_admin_role,
                tenant_admin_role=settings.oidc_tenant_admin_role,
                tenant_claim=settings.oidc_tenant_claim,
                jwks_ttl_s=settings.oidc_jwks_ttl_s,
            ),
            http,
        )
    runtime = TenancyRuntime(
        settings=settings,
        engine=engine,
        sessionmaker=sessionmaker,
        minter=minter,
        keys=keys,
        quotas=quotas,
        salts=SaltDeriver(settings.salt_secret.get_secret_value().encode()),
        priority=PriorityMapper(settings.tiers, settings.vllm_priority_offset),
        adapters=AdapterService(
            settings=settings, validator=validator or FormatChecksValidator(settings)
        ),
        oidc=oidc,
        redis=redis,
        http=http,
        rejections=rejections,
    )
    await keys.start()
    return runtime
