"""`loragate serve`'s HTTP stack follows LORAGATE_HTTP_PARSER and LORAGATE_EVENT_LOOP, and each
parser's protocol reports to the same connection guard (the slow-client limits themselves are
tested against real processes with both parsers in tests/e2e/test_server_limits.py)."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path
from typing import Any

import pytest
from gateway_harness import gateway_settings
from pydantic import ValidationError
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.server.guard import TIMEOUT_RESPONSE, ConnectionGuard, ConnectionLimits
from gateway.server.serve import uvicorn_options


@pytest.mark.parametrize(
    ("parser", "loop", "base"),
    [("h11", "asyncio", H11Protocol), ("httptools", "uvloop", HttpToolsProtocol)],
)
def test_the_settings_choose_the_parser_and_the_loop(
    tiny_model_dir: Path, tmp_path: Path, parser: str, loop: str, base: type
) -> None:
    settings = gateway_settings(tiny_model_dir, tmp_path, http_parser=parser, event_loop=loop)
    options = uvicorn_options(settings, log_level="warning")
    assert options["loop"] == loop
    protocol = options["http"]
    assert issubclass(protocol.func, base)
    assert protocol.keywords["limits"].header_timeout_s == settings.header_timeout_s
    # `--workers N` pickles uvicorn's config into each worker (a class local to a function
    # failed there: every multi-worker gateway exited at start).
    assert pickle.loads(pickle.dumps(protocol)).func is protocol.func


def test_an_unknown_parser_is_refused_naming_the_field(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(ValidationError, match="http_parser"):
        gateway_settings(tiny_model_dir, tmp_path, http_parser="picohttp")


class _Transport:
    def __init__(self) -> None:
        self.written = b""
        self.is_closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.is_closed = True

    def is_closing(self) -> bool:
        return self.is_closed


async def _guard(limits: ConnectionLimits, answered: bool = False) -> tuple[ConnectionGuard, Any]:
    transport = _Transport()
    guard = ConnectionGuard(limits, asyncio.get_running_loop(), transport, lambda: answered)  # type: ignore[arg-type]
    return guard, transport


async def test_the_guard_times_a_head_then_a_body_and_counts_per_client() -> None:
    limits = ConnectionLimits(header_timeout_s=0.05, body_timeout_s=0.05, max_per_client=1)
    guard, transport = await _guard(limits)
    assert guard.opened("10.0.0.1") and guard.phase == "head"
    second, refused = await _guard(limits)
    assert not second.opened("10.0.0.1") and refused.is_closed  # the client's share is one
    guard.head_read()
    assert guard.phase == "body"
    guard.body_read()
    await asyncio.sleep(0.1)
    assert not transport.is_closed and guard.phase == ""  # read in time: no deadline runs
    guard.request_begun()  # the next request on the kept-alive connection
    await asyncio.sleep(0.1)
    assert transport.is_closed and transport.written == TIMEOUT_RESPONSE
    guard.closed()
    assert limits.open_by_client == {}


async def test_a_late_body_after_an_early_answer_closes_without_a_408() -> None:
    limits = ConnectionLimits(header_timeout_s=1, body_timeout_s=0.05, max_per_client=4)
    guard, transport = await _guard(limits, answered=True)
    assert guard.opened("10.0.0.2")
    guard.head_read()
    await asyncio.sleep(0.1)
    assert transport.is_closed and transport.written == b""


async def test_the_guard_bounds_a_head_s_bytes_and_counts_each_head_afresh() -> None:
    limits = ConnectionLimits(
        header_timeout_s=1, body_timeout_s=1, max_per_client=4, max_header_bytes=50_000
    )
    guard, transport = await _guard(limits)
    assert guard.opened("10.0.0.3")
    guard.read_within_head(30_000)
    guard.head_read()
    guard.body_read()
    guard.request_begun()  # the next request: its head is counted from 0
    guard.read_within_head(30_000)
    assert not transport.is_closed
    guard.read_within_head(30_000)  # 60,000 bytes of one head
    assert transport.is_closed and transport.written.startswith(b"HTTP/1.1 431 ")
    assert b"larger than 50000 bytes" in transport.written
    assert guard.phase == ""  # no 408 follows
    guard.closed()
