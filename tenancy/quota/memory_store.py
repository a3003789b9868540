"""The in-process QuotaStore (embedded mode): exact within one process, same semantics as Redis.

Each subject keeps a sliding 60 s log of admitted requests with their tokens, a running token
sum, a heap of concurrency leases by expiry and per-period budget counters. Every operation is
synchronous under one lock, so an admission is atomic across all subjects.

The counters live in memory; the daily and monthly budgets are restored at start from the usage
ledger (`restore_budgets`, see `TenancyRuntime.restore_budgets`), so a restart never hands a
tenant back tokens it spent. The 60 s windows and leases start empty.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tenancy.ids import RequestId
from tenancy.quota.store import (
    LIMIT_ORDER,
    PENDING_TTL_S,
    WINDOW_S,
    Admission,
    BudgetCharge,
    Limit,
    QuotaExceeded,
    QuotaSubject,
    QuotaUsage,
    SubjectState,
    periods,
    rate_info,
)


@dataclass
class _Ledger:
    window: deque[tuple[float, str]] = field(default_factory=deque)  # (admitted at, request id)
    tokens: dict[str, int] = field(default_factory=dict)  # request id -> tokens, in window only
    num_tokens: int = 0
    leases: dict[str, float] = field(default_factory=dict)  # request id -> expiry
    lease_heap: list[tuple[float, str]] = field(default_factory=list)
    # "d:YYYYMMDD" / "m:YYYYMM" -> tokens; "dc:YYYYMMDD" / "mc:YYYYMM" -> micro-units spent
    budgets: dict[str, int] = field(default_factory=dict)

    def purge(self, now: float) -> None:
        while self.window and self.window[0][0] <= now - WINDOW_S:
            _, rid = self.window.popleft()
            self.num_tokens -= self.tokens.pop(rid, 0)
        while self.lease_heap and self.lease_heap[0][0] <= now:
            expiry, rid = heapq.heappop(self.lease_heap)
            if self.leases.get(rid) == expiry:
                del self.leases[rid]

    def state(self, now: float) -> SubjectState:
        oldest = self.window[0][0] + WINDOW_S - now if self.window else 0.0
        return SubjectState(len(self.window), self.num_tokens, oldest, oldest)

    def tokens_retry_after(self, now: float, need: int, limit: int) -> float:
        excess = self.num_tokens + need - limit
        for t, rid in self.window:
            excess -= self.tokens.get(rid, 0)
            if excess <= 0:
                return t + WINDOW_S - now
        return WINDOW_S


class InProcessQuotaStore:
    def __init__(self, *, lease_ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        self._lease_ttl_s = lease_ttl_s
        self._clock = clock
        self._ledgers: dict[str, _Ledger] = {}
        self._pending: dict[str, Admission] = {}
        # Unsettled admissions are forgotten after a day, as the Redis store's markers expire.
        self._pending_order: deque[tuple[float, str]] = deque()
        self._lock = threading.Lock()

    def _ledger(self, key: str) -> _Ledger:
        ledger = self._ledgers.get(key)
        if ledger is None:
            ledger = self._ledgers[key] = _Ledger()
        return ledger

    def _check(
        self, ledger: _Ledger, subject: QuotaSubject, reserve: int, micros: int, now: float
    ) -> tuple[Limit, float] | None:
        day, month, to_day_end, to_month_end = periods(now)
        budgets = ledger.budgets
        for limit in LIMIT_ORDER:
            cap = subject.limits.get(limit)
            if cap is None:
                continue
            if limit is Limit.MONTHLY and budgets.get("m:" + month, 0) + reserve > cap:
                return limit, to_month_end
            if limit is Limit.DAILY and budgets.get("d:" + day, 0) + reserve > cap:
                return limit, to_day_end
            if limit is Limit.MONTHLY_SPEND and budgets.get("mc:" + month, 0) + micros > cap:
                return limit, to_month_end
            if limit is Limit.DAILY_SPEND and budgets.get("dc:" + day, 0) + micros > cap:
                return limit, to_day_end
            if limit is Limit.RPM and len(ledger.window) + 1 > cap:
                return limit, (ledger.window[0][0] + WINDOW_S - now) if ledger.window else WINDOW_S
            if limit is Limit.TPM and ledger.num_tokens + reserve > cap:
                return limit, ledger.tokens_retry_after(now, reserve, cap)
            if limit is Limit.CONCURRENCY and len(ledger.leases) + 1 > cap:
                return limit, min(1.0, ledger.lease_heap[0][0] - now) if ledger.lease_heap else 1.0
        return None

    async def admit(
        self,
        *,
        request_id: RequestId,
        subjects: list[QuotaSubject],
        reserve_tokens: int,
        reserve_micros: int = 0,
    ) -> Admission:
        with self._lock:
            if (replayed := self._pending.get(request_id)) is not None:
                return replayed  # as the Redis store: a replayed admission stands, counted once
            now = self._clock()
            while self._pending_order and self._pending_order[0][0] <= now - PENDING_TTL_S:
                self._pending.pop(self._pending_order.popleft()[1], None)
            day, month, _, _ = periods(now)
            ledgers = [self._ledger(s.key) for s in subjects]
            for ledger in ledgers:
                ledger.purge(now)
            for subject, ledger in zip(subjects, ledgers, strict=True):
                rejected = self._check(ledger, subject, reserve_tokens, reserve_micros, now)
                if rejected is not None:
                    rate = rate_info(subjects, [lg.state(now) for lg in ledgers])
                    raise QuotaExceeded(
                        limit=rejected[0], subject_key=subject.key,
                        retry_after_s=max(0.0, rejected[1]), rate=rate,
                    )  # fmt: skip
            expiry = now + self._lease_ttl_s
            for ledger in ledgers:
                ledger.window.append((now, request_id))
                ledger.tokens[request_id] = reserve_tokens
                ledger.num_tokens += reserve_tokens
                ledger.leases[request_id] = expiry
                heapq.heappush(ledger.lease_heap, (expiry, request_id))
                for period in ("d:" + day, "m:" + month):
                    ledger.budgets[period] = ledger.budgets.get(period, 0) + reserve_tokens
                for period in ("dc:" + day, "mc:" + month):
                    ledger.budgets[period] = ledger.budgets.get(period, 0) + reserve_micros
            admission = Admission(
                request_id=request_id,
                subject_keys=tuple(s.key for s in subjects),
                reserved_tokens=reserve_tokens,
                reserved_micros=reserve_micros,
                day=day,
                month=month,
                rate=rate_info(subjects, [lg.state(now) for lg in ledgers]),
            )
            self._pending[request_id] = admission
            self._pending_order.append((now, request_id))
            return admission

    async def settle(self, admission: Admission, *, used_tokens: int, used_micros: int = 0) -> None:
        with self._lock:
            if self._pending.pop(admission.request_id, None) is None:
                return  # already settled
            delta = used_tokens - admission.reserved_tokens
            rid = admission.request_id
            for key in admission.subject_keys:
                ledger = self._ledger(key)
                ledger.leases.pop(rid, None)
                if rid in ledger.tokens:
                    ledger.tokens[rid] = used_tokens
                    ledger.num_tokens += delta
                for period in ("d:" + admission.day, "m:" + admission.month):
                    ledger.budgets[period] = ledger.budgets.get(period, 0) + delta
                micros_delta = used_micros - admission.reserved_micros
                for period in ("dc:" + admission.day, "mc:" + admission.month):
                    ledger.budgets[period] = ledger.budgets.get(period, 0) + micros_delta

    def restore_budgets(self, spent: Iterable[BudgetCharge]) -> None:
        """Add what the usage ledger says was spent before this store existed (a restart) to
        the current periods' budget counters, tokens and micro-units."""
        with self._lock:
            day, month, _, _ = periods(self._clock())
            for charge in spent:
                budgets = self._ledger(charge.subject_key).budgets
                for period, amount in (
                    ("d:" + day, charge.day_tokens), ("m:" + month, charge.month_tokens),
                    ("dc:" + day, charge.day_micros), ("mc:" + month, charge.month_micros),
                ):  # fmt: skip
                    budgets[period] = budgets.get(period, 0) + amount

    async def usage(self, subject_key: str) -> QuotaUsage:
        with self._lock:
            now = self._clock()
            day, month, _, _ = periods(now)
            ledger = self._ledger(subject_key)
            ledger.purge(now)
            return QuotaUsage(
                num_requests=len(ledger.window),
                num_tokens=ledger.num_tokens,
                num_leases=len(ledger.leases),
                day_tokens=ledger.budgets.get("d:" + day, 0),
                month_tokens=ledger.budgets.get("m:" + month, 0),
                window_reset_s=ledger.state(now).requests_reset_s,
                day_spend_micros=ledger.budgets.get("dc:" + day, 0),
                month_spend_micros=ledger.budgets.get("mc:" + month, 0),
            )

    async def close(self) -> None:
        return None
