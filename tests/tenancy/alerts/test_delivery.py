"""The sender against a real receiver: bounded retries end `failed` with every attempt logged
and the waits doubling; a redirect is a failed attempt and is never followed; a disabled
webhook fails at once without retries; and a URL that resolves to a private address is refused
again at delivery (the configuration may have allowed it then), with nothing sent."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from admin_harness import Harness, admin_harness
from sqlalchemy import select, update
from tenancy_factories import SecretRegistry
from webhook_receiver import webhook_receiver

from tenancy.alerts.delivery import DeliveryWorker
from tenancy.alerts.secret_box import SecretBox
from tenancy.alerts.settings import AlertSettings
from tenancy.settings import TenancySettings
from tenancy.sql.models import AlertWebhook

FAST = {"backoff_s": 0.05, "max_attempts": 3}


async def _hooked(h: Harness, url: str, reg: SecretRegistry) -> str:
    r = await h.call("POST", "/tenants", json={"name": f"t-{len(reg.values)}-{id(h) % 997}"})
    tid = str(r.json()["id"])
    r = await h.call("POST", f"/tenants/{tid}/webhook", json={"url": url})
    assert r.status_code == 201, r.text
    reg.add(r.json()["secret"])
    assert (await h.call("POST", f"/tenants/{tid}/webhook/test")).status_code == 202
    return tid


def _worker(h: Harness, **settings: object) -> DeliveryWorker:
    box = SecretBox(h.runtime.settings.key_pepper.get_secret_value().encode())
    return DeliveryWorker(h.runtime.sessionmaker, AlertSettings(**settings), box)  # type: ignore[arg-type]


async def _drain(worker: DeliveryWorker, rounds: int = 60) -> None:
    import asyncio

    for _ in range(rounds):
        await worker.run_once()
        await asyncio.sleep(0.02)


async def _log(h: Harness, tid: str) -> dict[str, object]:
    [delivery] = (await h.call("GET", f"/tenants/{tid}/webhook/deliveries")).json()
    return dict(delivery)


async def test_retries_are_bounded_and_logged(
    make_settings: Callable[..., TenancySettings], secret_registry: SecretRegistry
) -> None:
    async with admin_harness(make_settings(alerts={"allow_private_urls": True})) as h:
        secret_registry.add(h.admin_key)
        with webhook_receiver(statuses=[500] * 10) as receiver:
            tid = await _hooked(h, receiver.url, secret_registry)
            worker = _worker(h, allow_private_urls=True, **FAST)
            await _drain(worker)
            await worker.close()
            assert [r.answered for r in receiver.received] == [500, 500, 500]
        delivery = await _log(h, tid)
        assert delivery["status"] == "failed" and delivery["num_attempts"] == 3
        attempts = delivery["attempts"]
        assert [a["status_code"] for a in attempts] == [500, 500, 500]  # type: ignore[index]
        starts = [dt.datetime.fromisoformat(a["started_at"]) for a in attempts]  # type: ignore[index]
        assert (starts[1] - starts[0]).total_seconds() >= 0.05
        assert (starts[2] - starts[1]).total_seconds() >= 0.1  # doubled


async def test_redirects_disabled_webhooks_and_private_addresses(
    make_settings: Callable[..., TenancySettings], secret_registry: SecretRegistry
) -> None:
    async with admin_harness(make_settings(alerts={"allow_private_urls": True})) as h:
        secret_registry.add(h.admin_key)
        with webhook_receiver(statuses=[302] * 10) as receiver:
            redirected = await _hooked(h, receiver.url, secret_registry)
            worker = _worker(h, allow_private_urls=True, max_attempts=1)
            await _drain(worker, rounds=3)
            assert [r.answered for r in receiver.received] == [302]  # not followed
            attempt = (await _log(h, redirected))["attempts"][0]  # type: ignore[index]
            assert attempt["status_code"] == 302 and attempt["error"] == "HTTP 302"
            disabled = await _hooked(h, receiver.url, secret_registry)
            async with h.runtime.sessionmaker() as session:
                await session.execute(
                    update(AlertWebhook)
                    .where(AlertWebhook.tenant_id == disabled)
                    .values(enabled=False)
                )
                await session.commit()
            await _drain(_worker(h, allow_private_urls=True, **FAST), rounds=10)
            delivery = await _log(h, disabled)
            assert delivery["status"] == "failed" and delivery["num_attempts"] == 1
            assert delivery["attempts"][0]["error"] == "webhook disabled"  # type: ignore[index]
            refused = await _hooked(h, receiver.url, secret_registry)
            strict = _worker(h, allow_private_urls=False, max_attempts=1)  # the production default
            await _drain(strict, rounds=3)
            await worker.close()
            await strict.close()
            assert len(receiver.received) == 1  # nothing more reached the loopback receiver
        error = (await _log(h, refused))["attempts"][0]["error"]  # type: ignore[index]
        assert error.startswith("refused:") and "private" in error
        async with h.runtime.sessionmaker() as session:
            assert (await session.scalars(select(AlertWebhook.url))).all()  # still configured
