"""Property: the in-process store decides exactly as a brute-force model of the semantics.

The Redis store is held to the same semantics by the shared suite in test_quotas.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from tenancy.ids import RequestId
from tenancy.quota.memory_store import InProcessQuotaStore
from tenancy.quota.store import Admission, QuotaExceeded, QuotaLimits, QuotaSubject

RPM, TPM, CONC, DAILY, TTL = 8, 2000, 4, 6000, 20.0
# Midday UTC, so the ticks below never cross a day or month boundary.
T0 = dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC).timestamp()


@dataclass
class Entry:
    t: float
    reserved: int
    used: int | None = None

    @property
    def tokens(self) -> int:
        return self.reserved if self.used is None else self.used


ops = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.integers(1, 900)),
        st.tuples(st.just("settle"), st.integers(0, 50), st.floats(0, 1)),
        st.tuples(st.just("tick"), st.floats(0.5, 25)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_store_matches_the_model(steps: list[tuple[object, ...]]) -> None:
    asyncio.run(_run(steps))


async def _run(steps: list[tuple[object, ...]]) -> None:
    now = [T0]
    store = InProcessQuotaStore(lease_ttl_s=TTL, clock=lambda: now[0])
    limits = QuotaLimits(
        requests_per_minute=RPM,
        tokens_per_minute=TPM,
        max_concurrent=CONC,
        daily_token_budget=DAILY,
    )
    subject = QuotaSubject("t:model", limits)
    model: list[Entry] = []
    admissions: list[tuple[Admission, Entry]] = []
    for n, step in enumerate(steps):
        if step[0] == "tick":
            now[0] += float(step[1])  # type: ignore[arg-type]
        elif step[0] == "admit":
            reserve = int(step[1])  # type: ignore[call-overload]
            live = [e for e in model if e.t > now[0] - 60]
            leases = [e for e in model if e.used is None and e.t + TTL > now[0]]
            expect = (
                sum(e.tokens for e in model) + reserve <= DAILY
                and len(live) + 1 <= RPM
                and sum(e.tokens for e in live) + reserve <= TPM
                and len(leases) + 1 <= CONC
            )
            try:
                adm = await store.admit(
                    request_id=RequestId(f"r{n}"), subjects=[subject], reserve_tokens=reserve
                )
            except QuotaExceeded:
                assert not expect
            else:
                assert expect
                entry = Entry(now[0], reserve)
                model.append(entry)
                admissions.append((adm, entry))
        elif admissions:
            adm, entry = admissions[int(step[1]) % len(admissions)]  # type: ignore[call-overload]
            used = int(entry.reserved * float(step[2]))  # type: ignore[arg-type]
            await store.settle(adm, used_tokens=used)
            if entry.used is None:
                entry.used = used
        usage = await store.usage(subject.key)
        live = [e for e in model if e.t > now[0] - 60]
        assert usage.num_requests == len(live)
        assert usage.num_tokens == sum(e.tokens for e in live)
        assert usage.day_tokens == sum(e.tokens for e in model) <= DAILY
        assert usage.num_leases == sum(e.used is None and e.t + TTL > now[0] for e in model)
