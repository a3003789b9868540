"""Settings refuse unsafe or inconsistent values (naming the field); the SSE response sends
keep-alive comments while an engine is silent and always closes its event source."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.lifecycle.service import KEEPALIVE, EventStreamResponse
from gateway.settings import GatewaySettings


def _settings(model: Path, **overrides: Any) -> GatewaySettings:
    values: dict[str, Any] = {
        "model": model,
        "key_pepper": secrets.token_urlsafe(32),
        "salt_secret": secrets.token_urlsafe(32),
    }
    values.update(overrides)
    return GatewaySettings(**values)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"key_pepper": ""}, "key_pepper"),
        ({"salt_secret": "changeme"}, "salt_secret"),
        ({"key_pepper": "x" * 40}, "key_pepper"),  # a placeholder-like value
        ({"engine_mode": "http"}, "engine_urls"),
        ({"engine_urls": ["ftp://engine:8100"]}, "engine_urls"),
        ({"engine_kind": "vllm"}, "engine_kind"),
        ({"max_body_bytes": 10}, "max_body_bytes"),
    ],
)
def test_unsafe_or_inconsistent_settings_are_refused(
    tiny_model_dir: Path, overrides: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        _settings(tiny_model_dir, **overrides)
    assert field in str(caught.value)


def test_missing_secrets_are_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(ValidationError) as caught:
        GatewaySettings(model=tiny_model_dir)  # type: ignore[call-arg]
    assert "key_pepper" in str(caught.value) and "salt_secret" in str(caught.value)


def test_served_model_shapes_become_the_adapter_checks(tiny_model_dir: Path) -> None:
    settings = _settings(tiny_model_dir, served_model_name="tiny", engine={"max_lora_rank": 8})
    assert settings.base_model.name == "tiny"
    assert settings.base_model.hidden_size == 256 and settings.base_model.num_hidden_layers == 8
    assert settings.adapter_limits.max_rank == 8


class Source:
    """The two things the streamed response uses of a run: its event queue and client_gone."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.num_gone_calls = 0
        self.num_first_sent_calls = 0

    def client_gone(self) -> None:
        self.num_gone_calls += 1

    def first_sent(self) -> None:
        self.num_first_sent_calls += 1


async def test_keepalive_comments_while_the_engine_is_silent_and_the_end_is_sent() -> None:
    source = Source()

    async def engine() -> None:
        await asyncio.sleep(0.35)  # a request waiting in the engine's queue
        source.events.put_nowait(b"data: {}\n\n")
        source.events.put_nowait(None)

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the client stays
        return {}

    producer = asyncio.create_task(engine())
    response = EventStreamResponse(source, b"", headers={}, keepalive_s=0.1)
    await response({"type": "http"}, receive, send)
    await producer
    bodies = [m.get("body") for m in sent if m["type"] == "http.response.body"]
    assert bodies.count(KEEPALIVE) >= 2
    assert bodies[-2:] == [b"data: {}\n\n", b""]
    assert sent[-1].get("more_body") is False
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
    assert not any(k == b"content-length" for k, _ in start["headers"])


async def test_events_already_queued_go_out_in_one_send_and_stay_whole() -> None:
    """A gateway behind its engine catches up in one body message (issue 48), not one per
    event; each SSE event is still whole and in order, and the end still ends the stream."""
    source = Source()
    events = [f'data: {{"i": {i}}}\n\n'.encode() for i in range(5)]
    for event in events:
        source.events.put_nowait(event)
    source.events.put_nowait(None)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    response = EventStreamResponse(source, b"data: first\n\n", headers={}, keepalive_s=1.0)
    await asyncio.wait_for(response({"type": "http"}, receive, send), 5)
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body"]
    assert bodies == [b"data: first\n\n", b"".join(events), b""]
    assert source.num_first_sent_calls >= 1  # the run may go on past its first bytes


async def test_a_client_that_leaves_is_reported_to_the_run_at_once() -> None:
    source = Source()

    async def engine() -> None:
        while True:
            await asyncio.sleep(0.01)
            source.events.put_nowait(b"data: {}\n\n")

    async def send(message: dict[str, Any]) -> None:
        return None

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(0.1)
        return {"type": "http.disconnect"}

    producer = asyncio.create_task(engine())
    response = EventStreamResponse(source, b"data: {}\n\n", headers={}, keepalive_s=1.0)
    try:
        await asyncio.wait_for(response({"type": "http"}, receive, send), 5)
    finally:
        producer.cancel()
    assert source.num_gone_calls >= 1


@pytest.mark.parametrize(
    ("overrides", "needs"),
    [
        ({}, "LORAGATE_ENGINE_MODE=http"),
        ({"engine_mode": "http", "engine_urls": ["http://e:8100"]}, "LORAGATE_QUOTA_STORE=redis"),
    ],
)
def test_workers_need_an_http_engine_and_a_shared_quota_store(
    tiny_model_dir: Path, overrides: dict[str, Any], needs: str
) -> None:
    from gateway.server.serve import workers_refusal

    settings = _settings(tiny_model_dir, **overrides)
    assert workers_refusal(settings, 1) is None
    refusal = workers_refusal(settings, 4)
    assert refusal is not None and needs in refusal
    shared = _settings(
        tiny_model_dir, engine_mode="http", engine_urls=["http://e:8100"],
        quota_store="redis", redis_url="redis://r:6379/0",
    )  # fmt: skip
    assert workers_refusal(shared, 4) is None


def test_one_nested_setting_keeps_the_others_derived(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LORAGATE_ADAPTER_LIMITS__MAX_FILES must not lift the rank cap, and
    LORAGATE_BASE_MODEL__NAME must not drop the checkpoint's shapes."""
    monkeypatch.setenv("LORAGATE_ADAPTER_LIMITS__MAX_FILES", "3")
    monkeypatch.setenv("LORAGATE_BASE_MODEL__NAME", "an-alias")
    settings = _settings(tiny_model_dir, engine={"max_lora_rank": 8})
    assert settings.adapter_limits.max_files == 3
    assert settings.adapter_limits.max_rank == 8  # still capped by the engine
    assert settings.base_model.name == "an-alias"
    assert settings.base_model.hidden_size == 256  # still the checkpoint's
    monkeypatch.setenv("LORAGATE_ADAPTER_LIMITS__MAX_RANK", "4")
    assert _settings(tiny_model_dir).adapter_limits.max_rank == 4  # an explicit choice stands
