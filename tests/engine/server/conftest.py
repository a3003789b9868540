"""Fixtures of the engine-server tests: the real engine on the tiny model (one per test module),
the async engine over it, an httpx client on the app's ASGI transport, and a live uvicorn on a
free loopback port for the tests that need a real stream (abort while streaming, disconnects)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from engine.config import EngineConfig
from engine.loop.async_engine import AsyncEngine
from engine.loop.llm_engine import LLMEngine
from engine.server import create_app
from tests.engine.loop.async_helpers import TIMEOUT_S, shut_down_checked


@pytest.fixture(scope="module")
def llm_engine(tiny_model_dir: Path) -> Iterator[LLMEngine]:
    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_model_dir), served_model_name="tiny", num_kv_blocks=256, max_num_seqs=8
        )
    )
    yield engine
    engine.check_invariants()


@pytest.fixture
async def engine(llm_engine: LLMEngine) -> AsyncIterator[AsyncEngine]:
    async_engine = AsyncEngine(llm_engine)
    yield async_engine
    await shut_down_checked(async_engine, llm_engine)


@pytest.fixture
async def client(engine: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://engine", timeout=TIMEOUT_S
    ) as http:
        yield http


@pytest.fixture
async def live_url(engine: AsyncEngine) -> AsyncIterator[str]:
    """A real uvicorn serving the app; leaving runs the app's lifespan shutdown (drain)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # connections wait in the backlog until uvicorn accepts them
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(engine), log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    await asyncio.wait_for(task, TIMEOUT_S)
    sock.close()
    assert not engine.is_healthy  # the lifespan drained and stopped the engine
