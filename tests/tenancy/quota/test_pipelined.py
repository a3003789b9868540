"""The quota store's pipelined Redis connection (tenancy/quota/pipelined.py): replies reach the
right callers under concurrency and cancellation, partial reads, errors, a restarted server, a
server that stops answering, and the URL's password and database. The quota semantics on it are
tests/tenancy/test_quotas.py's (its `make_store` runs every test on this client too)."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import uuid

import pytest
import redis.asyncio as aioredis
import uvloop
from redis.exceptions import AuthenticationError, ConnectionError, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeout
from services import KillableRedis, free_port, wait_port

from tenancy.errors import ServiceUnavailable
from tenancy.ids import RequestId
from tenancy.quota.pipelined import PipelinedRedis, _Incomplete, pack, parse
from tenancy.quota.redis_store import RedisQuotaStore
from tenancy.quota.store import QuotaLimits, QuotaSubject


def test_pack_is_resp_bulk_strings() -> None:
    assert pack(("GET", b"k", 7)) == b"*3\r\n$3\r\nGET\r\n$1\r\nk\r\n$1\r\n7\r\n"


def test_parse_every_reply_type_and_waits_for_the_rest() -> None:
    reply = b"*4\r\n:-3\r\n$2\r\nhi\r\n$-1\r\n*1\r\n+OK\r\n"
    assert parse(bytearray(reply), 0) == ([-3, b"hi", None, [b"OK"]], len(reply))
    for cut in range(1, len(reply)):  # any prefix is incomplete, never a wrong value
        with pytest.raises(_Incomplete):
            parse(bytearray(reply[:cut]), 0)
    error, end = parse(bytearray(b"-NOSCRIPT No matching script\r\n"), 0)
    assert isinstance(error, NoScriptError) and end == 30
    assert isinstance(parse(bytearray(b"-ERR x\r\n"), 0)[0], ResponseError)
    assert isinstance(parse(bytearray(b"-WRONGPASS no\r\n"), 0)[0], AuthenticationError)


@pytest.mark.redis
async def test_concurrent_and_cancelled_callers_get_their_own_replies(
    redis_url: str, redis_prefix: str
) -> None:
    client = PipelinedRedis(redis_url)
    keys = [f"{redis_prefix}k{i}" for i in range(200)]
    await asyncio.gather(*(client.set(k, f"v{i}") for i, k in enumerate(keys)))
    # Every other caller is cancelled while its command is in flight: the replies of the
    # others must still be theirs (the cancelled ones' replies are read and dropped).
    tasks = [asyncio.ensure_future(client.get(k)) for k in keys]
    await asyncio.sleep(0)
    for task in tasks[::2]:
        task.cancel()
    done = await asyncio.gather(*tasks[1::2])
    assert done == [f"v{i}".encode() for i in range(1, 200, 2)]
    assert await client.get(keys[0]) == b"v0"
    assert await client.get(f"{redis_prefix}absent") is None
    await client.aclose()


@pytest.mark.redis
async def test_commands_of_one_loop_turn_leave_in_one_write(
    redis_url: str, redis_prefix: str
) -> None:
    """Under load, several requests' commands share a system call; each still gets its reply."""
    client = PipelinedRedis(redis_url)
    await client.ping()  # connected
    connection = client._connection
    assert connection is not None and connection._transport is not None
    transport = connection._transport
    writes: list[bytes] = []
    real_write = transport.write

    def counting_write(data: bytes) -> None:
        writes.append(bytes(data))
        real_write(data)

    connection._transport = type("Counting", (), {"write": staticmethod(counting_write),
                                                  "close": transport.close})()  # fmt: skip
    keys = [f"{redis_prefix}turn{i}" for i in range(20)]
    await asyncio.gather(*(client.set(k, str(i)) for i, k in enumerate(keys)))
    assert len(writes) == 1 and writes[0].count(b"SET") == 20
    writes.clear()
    assert await asyncio.gather(*(client.get(k) for k in keys)) == [
        str(i).encode() for i in range(20)
    ]
    assert len(writes) == 1
    writes.clear()
    assert await client.get(keys[3]) == b"3"  # alone: its own write, at once
    assert len(writes) == 1
    connection._transport = transport
    await client.aclose()


