"""`loragate serve` with LORAGATE_REDIS_CLUSTER on a real three-master Redis Cluster: quotas are
enforced from the cluster, `/ready` reports it, and a revoked key stops working."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gateway_process import GatewayProcess, gateway_env, start_gateway

sys.path.insert(0, str(Path(__file__).parents[1] / "tenancy"))
from redis_cluster import redis_cluster

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def cluster_gateway(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    missing = [b for b in ("redis-server", "redis-cli") if shutil.which(b) is None]
    if missing:
        pytest.skip(f"a Redis Cluster needs {' and '.join(missing)} on PATH")
    workdir = tmp_path_factory.mktemp("gw-redis-cluster")
    with redis_cluster() as nodes:
        env = gateway_env(tiny_model_dir, workdir, LORAGATE_QUOTA_STORE="redis",
                          LORAGATE_REDIS_URL=nodes.url, LORAGATE_REDIS_CLUSTER="true")  # fmt: skip
        gateway = start_gateway(env, workdir)
        try:
            yield gateway
        finally:
            gateway.stop()


def _chat(gateway: GatewayProcess, key: str) -> httpx.Response:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(gateway.base_url + "/chat/completions", json=body,
                      headers={"authorization": f"Bearer {key}"}, timeout=60)  # fmt: skip


def test_quotas_readiness_and_revocation_on_a_cluster(cluster_gateway: GatewayProcess) -> None:
    gateway = cluster_gateway
    ready = httpx.get(gateway.url + "/ready", timeout=10)
    assert ready.status_code == 200 and ready.json()["checks"]["redis"] is True
    tenant = gateway.tenant(requests_per_minute=2)
    assert [_chat(gateway, tenant.key).status_code for _ in range(3)] == [200, 200, 429]
    other = gateway.tenant()
    assert _chat(gateway, other.key).status_code == 200
    [key] = gateway.admin("GET", f"/tenants/{other.tenant_id}/keys").json()
    key_id = key["id"]
    revoked = gateway.admin("POST", f"/tenants/{other.tenant_id}/keys/{key_id}/revoke")
    assert revoked.status_code in (200, 204), revoked.text
    assert _chat(gateway, other.key).status_code == 401
