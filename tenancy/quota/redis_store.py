"""The Redis QuotaStore (distributed mode): one Lua script per admission, exact across replicas.

Redis down means fail closed: QuotaStoreUnavailable (503), never an admission and never a 401.

Hash tags (Redis Cluster): a script may only touch keys of one hash slot, and an admission
touches every subject it names (the tenant, then the key if it has a policy). So all keys of an
admission carry the hash tag of its *group*, the first subject: `{prefix}q:{<group>}:<subject>:win`
and `{prefix}q:{<group>}:rq:<request id>`. A subject named after the first (a key) always comes
with the same first subject (its tenant), so its counters have one home; an index key
`{prefix}q:{<subject>}:group` records that home for `usage()`, which is given the subject alone.
On a single server the tags change nothing but the names.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence

from redis.exceptions import NoScriptError, RedisError

from tenancy.errors import QuotaStoreUnavailable
from tenancy.ids import RequestId
from tenancy.quota.lua import ADMIT, SETTLE, USAGE
from tenancy.quota.pipelined import PipelinedRedis
from tenancy.quota.store import (
    PENDING_TTL_S,
    WINDOW_S,
    Admission,
    Limit,
    QuotaExceeded,
    QuotaSubject,
    QuotaUsage,
    SubjectState,
    periods,
    rate_info,
)
from tenancy.redis_client import RedisClient

# redis-py's clients, or the pipelined connection of a single server (pipelined.py).
QuotaRedis = RedisClient | PipelinedRedis

_CODES = {
    1: Limit.MONTHLY, 2: Limit.DAILY, 3: Limit.RPM, 4: Limit.TPM, 5: Limit.CONCURRENCY,
    6: Limit.MONTHLY_SPEND, 7: Limit.DAILY_SPEND,
}  # fmt: skip


class _Script:
    """EVALSHA, loading the script on NoScriptError (a restarted or flushed Redis)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(
        self, client: QuotaRedis, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> object:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            self.sha = await client.script_load(self.source)
            return await client.evalsha(self.sha, len(keys), *keys, *args)


def _limit_args(subject: QuotaSubject) -> list[int]:
    lim = subject.limits
    values = (
        lim.monthly_token_budget,
        lim.daily_token_budget,
        lim.monthly_spend_budget_micros,
        lim.daily_spend_budget_micros,
        lim.requests_per_minute,
        lim.tokens_per_minute,
        lim.max_concurrent,
    )
    return [-1 if v is None else v for v in values]


class RedisQuotaStore:
    def __init__(
        self,
        client: QuotaRedis,
        *,
        prefix: str,
        lease_ttl_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._lease_ttl_s = lease_ttl_s
        self._clock = clock
        self._admit = _Script(ADMIT)
        self._settle = _Script(SETTLE)
        self._usage = _Script(USAGE)
        self._indexed: set[str] = set()  # subjects whose group index this process has written

    def _keys(self, group: str, subject_key: str, day: str, month: str) -> list[str]:
        base = f"{self._prefix}q:{{{group}}}:{subject_key}:"
        names = ("win", "tok", "sum", "lease", f"d:{day}", f"m:{month}", f"dc:{day}", f"mc:{month}")
        return [base + s for s in names]

    def _marker(self, group: str, request_id: str) -> str:
        return f"{self._prefix}q:{{{group}}}:rq:{request_id}"

    def _index(self, subject_key: str) -> str:
        return f"{self._prefix}q:{{{subject_key}}}:group"

    async def _write_index(self, group: str, subjects: list[QuotaSubject]) -> None:
        """Record where the counters of the subjects after the first live (once per process)."""
        for subject in subjects[1:]:
            if subject.key not in self._indexed:
                await self._client.set(self._index(subject.key), group)
                self._indexed.add(subject.key)

    async def admit(
        self,
        *,
        request_id: RequestId,
        subjects: list[QuotaSubject],
        reserve_tokens: int,
        reserve_micros: int = 0,
    ) -> Admission:
        now = self._clock()
        day, month, to_day_end, to_month_end = periods(now)
        group = subjects[0].key
        keys = [self._marker(group, request_id)]
        args: list[str | int | float] = [
            repr(now), request_id, reserve_tokens, repr(now + self._lease_ttl_s), WINDOW_S,
            repr(to_day_end), repr(to_month_end), int(PENDING_TTL_S), len(subjects),
            reserve_micros,
        ]  # fmt: skip
        for subject in subjects:
            keys += self._keys(group, subject.key, day, month)
            args += _limit_args(subject)
        try:
            await self._write_index(group, subjects)
            reply = await self._admit(self._client, keys, args)
        except (RedisError, OSError) as exc:
            raise QuotaStoreUnavailable() from exc
        assert isinstance(reply, list)
        values = [int(v) for v in reply]
        if values[0] == 1:
            rate = rate_info(subjects, _states(values[1:]))
            return Admission(
                request_id=request_id,
                subject_keys=tuple(s.key for s in subjects),
                reserved_tokens=reserve_tokens,
                reserved_micros=reserve_micros,
                day=day,
                month=month,
                rate=rate,
            )
        _, index, code, retry_ms = values[:4]
        raise QuotaExceeded(
            limit=_CODES[code],
            subject_key=subjects[index].key,
            retry_after_s=max(0, retry_ms) / 1000,
            rate=rate_info(subjects, _states(values[4:])),
        )

    async def settle(self, admission: Admission, *, used_tokens: int, used_micros: int = 0) -> None:
        group = admission.subject_keys[0]
        keys = [self._marker(group, admission.request_id)]
        for key in admission.subject_keys:
            keys += self._keys(group, key, admission.day, admission.month)
        args: list[str | int | float] = [
            admission.request_id, used_tokens, admission.reserved_tokens,
            len(admission.subject_keys), used_micros, admission.reserved_micros,
        ]  # fmt: skip
        try:
            await self._settle(self._client, keys, args)
        except (RedisError, OSError) as exc:
            raise QuotaStoreUnavailable() from exc

    async def usage(self, subject_key: str) -> QuotaUsage:
        now = self._clock()
        day, month, _, _ = periods(now)
        try:
            stored = await self._client.get(self._index(subject_key))
            group = stored.decode() if isinstance(stored, bytes) else (stored or subject_key)
            reply = await self._usage(
                self._client, self._keys(group, subject_key, day, month), [repr(now), WINDOW_S]
            )
        except (RedisError, OSError) as exc:
            raise QuotaStoreUnavailable() from exc
        assert isinstance(reply, list)
        r, t, leases, d, m, reset_ms, dc, mc = (int(v) for v in reply)
        return QuotaUsage(
            r, t, leases, d, m, window_reset_s=max(0, reset_ms) / 1000,
            day_spend_micros=dc, month_spend_micros=mc,
        )  # fmt: skip

    async def close(self) -> None:
        await self._client.aclose()


def _states(flat: list[int]) -> list[SubjectState]:
    return [
        SubjectState(flat[i], flat[i + 1], flat[i + 2] / 1000, flat[i + 2] / 1000)
        for i in range(0, len(flat), 3)
    ]
