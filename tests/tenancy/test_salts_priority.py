"""Cache salts (derived, 256-bit, per tenant and epoch) and priority clamping."""

from __future__ import annotations

import base64

from hypothesis import given
from hypothesis import strategies as st
from tenancy_factories import SecretRegistry

from tenancy.ids import TenantId
from tenancy.priority import PriorityMapper
from tenancy.salts import SaltDeriver
from tenancy.settings import TierBand

DERIVER = SaltDeriver(secret=b"s" * 16 + b"0123456789abcdef0123")
TIERS = {
    "realtime": TierBand(lo=0, hi=9, default=0),
    "standard": TierBand(lo=10, hi=19, default=10),
    "batch": TierBand(lo=20, hi=29, default=20),
}


@given(st.uuids(), st.uuids(), st.integers(0, 10**6))
def test_salts_differ_by_tenant_and_epoch(a: object, b: object, epoch: int) -> None:
    sa, sb = DERIVER.salt(TenantId(str(a)), epoch), DERIVER.salt(TenantId(str(b)), epoch)
    assert (sa == sb) == (a == b)
    assert DERIVER.salt(TenantId(str(a)), epoch + 1) != sa
    assert len(base64.urlsafe_b64decode(sa + "=")) == 32
    assert DERIVER.salt(TenantId(str(a)), epoch) == sa  # deterministic across replicas
    assert "secret" not in repr(DERIVER) or "***" in repr(DERIVER)


def test_salt_depends_on_the_server_secret(secret_registry: SecretRegistry) -> None:
    other = SaltDeriver(secret=b"another-secret-of-sufficient-length!")
    salt = secret_registry.add(DERIVER.salt(TenantId("t"), 0))  # never to be logged
    assert other.salt(TenantId("t"), 0) != salt


@given(st.sampled_from(sorted(TIERS)), st.one_of(st.none(), st.integers(-(10**9), 10**9)))
def test_priority_hint_is_clamped_into_the_band(tier: str, hint: int | None) -> None:
    mapper = PriorityMapper(TIERS)
    band = TIERS[tier]
    p = mapper.engine_priority(tier, hint)
    assert band.lo <= p <= band.hi
    if hint is None:
        assert p == band.default
    elif band.lo <= hint <= band.hi:
        assert p == hint
    assert mapper.vllm_priority(p) == p


def test_batch_can_never_outrank_realtime() -> None:
    mapper = PriorityMapper(TIERS, vllm_offset=5)
    assert mapper.engine_priority("batch", -100) > mapper.engine_priority("realtime", 100)
    assert mapper.vllm_priority(mapper.engine_priority("standard")) == 15
