"""The webhook sender: a background task that sends what the outbox holds, never a request's.

Each round takes the deliveries that are due (`outbox.due`), claims each for one attempt (so
replicas share the work and never send the same attempt twice), signs the stored body with a
fresh timestamp (signing.py), checks the target again (targets.py: no private address unless
allowed, the checked address is the one connected to, no redirects) and POSTs it. A 2xx ends
the delivery; anything else is logged as an attempt and retried after
`backoff_s * 2**(attempt-1)` seconds (at most `backoff_max_s`), up to `max_attempts`, after
which the delivery is `failed`. A round runs when `wake()` is called (an alert was just
enqueued) and every `poll_interval_s` (retries, and deliveries another replica left behind);
once an hour it also prunes the log past `retention_days`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable

import httpx
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tenancy.alerts import outbox, signing
from tenancy.alerts.outbox import Claimed, Outcome
from tenancy.alerts.secret_box import SecretBox
from tenancy.alerts.settings import AlertSettings
from tenancy.alerts.targets import TargetRefused, resolve
from tenancy.rounds import RoundLoop

log = logging.getLogger(__name__)

BATCH = 32
PRUNE_EVERY = dt.timedelta(hours=1)
USER_AGENT = "loragate-webhooks/1"


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class DeliveryWorker:
    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        settings: AlertSettings,
        box: SecretBox,
        *,
        now: Callable[[], dt.datetime] = _utcnow,
    ) -> None:
        self._sessionmaker = sessionmaker
        self._settings = settings
        self._box = box
        self._now = now
        # No redirects (a 3xx is a failed attempt): a redirect could lead past the address check.
        self._http = httpx.AsyncClient(
            timeout=settings.timeout_s, follow_redirects=False, trust_env=False
        )
        self._rounds = RoundLoop(
            self._round,
            name="alert-delivery",
            on_failure=_round_failed,
            interval_s=settings.poll_interval_s,
        )
        self._pruned_at: dt.datetime | None = None
        self.num_sent = 0

    def wake(self) -> None:
        self._rounds.wake()

    def start(self) -> None:
        self._rounds.start()

    async def _round(self) -> None:
        await self.run_once()
        await self.prune_if_due()

    async def prune_if_due(self) -> bool:
        now = self._now()
        if self._pruned_at is not None and now - self._pruned_at < PRUNE_EVERY:
            return False
        keep = dt.timedelta(days=self._settings.retention_days)
        await outbox.prune(self._sessionmaker, now=now, keep=keep)
        self._pruned_at = now
        return True

    async def run_once(self) -> int:
        """Attempt every delivery due now, concurrently; returns how many were attempted."""
        now = self._now()
        ids = await outbox.due(self._sessionmaker, now=now, limit=BATCH)
        until = now + dt.timedelta(seconds=self._settings.claim_s)
        claims = [await outbox.claim(self._sessionmaker, i, now=now, until=until) for i in ids]
        taken = [c for c in claims if c is not None]
        await asyncio.gather(*(self._attempt(c) for c in taken))
        return len(taken)

    def backoff_s(self, attempt: int) -> float:
        return min(self._settings.backoff_max_s, self._settings.backoff_s * 2 ** (attempt - 1))

    async def _attempt(self, claimed: Claimed) -> None:
        started = self._now()
        status_code, error = await self._send(claimed)
        outcome = Outcome(started, self._now(), status_code, error)
        retry = not outcome.is_ok and claimed.attempt < self._settings.max_attempts
        if claimed.webhook is None or not claimed.webhook.enabled:
            retry = False  # nowhere to send it: retrying cannot help
        next_at = outcome.finished_at + dt.timedelta(seconds=self.backoff_s(claimed.attempt))
        await outbox.record(
            self._sessionmaker, claimed, outcome, next_attempt_at=next_at if retry else None
        )
        if outcome.is_ok:
            self.num_sent += 1
        else:  # the tenant's URL is its own business; the log names the delivery only
            log.info(
                "webhook delivery %s attempt %d failed: %s",
                claimed.id, claimed.attempt, error or f"HTTP {status_code}",
            )  # fmt: skip

    async def _send(self, claimed: Claimed) -> tuple[int | None, str | None]:
        webhook = claimed.webhook
        if webhook is None:
            return None, "no webhook configured"
        if not webhook.enabled:
            return None, "webhook disabled"
        try:
            secret = self._box.open(webhook.secret_sealed, webhook_id=webhook.id)
        except ValueError:
            return None, "the signing secret cannot be read (rotate it)"
        try:
            target = await resolve(webhook.url, allow_private=self._settings.allow_private_urls)
        except TargetRefused as exc:
            return None, f"refused: {exc}"[:200]
        body = claimed.body.encode()
        timestamp = int(time.time())
        headers = {
            "host": target.host_header,
            "content-type": "application/json",
            "user-agent": USER_AGENT,
            signing.TIMESTAMP_HEADER: str(timestamp),
            signing.SIGNATURE_HEADER: signing.signature_header(secret, timestamp, body),
            signing.EVENT_ID_HEADER: claimed.id,
            signing.EVENT_TYPE_HEADER: claimed.event_type,
            signing.ATTEMPT_HEADER: str(claimed.attempt),
        }
        extensions = {"sni_hostname": target.sni_hostname} if target.sni_hostname else {}
        try:
            response = await self._http.post(
                target.url, content=body, headers=headers, extensions=extensions
            )
        except httpx.HTTPError as exc:
            return None, type(exc).__name__
        if 200 <= response.status_code < 300:
            return response.status_code, None
        return response.status_code, f"HTTP {response.status_code}"

    async def close(self) -> None:
        await self._rounds.close()
        await self._http.aclose()


def _round_failed(exc: Exception) -> None:
    # The database is down: the next round retries.
    log.warning("alert delivery round failed (%s); retrying", type(exc).__name__)
