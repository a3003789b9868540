"""Clients that leave are the common case, not an error: one leaving mid-body, mid-stream or
right after sending leaves at most an INFO line, never a traceback, an `Exception in ASGI
application` or a `Future exception was never retrieved` (real uvicorn, raw sockets)."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gateway_harness import Gateway, SecretScan, gateway_settings
from live_server import live_gateway

from tenancy.auth.scopes import Scope

NOISE = ("Traceback", "Exception in ASGI application", "Future exception was never retrieved")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def _all_records() -> Iterator[list[logging.LogRecord]]:
    """The root logger's records and uvicorn's (whose logger does not propagate)."""
    handler = _Records()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


async def _send_and_leave(port: int, head: str, body: bytes, *, read: int, reset: bool) -> None:
    """Send a request head and (part of) a body, read `read` bytes of the answer, then go."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head.encode() + body)
    await writer.drain()
    if read:
        got = 0
        while got < read and (chunk := await reader.read(read - got)):
            got += len(chunk)
    if reset:  # an abortive close: the gateway sees a reset, not a FIN
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


def _head(path: str, key: str, length: int, content_type: str = "application/json") -> str:
    return (
        f"POST {path} HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {key}\r\n"
        f"content-type: {content_type}\r\ncontent-length: {length}\r\n\r\n"
    )


async def test_clients_that_leave_leave_no_noise(
    tiny_model_dir: Path, tmp_path: Path, secret_scan: SecretScan
) -> None:
    settings = gateway_settings(tiny_model_dir, tmp_path, engine={"max_num_seqs": 32})
    with _all_records() as records:
        async with live_gateway(settings) as (url, state):
            port = int(url.rsplit(":", 1)[1])
            gw = Gateway(state=state, client=None, scan=secret_scan)  # type: ignore[arg-type]
            tenant = await gw.tenant()
            admin = await gw.tenant(scopes=(Scope.ADMIN,))
            chat = (
                b'{"model":"tiny","messages":[{"role":"user","content":"Hello there."}],'
                b'"max_tokens":200,"ignore_eos":true,"stream":true}'
            )
            leavers = []
            for i in range(10):
                reset = i % 2 == 0
                # Mid-body: the head promises more than is sent.
                leavers.append(
                    _send_and_leave(
                        port, _head("/v1/chat/completions", tenant.key, 5000), chat[:40],
                        read=0, reset=reset,
                    )
                )  # fmt: skip
                # Mid-body on an admin upload (multipart).
                upload = f"/admin/v1/tenants/{admin.tenant_id}/adapters"
                leavers.append(
                    _send_and_leave(
                        port, _head(upload, admin.key, 100_000, "multipart/form-data; boundary=x"),
                        b'--x\r\ncontent-disposition: form-data; name="name"\r\n\r\nab',
                        read=0, reset=reset,
                    )
                )  # fmt: skip
                # Right after sending (admission in flight), and mid-stream.
                whole = _head("/v1/chat/completions", tenant.key, len(chat))
                leavers.append(_send_and_leave(port, whole, chat, read=0, reset=reset))
                leavers.append(_send_and_leave(port, whole, chat, read=300 + 50 * i, reset=reset))
            await asyncio.gather(*leavers)
            deadline = asyncio.get_running_loop().time() + 60
            while state.lifecycle.num_in_flight:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
            records_of_tenant = await gw.usage_records(tenant)
            gc.collect()  # an unretrieved future complains when it is collected
            await asyncio.sleep(0.1)
        gc.collect()
    assert records_of_tenant, "no request was admitted: the test did not exercise leaving"
    noisy = [
        f"{r.levelname} {r.name}: {r.getMessage()[:200]}"
        for r in records
        if r.levelno >= logging.ERROR
        or r.exc_info
        or any(noise in r.getMessage() for noise in NOISE)
    ]
    assert not noisy, noisy
