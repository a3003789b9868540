"""The HTTP server facing clients (issue 10), against a real `loragate serve` process:

- clients that dribble their request head or body are cut off after the deadline (408), and
  one client address cannot hold more than its share of connections, while other clients are
  served all along;
- a request head over LORAGATE_MAX_HEADER_BYTES (one huge header, thousands of headers, a huge
  URL) gets 431 and the connection closes, with either parser; a head under it is served;
- a body over LORAGATE_MAX_BODY_BYTES gets 413 long before the client has sent it (declared:
  from the head alone; chunked: once past the limit);
- a key sent in a query string, and anything shaped like a key, never reaches a log line;
- the audit log records the request id the response carries (sanitized), and the peer's
  address unless a configured proxy forwarded another;
- /metrics beyond loopback without a token: the gateway refuses to start.
"""

from __future__ import annotations

import asyncio
import select
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gateway_process import BIN, GatewayProcess, gateway_env, start_gateway

from gateway.settings import GatewaySettings

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
PER_CLIENT = 40
ATTACKERS = 200  # from 127.0.0.2, so the per-client bound does not touch the test's own client


@pytest.fixture(scope="module", params=["h11", "httptools"])
def guarded(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayProcess]:
    """A gateway per HTTP parser: the limits live apart from the parser (gateway/server/guard.py)
    and must hold with each (the httptools one on uvloop)."""
    workdir = tmp_path_factory.mktemp("guarded")
    env = gateway_env(
        tiny_model_dir,
        workdir,
        LORAGATE_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
        LORAGATE_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S),
        LORAGATE_MAX_CONNECTIONS_PER_CLIENT=str(PER_CLIENT),
        LORAGATE_HTTP_PARSER=request.param,
        LORAGATE_EVENT_LOOP="uvloop" if request.param == "httptools" else "asyncio",
    )
    gateway = start_gateway(env, workdir)
    try:
        yield gateway
    finally:
        gateway.stop()
    assert not gateway.leaked_secrets()


async def _dribble(port: int, seen: dict[str, int]) -> None:
    """A slow-loris client: a request head one byte at a time, never finished."""
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, local_addr=("127.0.0.2", 0)
        )
    except OSError:
        seen["refused"] += 1
        return
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    started = time.monotonic()
    try:
        for byte in head:
            writer.write(bytes([byte]))
            await writer.drain()
            try:
                answer = await asyncio.wait_for(reader.read(4096), 0.3)
            except TimeoutError:
                continue
            kind = "timed_out" if answer.startswith(b"HTTP/1.1 408") else "closed"
            seen[kind] += 1
            seen["max_held_s"] = max(seen["max_held_s"], int(time.monotonic() - started))
            return
        seen["survived"] += 1
    except (ConnectionError, OSError):
        seen["closed"] += 1
    finally:
        writer.close()


def test_slow_clients_are_cut_off_and_bounded_while_others_are_served(
    guarded: GatewayProcess,
) -> None:
    port = int(guarded.url.rsplit(":", 1)[1])
    tenant = guarded.tenant()
    seen = {"timed_out": 0, "closed": 0, "refused": 0, "survived": 0, "max_held_s": 0}

    async def attack_and_serve() -> list[float]:
        attack = asyncio.gather(*(_dribble(port, seen) for _ in range(ATTACKERS)))
        await asyncio.sleep(0.5)  # the attackers hold their connections now
        latencies = []
        async with httpx.AsyncClient(timeout=30) as client:
            for _ in range(5):
                started = time.monotonic()
                r = await client.get(
                    guarded.url + "/v1/models", headers={"authorization": f"Bearer {tenant.key}"}
                )
                assert r.status_code == 200
                latencies.append(time.monotonic() - started)
        await attack
        return latencies

    latencies = asyncio.run(attack_and_serve())
    assert seen["survived"] == 0, seen  # nobody dribbled a whole head past the deadline
    assert seen["refused"] == 0
    # At most PER_CLIENT were held until their deadline (408); the rest were closed at once.
    assert 0 < seen["timed_out"] <= PER_CLIENT, seen
    assert seen["closed"] >= ATTACKERS - PER_CLIENT, seen
    assert seen["max_held_s"] <= HEADER_TIMEOUT_S + 2, seen
    assert len(latencies) == 5  # the test's own client was served during the attack


def test_a_dribbled_body_is_cut_off(guarded: GatewayProcess) -> None:
    port = int(guarded.url.rsplit(":", 1)[1])
    tenant = guarded.tenant()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + tenant.key.encode() + b"\r\ncontent-length: 500\r\n\r\n{"
        )
        started = time.monotonic()
        answer = sock.recv(4096)
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"code": "request_timeout"' in answer
    assert waited <= BODY_TIMEOUT_S + 2


MAX_HEADER_BYTES = GatewaySettings.model_fields["max_header_bytes"].default  # 32 KiB
HUGE = 16 * 1024 * 1024


def _send_head(port: int, head: bytes) -> tuple[bytes, int]:
    """Send `head` in 64 KiB pieces, stopping when the server answers or closes; returns (what
    it answered, bytes sent). A server that reads the whole head takes all of it."""
    sent = 0
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            while sent < len(head):
                sent += sock.send(head[sent : sent + 65536])
                readable, _, _ = select.select([sock], [], [], 0)
                if readable:
                    break
            sock.settimeout(30)
            while chunk := sock.recv(65536):
                answer += chunk
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed on us: what arrived before the reset is in `answer`
    return answer, sent


