"""Tenant policy for inference requests: API key -> tenant context, quota subjects, adapter
visibility, model resolution and priority clamping.

`model` names the base model, an adapter alias (`support`: the version the alias points at, or
its canary for `canary_weight` percent of requests, drawn per request) or one version
(`support@3`). A request is resolved once, at admission, to one version: everything after
(engine, price, usage row) sees that version alone, whatever the alias points at by then.

Quota policies and adapter catalogs are cached per tenant, and prices per model and adapter
version, for `policy_cache_ttl_s` (seconds), so the hot path reaches the database only when a
cache entry expires (an alias switch reaches every replica within that time); key verification
has its own short-TTL cache with revocation over pub/sub (tenancy.auth.key_verify).
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sqlalchemy import or_, select
from sqlalchemy.exc import DBAPIError, OperationalError

from gateway.errors import ModelNotFound
from tenancy.auth.admin import bearer_token
from tenancy.auth.scopes import Scope
from tenancy.auth.single_flight import SingleFlight
from tenancy.crud.quotas import subjects_for
from tenancy.errors import DatabaseUnavailable, InsufficientScope
from tenancy.ids import ApiKeyId, TenantId
from tenancy.quota.store import QuotaSubject
from tenancy.runtime import TenancyRuntime
from tenancy.spend.money import Price
from tenancy.spend.prices import price_for
from tenancy.sql.models import Adapter, AdapterAlias

# An unknown model name reloads the tenant's adapter list if the cached one is older than this.
MISS_RELOAD_S = 0.25

K = TypeVar("K")
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """key -> value for ttl_s seconds; concurrent misses of one key share one load."""

    def __init__(self, ttl_s: float, *, max_entries: int = 100_000) -> None:
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._entries: dict[K, tuple[float, V]] = {}
        self._loads: SingleFlight[K, V] = SingleFlight()

    async def get(
        self, key: K, load: Callable[[], Awaitable[V]], *, max_age_s: float | None = None
    ) -> V:
        """The cached value, unless older than the TTL (or than `max_age_s`, when given)."""
        now = time.monotonic()
        entry = self._entries.get(key)
        ttl = self._ttl_s if max_age_s is None else min(self._ttl_s, max_age_s)
        if entry is not None and now - entry[0] < ttl:
            return entry[1]
        return await self._loads.run(key, lambda: self._load(key, load, now))

    async def _load(self, key: K, load: Callable[[], Awaitable[V]], now: float) -> V:
        value = await load()
        if len(self._entries) >= self._max_entries:
            self._entries.clear()  # bounded memory; the next requests reload
        self._entries[key] = (now, value)
        return value

    def invalidate(self, key: K) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()


@dataclass(frozen=True)
class TenantContext:
    """Who is calling, as every inference route sees it. The salt never reaches a log."""

    tenant_id: TenantId
    key_id: ApiKeyId
    tier: str
    salt: str = field(repr=False)


@dataclass(frozen=True)
class AdapterRef:
    adapter_id: str
    name: str  # the name its owner uses as `model`
    owner_tenant_id: str | None  # None: public
    path: str  # the directory store's directory ("" when the bytes live in the database)
    created_at: float
    version: int = 1  # of its name; each version has its own id
    sha256: str = ""  # its bundle's: engines fetch it by id and check this hash
    base_model: str = ""  # the served base model it runs on ("": the primary one)

    @property
    def engine_name(self) -> str:
        # Names are unique per owner only, and versions share names; engines see the version's
        # globally unique id (never reused), so no two versions share loaded weights or
        # prefix-cache blocks.
        return self.adapter_id


@dataclass(frozen=True)
class AliasRef:
    """A name as requests use it: `version`, or `canary` for `canary_weight` percent of them."""

    name: str
    owner_tenant_id: str | None
    version: AdapterRef
    canary: AdapterRef | None = None
    canary_weight: int = 0

    def pick(self, draw: int) -> AdapterRef:
        """`draw`: uniform in [0, 100)."""
        if self.canary is not None and draw < self.canary_weight:
            return self.canary
        return self.version


@dataclass(frozen=True)
class AdapterCatalog:
    """What one tenant may name as `model`: its own names, then public ones of other names (a
    name the tenant owns any version or alias of hides the public one entirely)."""

    aliases: dict[str, AliasRef] = field(default_factory=dict)
    versions: dict[tuple[str, int], AdapterRef] = field(default_factory=dict)


@dataclass(frozen=True)
class ResolvedModel:
    name: str  # as the client asked, echoed in responses
    adapter: AdapterRef | None
    # What a request to it pays, fixed when it is resolved: admission reserves at this price and
    # the ledger records its cost at it, whatever the prices are by the time it ends.
    price: Price = field(default_factory=Price)
    # The served base model whose pool runs it ("": the primary one).
    base_model: str = ""

    @property
    def engine_model(self) -> str | None:
        return self.adapter.engine_name if self.adapter is not None else None


class PolicyService:
    def __init__(
        self,
        runtime: TenancyRuntime,
        *,
        base_model: str,
        cache_ttl_s: float,
        rng: random.Random | None = None,
        other_models: tuple[str, ...] = (),
    ) -> None:
        """`base_model`: the primary served model; `other_models`: the rest (several base
        models, gateway/engines/pools.py)."""
        self._runtime = runtime
        # Draws the canary side of an alias per request; tests seed it (or count through it).
        self.rng = rng if rng is not None else random.Random()
        self.base_model = base_model
        self.base_models = (base_model, *other_models)
        self.started_at = int(time.time())  # the base model's `created`
        # by (tenant, key, base model): a request on a model counts its model's policies too
        self._subjects: TtlCache[tuple[str, str, str], list[QuotaSubject]] = TtlCache(cache_ttl_s)
        self._adapters: TtlCache[str, AdapterCatalog] = TtlCache(cache_ttl_s)
        # by (base model, adapter id); "" the base model itself
        self._prices: TtlCache[tuple[str, str], Price] = TtlCache(cache_ttl_s)

    async def authenticate(self, authorization: str | None) -> TenantContext:
        """401 for any bad key (one shape), 403 for a key without the inference scope."""
        record = await self._runtime.keys.verify(bearer_token(authorization))
        if Scope.INFERENCE not in record.scopes:
            raise InsufficientScope("This key lacks the inference scope.")
        tier = record.tenant_tier
        if tier not in self._runtime.settings.tiers:
            tier = self._runtime.settings.default_tier
        return TenantContext(
            tenant_id=record.tenant_id,
            key_id=record.key_id,
            tier=tier,
            salt=self._runtime.salts.salt(record.tenant_id, record.salt_epoch),
        )

    def priority(self, ctx: TenantContext, hint: int | None) -> int:
        """The tier's default, or the hint clamped into the tier's band (never more urgent)."""
        return self._runtime.priority.engine_priority(ctx.tier, hint)

    async def subjects(self, ctx: TenantContext, model: str | None = None) -> list[QuotaSubject]:
        """What a request on served base model `model` (None: the primary) is counted against:
        the tenant's and key's all-models policies, and their policies for that model."""
        model = model or self.base_model

        async def load() -> list[QuotaSubject]:
            try:
                async with self._runtime.sessionmaker() as session:
                    return await subjects_for(
                        session, tenant_id=ctx.tenant_id, key_id=ctx.key_id, model=model
                    )
            except (OperationalError, DBAPIError, OSError) as exc:
                raise DatabaseUnavailable() from exc

        return await self._subjects.get((ctx.tenant_id, ctx.key_id, model), load)

    async def adapters(
        self, ctx: TenantContext, *, max_age_s: float | None = None
    ) -> AdapterCatalog:
        """The aliases and versions this tenant may use: its own, then public ones."""

        async def load() -> AdapterCatalog:
            visible = or_(
                Adapter.owner_tenant_id == ctx.tenant_id, Adapter.owner_tenant_id.is_(None)
            )
            aliased = or_(
                AdapterAlias.owner_tenant_id == ctx.tenant_id,
                AdapterAlias.owner_tenant_id.is_(None),
            )
            try:
                async with self._runtime.sessionmaker() as session:
                    rows = (await session.scalars(select(Adapter).where(visible))).all()
                    aliases = (await session.scalars(select(AdapterAlias).where(aliased))).all()
            except (OperationalError, DBAPIError, OSError) as exc:
                raise DatabaseUnavailable() from exc
            return _catalog(list(rows), list(aliases), self.serving_model)

        return await self._adapters.get(ctx.tenant_id, load, max_age_s=max_age_s)

    def forget_adapters(self) -> None:
        """An adapter was deleted or an alias changed: every tenant's catalog is read again (a
        public one is visible to all). Other gateway processes catch up within `cache_ttl_s`."""
        self._adapters.clear()

    def serving_model(self, recorded: str) -> str:
        """The served base model an adapter runs on: the one its row records, or the primary
        for a name no longer served (rows from before a rename served on the one model)."""
        return recorded if recorded in self.base_models else self.base_model

    async def price(self, adapter: AdapterRef | None, model: str | None = None) -> Price:
        """The price of a base model (`model`, None: the primary), or of one adapter on its
        base model (its own, else the model's)."""
        adapter_id = adapter.adapter_id if adapter is not None else None
        if adapter is not None:
            model = adapter.base_model
        model = model or self.base_model

        async def load() -> Price:
            try:
                async with self._runtime.sessionmaker() as session:
                    return await price_for(
                        session, model=model, adapter_id=adapter_id,
                        defaults=self._runtime.settings.prices,
                    )  # fmt: skip
            except (OperationalError, DBAPIError, OSError) as exc:
                raise DatabaseUnavailable() from exc

        return await self._prices.get((model, adapter_id or ""), load)

    def forget_prices(self) -> None:
        """A price was set: requests admitted from now on pay it (other processes: within
        `cache_ttl_s`)."""
        self._prices.clear()

    async def resolve(self, ctx: TenantContext, model: str) -> ResolvedModel:
        """The base model, or one version of an adapter visible to this tenant (with its
        price): through the alias for `name` (a canary drawn here, once per request), or named
        for `name@N`. Anything else is a 404."""
        if model in self.base_models:
            price = await self.price(None, model)
            return ResolvedModel(name=model, adapter=None, price=price, base_model=model)
        adapter = self._pick(await self.adapters(ctx), model)
        if adapter is None:
            # Maybe uploaded since the catalog was cached: look again, at most a few times a
            # second per tenant, so unknown names cannot turn into a database query each.
            adapter = self._pick(await self.adapters(ctx, max_age_s=MISS_RELOAD_S), model)
        if adapter is None:
            raise ModelNotFound()
        return ResolvedModel(
            name=model, adapter=adapter, price=await self.price(adapter),
            base_model=adapter.base_model,
        )  # fmt: skip

    def _pick(self, catalog: AdapterCatalog, model: str) -> AdapterRef | None:
        name, at, number = model.rpartition("@")
        if not at:
            alias = catalog.aliases.get(model)
            return alias.pick(self.rng.randrange(100)) if alias is not None else None
        # Adapter names never hold '@' (tenancy/adapters/service.py): `name@N` is a version,
        # N as written once (no leading zeros: one spelling, so one metrics label, per version).
        if not number.isascii() or not number.isdigit() or len(number) > 9 or number[0] == "0":
            return None
        return catalog.versions.get((name, int(number)))


def _catalog(
    rows: list[Adapter], aliases: list[AdapterAlias], serving_model: Callable[[str], str]
) -> AdapterCatalog:
    """Public first, then the tenant's own: a name the tenant uses replaces the public one's
    versions and alias alike (never a mix of both owners' versions under one name)."""
    owned = {r.name for r in rows if r.owner_tenant_id is not None}
    owned |= {a.name for a in aliases if a.owner_tenant_id is not None}
    refs: dict[str, AdapterRef] = {}
    catalog = AdapterCatalog()
    for row in rows:
        if row.status != "ready" or (row.owner_tenant_id is None and row.name in owned):
            continue
        ref = AdapterRef(
            adapter_id=row.id,
            name=row.name,
            owner_tenant_id=row.owner_tenant_id,
            path=row.storage_path or "",
            created_at=row.created_at.timestamp(),
            version=row.version,
            sha256=row.sha256,
            base_model=serving_model(row.base_model),
        )
        refs[row.id] = ref
        catalog.versions[(row.name, row.version)] = ref
    for alias in aliases:
        if alias.owner_tenant_id is None and alias.name in owned:
            continue
        version = refs.get(alias.version_id)
        if version is None:
            continue  # not ready
        canary = refs.get(alias.canary_version_id) if alias.canary_version_id else None
        catalog.aliases[alias.name] = AliasRef(
            name=alias.name,
            owner_tenant_id=alias.owner_tenant_id,
            version=version,
            canary=canary,
            canary_weight=alias.canary_weight if canary is not None else 0,
        )
    return catalog