@pytest.mark.redis
def test_the_gateway_s_event_loop_uvloop(redis_url: str, redis_prefix: str) -> None:
    """`loragate serve` runs on uvloop, whose transports are not asyncio's classes."""

    async def round_trips() -> list[bytes | None]:
        client = PipelinedRedis(redis_url)
        keys = [f"{redis_prefix}uv{i}" for i in range(50)]
        await asyncio.gather(*(client.set(k, str(i)) for i, k in enumerate(keys)))
        values = await asyncio.gather(*(client.get(k) for k in keys))
        await client.aclose()
        return values

    assert uvloop.run(round_trips()) == [str(i).encode() for i in range(50)]


@pytest.mark.redis
async def test_error_replies_raise_redis_py_types(redis_url: str) -> None:
    client = PipelinedRedis(redis_url)
    with pytest.raises(NoScriptError):
        await client.evalsha("0" * 40, 0)
    sha = await client.script_load("return {1, 'two', tonumber(ARGV[1])}")
    assert await client.evalsha(sha, 0, 3) == [1, b"two", 3]
    with pytest.raises(ResponseError):
        await client.execute("NOSUCHCOMMAND")
    await client.set("after-errors", "still in step")  # the errors' replies were consumed
    assert await client.get("after-errors") == b"still in step"
    await client.aclose()


@pytest.mark.redis
async def test_a_restarted_redis_is_used_again_without_a_failed_command(
    killable_redis: KillableRedis,
) -> None:
    client = PipelinedRedis(f"redis://127.0.0.1:{killable_redis.port}/0", timeout_s=1.0)
    store = RedisQuotaStore(client, prefix="lgtest:pipe:", lease_ttl_s=30)
    subject = QuotaSubject("t:a", QuotaLimits(requests_per_minute=100))

    async def admit() -> None:
        await store.admit(
            request_id=RequestId(str(uuid.uuid4())), subjects=[subject], reserve_tokens=1
        )

    await admit()
    killable_redis.stop()
    with pytest.raises(ServiceUnavailable):  # down: a prompt 503
        await admit()
    killable_redis.start()  # empty: the script is loaded again
    await admit()  # the first command after the restart succeeds (reconnect + resend)
    assert (await store.usage("t:a")).num_requests == 1
    await store.close()


async def test_a_server_that_stops_answering_times_out_and_the_next_command_reconnects() -> None:
    answering = asyncio.Event()
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while data := await reader.read(1024):
            if answering.is_set():
                writer.write(b"$2\r\nok\r\n" * data.count(b"*2\r\n"))
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = PipelinedRedis(f"redis://127.0.0.1:{port}", timeout_s=0.3)
    calls = [asyncio.ensure_future(client.get(f"k{i}")) for i in range(3)]
    for call in calls:  # every command behind the silent one fails too, none hangs
        with pytest.raises(RedisTimeout):
            await call
    answering.set()
    assert await client.get("k") == b"ok"  # a new connection: no stale reply read as this one's
    assert connections == 2
    await client.aclose()
    server.close()
    await server.wait_closed()


@pytest.mark.redis
async def test_password_and_database_come_from_the_url() -> None:
    password = secrets.token_hex(8)
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--requirepass", password],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_port(port)
        client = PipelinedRedis(f"redis://:{password}@127.0.0.1:{port}/3")
        await client.set("k", "in-db-3")
        check = aioredis.Redis(host="127.0.0.1", port=port, password=password, db=3)
        assert await check.get("k") == b"in-db-3"
        assert await aioredis.Redis(host="127.0.0.1", port=port, password=password).get("k") is None
        await check.aclose()
        await client.aclose()
        wrong = PipelinedRedis(f"redis://:wrong@127.0.0.1:{port}/0")
        with pytest.raises(AuthenticationError):
            await wrong.get("k")
    finally:
        proc.kill()
        proc.wait()


async def test_nothing_listening_is_a_connection_error() -> None:
    client = PipelinedRedis(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5)
    with pytest.raises(ConnectionError):
        await client.get("k")