@pytest.mark.parametrize(
    "shape",
    ["one huge header", "thousands of headers", "a huge URL"],
)
def test_a_huge_request_head_gets_431_and_is_dropped(guarded: GatewayProcess, shape: str) -> None:
    port = int(guarded.url.rsplit(":", 1)[1])
    head = {
        "one huge header": b"GET /health HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * HUGE,
        "thousands of headers": b"GET /health HTTP/1.1\r\nhost: x\r\n"
        + b"".join(b"x-h%d: v\r\n" % i for i in range(HUGE // 16)),
        "a huge URL": b"GET /health?" + b"q" * HUGE,
    }[shape]
    answer, sent = _send_head(port, head)
    # Cut off long before the end (the kernel's socket buffers hold a few MB at most).
    assert sent < HUGE // 2, sent
    if answer:  # seen unless the close reset the connection before it was read
        assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
        assert b'"code": "request_header_fields_too_large"' in answer
    assert httpx.get(guarded.url + "/health", timeout=30).status_code == 200


def test_a_head_under_the_bound_is_served(guarded: GatewayProcess) -> None:
    """20 KiB of headers: over h11's own default (16 KiB, which answered 400), under ours."""
    pad = "a" * (20 * 1024)
    r = httpx.get(guarded.url + "/health", headers={"x-pad": pad}, timeout=30)
    assert r.status_code == 200, r.text
    answer, _ = _send_head(
        int(guarded.url.rsplit(":", 1)[1]),
        b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx-pad: "
        + b"b" * (MAX_HEADER_BYTES - 200)
        + b"\r\n\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


MAX_BODY_BYTES = GatewaySettings.model_fields["max_body_bytes"].default  # 2 MiB


def _send_body(port: int, head: bytes, chunks: Iterator[bytes]) -> tuple[bytes, int]:
    """The head, then body pieces until the server answers or closes; returns (what it
    answered, body bytes sent)."""
    sent = 0
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        try:
            for chunk in chunks:
                readable, _, _ = select.select([sock], [], [], 0)
                if readable:
                    break
                sock.sendall(chunk)
                sent += len(chunk)
            sock.settimeout(30)
            while piece := sock.recv(65536):
                answer += piece
                if b"\r\n\r\n" in answer and b"content-length" in answer.lower():
                    break  # the whole answer is small: the head and a JSON error
        except (BrokenPipeError, ConnectionResetError):
            pass
    return answer, sent


@pytest.mark.parametrize("framing", ["declared length", "chunked"])
def test_an_oversized_body_gets_413_without_being_read(
    guarded: GatewayProcess, framing: str
) -> None:
    port = int(guarded.url.rsplit(":", 1)[1])
    tenant = guarded.tenant()
    total = 64 * MAX_BODY_BYTES
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer " + tenant.key.encode() + b"\r\n"
    )
    piece = b"x" * 65536
    if framing == "declared length":  # known from the head: answered before any body byte
        head += b"content-length: %d\r\n\r\n" % total
        chunks: Iterator[bytes] = iter(())
    else:
        head += b"transfer-encoding: chunked\r\n\r\n"
        chunks = (b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(total // len(piece)))
    answer, sent = _send_body(port, head, chunks)
    assert sent < total // 2, sent  # refused long before the end
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert httpx.get(guarded.url + "/health", timeout=30).status_code == 200


def test_keys_in_query_strings_never_reach_the_log(guarded: GatewayProcess) -> None:
    tenant = guarded.tenant()
    r = httpx.get(
        guarded.url + f"/v1/models?api_key={tenant.key}&x=1",
        headers={"authorization": f"Bearer {tenant.key}"},
        timeout=30,
    )
    assert r.status_code == 200
    r = httpx.get(guarded.url + f"/v1/models/{tenant.key}", timeout=30)  # a key in a path
    assert r.status_code == 401
    deadline = time.monotonic() + 10
    while "/v1/models?[query]" not in guarded.log_text():
        assert time.monotonic() < deadline, guarded.log_text()[-2000:]
        time.sleep(0.1)
    log = guarded.log_text()
    assert tenant.key not in log and "api_key=" not in log
    assert "/v1/models/[key]" in log


def test_the_audit_log_records_the_sanitized_id_and_the_peer_address(
    guarded: GatewayProcess,
) -> None:
    r = guarded.admin(
        "POST",
        "/tenants",
        json={"name": "audited-tenant"},
        headers={"x-request-id": "<script>alert(1)</script>", "x-forwarded-for": "6.6.6.6"},
    )
    assert r.status_code == 201, r.text
    sent_id = r.headers["x-request-id"]
    assert sent_id.startswith("req_")  # the client's unsafe id was replaced
    events = guarded.admin("GET", "/audit", params={"action": "tenant.create"}).json()
    event = next(e for e in events if e["object_id"] == r.json()["id"])
    assert event["request_id"] == sent_id
    assert event["client_addr"] == "127.0.0.1"  # no proxy is trusted by default


def test_metrics_beyond_loopback_need_a_token_or_no_start(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    env = gateway_env(tiny_model_dir, tmp_path)
    env.pop("LORAGATE_METRICS_TOKEN", None)
    done = subprocess.run(
        [str(BIN / "loragate"), "serve", "--host", "0.0.0.0", "--port", "1"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "LORAGATE_METRICS_TOKEN" in done.stderr


def test_serve_refuses_an_unmigrated_database_naming_the_fix(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    env = gateway_env(tiny_model_dir, tmp_path, LORAGATE_AUTO_MIGRATE="false")
    done = subprocess.run(
        [str(BIN / "loragate"), "serve", "--port", "1"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "never been migrated" in done.stderr and "loragate admin migrate" in done.stderr
