"""The parts of budget alerts that need no server: the signature, the sealed secret, and how a
subject's usage becomes readings and thresholds (tokens and currency budgets)."""

from __future__ import annotations

import time

import pytest

from tenancy.alerts import signing
from tenancy.alerts.budgets import (
    READERS,
    BudgetReading,
    crossed,
    has_budget,
    spend_readings,
    token_readings,
)
from tenancy.alerts.secret_box import SecretBox, new_secret
from tenancy.quota.store import QuotaLimits, QuotaUsage

BODY = b'{"id":"e1","type":"budget.threshold"}'


def test_signature_verifies_and_refuses_tampering_and_replays() -> None:
    secret, now = new_secret(), int(time.time())
    header = signing.signature_header(secret, now, BODY)
    assert header.startswith("v1=") and len(header) == 3 + 64
    assert signing.verify(secret, body=BODY, timestamp=str(now), header=header)
    assert not signing.verify(secret, body=BODY + b" ", timestamp=str(now), header=header)
    assert not signing.verify(secret, body=BODY, timestamp=str(now + 1), header=header)
    assert not signing.verify(new_secret(), body=BODY, timestamp=str(now), header=header)
    assert not signing.verify(secret, body=BODY, timestamp="soon", header=header)
    old = now - 3600  # a captured delivery, replayed an hour later
    stale = signing.signature_header(secret, old, BODY)
    assert not signing.verify(secret, body=BODY, timestamp=str(old), header=stale)
    assert signing.verify(secret, body=BODY, timestamp=str(old), header=stale, now=old + 10)
    # several schemes side by side (a future v2): v1 is found among them
    assert signing.verify(secret, body=BODY, timestamp=str(now), header="v2=abc, " + header)


def test_the_signature_is_the_documented_hmac() -> None:
    import hashlib
    import hmac

    expected = hmac.new(b"whsec_k", b"1700000000." + BODY, hashlib.sha256).hexdigest()
    assert signing.signature("whsec_k", 1700000000, BODY) == expected


def test_sealed_secrets_open_only_for_their_webhook_and_key() -> None:
    box = SecretBox(b"p" * 40)
    secret = new_secret()
    sealed = box.seal(secret, webhook_id="w1")
    assert secret not in sealed and box.open(sealed, webhook_id="w1") == secret
    assert box.seal(secret, webhook_id="w1") != sealed  # a fresh nonce each time
    with pytest.raises(ValueError):
        box.open(sealed, webhook_id="w2")  # copied onto another webhook's row
    with pytest.raises(ValueError):
        SecretBox(b"q" * 40).open(sealed, webhook_id="w1")  # another pepper


USAGE = QuotaUsage(0, 0, 0, day_tokens=800, month_tokens=900, day_spend_micros=5_000_000,
                   month_spend_micros=9_000_000)  # fmt: skip


def test_token_and_spend_readings() -> None:
    limits = QuotaLimits(daily_token_budget=1000, monthly_spend_budget_micros=10_000_000)
    readings = [r for reader in READERS for r in reader("k:9", limits, USAGE, "20261129", "202611")]
    assert readings == [
        BudgetReading("k:9", "daily_token_budget", "tokens", "2026-11-29", 800, 1000),
        BudgetReading("k:9", "monthly_spend_budget_micros", "micros", "2026-11", 9_000_000,
                      10_000_000),
    ]  # fmt: skip
    assert token_readings("t:1", QuotaLimits(), USAGE, "20261129", "202611") == []
    both = QuotaLimits(daily_spend_budget_micros=6_000_000, monthly_token_budget=1000)
    assert [r.budget for r in spend_readings("t:1", both, USAGE, "20261129", "202611")] == [
        "daily_spend_budget_micros"
    ]
    assert has_budget(both) and has_budget(limits)
    assert not has_budget(QuotaLimits(requests_per_minute=5, tokens_per_minute=100))


def test_thresholds_crossed_at_the_edge_and_when_exhausted() -> None:
    reading = BudgetReading("t:1", "daily_token_budget", "tokens", "2026-11-29", 800, 1000)
    assert crossed(reading, (50, 80, 100), exhausted=False) == [50, 80]
    assert crossed(reading, (50, 81, 100), exhausted=False) == [50]
    assert crossed(reading, (50, 80, 100), exhausted=True) == [50, 80, 100]
    assert crossed(reading, (50, 80), exhausted=True) == [50, 80]  # 100 not asked for
    full = BudgetReading("t:1", "daily_token_budget", "tokens", "2026-11-29", 1000, 1000)
    assert crossed(full, (100,), exhausted=False) == [100]
    odd = BudgetReading("t:1", "monthly_token_budget", "tokens", "2026-11", 1, 3)
    assert crossed(odd, (33, 34), exhausted=False) == [33]  # 1/3 is 33.3%: integers, no rounding
