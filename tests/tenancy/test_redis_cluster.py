"""The quota store and the key-revocation channel on a real three-master Redis Cluster, started on
loopback by the test: every admission runs on one slot (its keys share a hash tag), limits are
exact across 4 processes as on a single server, and a revocation published on any node reaches
a replica subscribed on another."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis_cluster import RedisClusterNodes, redis_cluster

from tenancy.auth.key_format import KeyMinter
from tenancy.auth.key_verify import KeyCache, KeyVerifier, VerifiedKey
from tenancy.auth.scopes import Scope
from tenancy.ids import ApiKeyId, RequestId, TenantId
from tenancy.quota.redis_store import RedisQuotaStore
from tenancy.quota.store import QuotaExceeded, QuotaLimits, QuotaSubject
from tenancy.redis_client import make_redis

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterNodes]:
    missing = [b for b in ("redis-server", "redis-cli") if shutil.which(b) is None]
    if missing:
        pytest.skip(f"a Redis Cluster needs {' and '.join(missing)} on PATH")
    with redis_cluster() as nodes:
        yield nodes


@pytest.fixture
async def store(cluster: RedisClusterNodes) -> AsyncIterator[RedisQuotaStore]:
    client = make_redis(cluster.url, cluster=True)
    assert isinstance(client, RedisCluster)
    store = RedisQuotaStore(client, prefix=f"lgtest:{uuid.uuid4().hex[:8]}:", lease_ttl_s=60)
    yield store
    await store.close()


def _rid() -> RequestId:
    return RequestId(str(uuid.uuid4()))


def _keys_by_node(cluster: RedisClusterNodes, pattern: str) -> dict[int, list[bytes]]:
    found = {}
    for port in cluster.ports:
        node = redis.Redis(port=port)
        found[port] = list(node.scan_iter(match=pattern, count=1000))
        node.close()
    return found


async def test_an_admission_runs_on_one_slot_and_tenants_spread_over_the_masters(
    cluster: RedisClusterNodes, store: RedisQuotaStore
) -> None:
    tenant = QuotaSubject(f"t:{uuid.uuid4().hex[:8]}", QuotaLimits(requests_per_minute=10))
    key = QuotaSubject(f"k:{uuid.uuid4().hex[:8]}", QuotaLimits(requests_per_minute=3))
    admitted = []
    for _ in range(5):
        try:
            admitted.append(await store.admit(request_id=_rid(), subjects=[tenant, key],
                                              reserve_tokens=1))  # fmt: skip
        except QuotaExceeded as exc:
            assert exc.subject_key == key.key
    assert len(admitted) == 3
    for admission in admitted:
        await store.settle(admission, used_tokens=1)
    usage = await store.usage(key.key)  # found through the key's group index
    assert (usage.num_requests, usage.num_leases) == (3, 0)
    assert (await store.usage(tenant.key)).num_requests == 3
    # Every counter of the tenant and its key is in one slot (else the script would have failed
    # with CROSSSLOT; checked here directly).
    node = redis.Redis(port=cluster.ports[0])
    keys = [k for ks in _keys_by_node(cluster, f"{store._prefix}q:{{{tenant.key}}}:*").values()
            for k in ks]  # fmt: skip
    for subject in (tenant, key):  # the lease sets are gone (settled); the rest remain
        assert sum(f":{subject.key}:".encode() in k for k in keys) == 5
    assert len({node.cluster("keyslot", k) for k in keys}) == 1
    node.close()
    # Many tenants: their admissions land on every master, so the cluster really shares the load.
    for i in range(30):
        subject = QuotaSubject(f"t:spread-{i}", QuotaLimits(requests_per_minute=5))
        await store.admit(request_id=_rid(), subjects=[subject], reserve_tokens=1)
    spread = _keys_by_node(cluster, f"{store._prefix}q:{{t:spread-*")
    assert all(spread[port] for port in cluster.ports), {p: len(k) for p, k in spread.items()}


async def test_scripts_reload_on_every_node(
    cluster: RedisClusterNodes, store: RedisQuotaStore
) -> None:
    subject = QuotaSubject(f"t:{uuid.uuid4().hex[:8]}", QuotaLimits(requests_per_minute=5))
    await store.admit(request_id=_rid(), subjects=[subject], reserve_tokens=1)
    for port in cluster.ports:
        node = redis.Redis(port=port)
        node.script_flush()
        node.close()
    await store.admit(request_id=_rid(), subjects=[subject], reserve_tokens=1)
    assert (await store.usage(subject.key)).num_requests == 2


def _worker(cluster: RedisClusterNodes, prefix: str, start_at: float) -> subprocess.Popen[str]:
    script = str(Path(__file__).with_name("quota_worker.py"))
    return subprocess.Popen(
        [sys.executable, script, cluster.url, prefix, "100", "50", repr(start_at), "cluster"],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def test_four_processes_admit_exactly_the_limit_on_a_cluster(cluster: RedisClusterNodes) -> None:
    prefix = f"lgtest:{uuid.uuid4().hex[:8]}:"
    start_at = time.time() + 3.0
    procs = [_worker(cluster, prefix, start_at) for _ in range(4)]
    outputs = [json.loads(p.communicate(timeout=90)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    admitted = [r for o in outputs for r in o["admitted"]]
    assert len(admitted) == 100 and sum(o["rejected"] for o in outputs) == 100

    async def check() -> None:
        store = RedisQuotaStore(make_redis(cluster.url, cluster=True), prefix=prefix,
                                lease_ttl_s=60)  # fmt: skip
        usage = await store.usage("t:shared")
        await store.close()
        assert usage.num_requests == 100 and usage.num_tokens == sum(admitted)
        assert usage.num_leases == 100

    asyncio.run(check())


# ---- the key-revocation channel -------------------------------------------------------------------

MINTER = KeyMinter(prefix="lg", pepper=b"p" * 32)


def _cached_key(cache: KeyCache) -> tuple[str, ApiKeyId]:
    key_id = ApiKeyId(uuid.uuid4().hex)
    key_hash = uuid.uuid4().hex
    cache.put(key_hash, VerifiedKey(
        key_id=key_id, tenant_id=TenantId("t1"), scopes=frozenset({Scope.INFERENCE}),
        expires_at=None, revoked_at=None, rotation_grace_until=None, tenant_status="active",
        tenant_tier="standard", salt_epoch=0,
    ))  # fmt: skip
    return key_hash, key_id


async def _dropped(cache: KeyCache, key_hash: str) -> bool:
    """Whether the entry leaves the cache (its TTL is an hour: only a message can drop it)."""
    deadline = time.monotonic() + 10
    while cache.get(key_hash) is not None:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def test_a_revocation_published_on_any_node_reaches_every_replica(
    cluster: RedisClusterNodes,
) -> None:
    channel = f"lgtest:{uuid.uuid4().hex}:revoked"
    caches = [KeyCache(ttl_s=3600), KeyCache(ttl_s=3600)]
    clients = [make_redis(cluster.url, cluster=True) for _ in caches]
    verifiers = [
        KeyVerifier(minter=MINTER, sessionmaker=None, cache=cache, redis=client, channel=channel)  # type: ignore[arg-type]
        for cache, client in zip(caches, clients, strict=True)
    ]
    for verifier in verifiers:
        await verifier.start()
    try:
        # Replica 1 revokes through its cluster client; replica 0 drops the key.
        key_hash, key_id = _cached_key(caches[0])
        await verifiers[1].invalidate(key_id=key_id)
        assert await _dropped(caches[0], key_hash)
        # Published on each master in turn: whichever node replica 0 listens on, it hears all.
        for port in cluster.ports:
            key_hash, key_id = _cached_key(caches[0])
            node = aioredis.Redis(port=port)
            await node.publish(channel, f"k:{key_id}")
            await node.aclose()
            assert await _dropped(caches[0], key_hash), f"a message published on {port} was lost"
        key_hash, _ = _cached_key(caches[0])
        await verifiers[1].invalidate(tenant_id="t1")  # tenant-wide
        assert await _dropped(caches[0], key_hash)
    finally:
        for verifier in verifiers:
            await verifier.stop()
        for client in clients:
            await client.aclose()
