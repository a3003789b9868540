"""API key verification with a short-TTL cache, invalidated on every replica over Redis pub/sub.

Revocation reaches a replica by whichever comes first: the pub/sub message (milliseconds) or the
cache TTL (at most 2 s, enforced by settings), so a lost message still cannot keep a key alive.
The channel is classic pub/sub, never sharded: on a Redis Cluster a message published on any
node reaches subscribers on every node, so replicas may subscribe wherever the client puts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tenancy.auth.key_format import KeyMinter, digests_equal
from tenancy.auth.scopes import Scope
from tenancy.auth.single_flight import SingleFlight
from tenancy.crud.keys import find_by_hash
from tenancy.errors import DatabaseUnavailable, InvalidApiKey, TenantSuspended
from tenancy.ids import ApiKeyId, TenantId
from tenancy.redis_client import RedisClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerifiedKey:
    key_id: ApiKeyId
    tenant_id: TenantId
    scopes: frozenset[Scope]
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None
    rotation_grace_until: dt.datetime | None
    tenant_status: str
    tenant_tier: str
    salt_epoch: int

    def is_valid(self, now: dt.datetime) -> bool:
        """The key itself: not revoked, not expired, not past its rotation grace."""
        if self.revoked_at is not None:
            return False
        if self.expires_at is not None and now >= self.expires_at:
            return False
        return self.rotation_grace_until is None or now < self.rotation_grace_until


class KeyCache:
    """key hash -> VerifiedKey for ttl_s seconds. Holds HMACs only, never clear keys."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[str, tuple[VerifiedKey, float]] = {}

    def get(self, key_hash: str) -> VerifiedKey | None:
        entry = self._entries.get(key_hash)
        if entry is None:
            return None
        if self._clock() - entry[1] >= self._ttl_s:
            del self._entries[key_hash]
            return None
        return entry[0]

    def put(self, key_hash: str, record: VerifiedKey) -> None:
        self._entries[key_hash] = (record, self._clock())

    def invalidate(self, *, key_id: str | None = None, tenant_id: str | None = None) -> None:
        for h, (rec, _) in list(self._entries.items()):
            if rec.key_id == key_id or rec.tenant_id == tenant_id:
                del self._entries[h]

    def clear(self) -> None:
        self._entries.clear()


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class KeyVerifier:
    def __init__(
        self,
        *,
        minter: KeyMinter,
        sessionmaker: async_sessionmaker[AsyncSession],
        cache: KeyCache,
        redis: RedisClient | None = None,
        channel: str = "loragate:keys:revoked",
        now: Callable[[], dt.datetime] = _utcnow,
    ) -> None:
        self._minter = minter
        self._sessionmaker = sessionmaker
        self._cache = cache
        self._loads: SingleFlight[str, VerifiedKey] = SingleFlight()
        self._redis = redis
        self._channel = channel
        self._now = now
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    async def verify(self, raw: str) -> VerifiedKey:
        # Shape and checksum first: garbage never reaches the database.
        if not self._minter.is_well_formed(raw):
            raise InvalidApiKey()
        key_hash = self._minter.hash(raw)
        record = self._cache.get(key_hash)
        if record is None:
            record = await self._loads.run(key_hash, lambda: self._load_and_cache(key_hash))
        if not record.is_valid(self._now()):
            raise InvalidApiKey()
        if record.tenant_status != "active":
            # Only a holder of a valid key learns this: it tells them why, not what exists.
            raise TenantSuspended()
        return record

    async def _load_and_cache(self, key_hash: str) -> VerifiedKey:
        record = await self._load(key_hash)
        self._cache.put(key_hash, record)
        return record

    async def _load(self, key_hash: str) -> VerifiedKey:
        try:
            async with self._sessionmaker() as session:
                found = await find_by_hash(session, key_hash=key_hash)
        except (OperationalError, DBAPIError, OSError) as exc:
            # A database outage is never reported as a bad key.
            raise DatabaseUnavailable("The key store") from exc
        if found is None or not digests_equal(found[0].key_hash, key_hash):
            raise InvalidApiKey()
        key, tenant = found
        return VerifiedKey(
            key_id=ApiKeyId(key.id),
            tenant_id=TenantId(key.tenant_id),
            scopes=frozenset(Scope(s) for s in key.scopes),
            expires_at=key.expires_at,
            revoked_at=key.revoked_at,
            rotation_grace_until=key.rotation_grace_until,
            tenant_status=tenant.status,
            tenant_tier=tenant.tier,
            salt_epoch=tenant.salt_epoch,
        )

    async def invalidate(self, *, key_id: str | None = None, tenant_id: str | None = None) -> None:
        """Drop the entry here and tell every other replica (best effort; the TTL backs it up)."""
        self._cache.invalidate(key_id=key_id, tenant_id=tenant_id)
        if self._redis is None:
            return
        message = f"k:{key_id}" if key_id else f"t:{tenant_id}"
        try:
            await self._redis.publish(self._channel, message)
        except RedisError:
            log.warning("could not publish a key invalidation; replicas rely on the cache TTL")

    def _on_message(self, data: bytes | str) -> None:
        text = data.decode() if isinstance(data, bytes) else data
        kind, _, ident = text.partition(":")
        if kind == "k":
            self._cache.invalidate(key_id=ident)
        elif kind == "t":
            self._cache.invalidate(tenant_id=ident)

    async def _listen(self) -> None:
        assert self._redis is not None
        while True:
            try:
                if isinstance(self._redis, RedisCluster):
                    # A cluster pubsub picks its node from the slot map, which the client
                    # loads lazily, on its first command; subscribing is not one.
                    await self._redis.initialize()
            except RedisError:
                log.warning("key invalidation channel lost; retrying")
                await asyncio.sleep(0.5)
                continue
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._channel)
                # Messages may have been missed while unsubscribed.
                self._cache.clear()
                self._subscribed.set()
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self._on_message(message["data"])
            except RedisError:
                self._subscribed.clear()
                log.warning("key invalidation channel lost; retrying")
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(RedisError):
                    await pubsub.aclose()

    async def start(self) -> None:
        if self._redis is not None and self._listener is None:
            self._listener = asyncio.create_task(self._listen())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._subscribed.wait(), timeout=5)

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None
