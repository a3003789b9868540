"""The engine stand-in of `bench/gateway_overhead.py`: a BENCHMARK FIXTURE ONLY, never a test
double. It answers the tokens-only protocol (docs/tokens-api.md) instantly, with `max_tokens`
copies of one token, so the benchmark measures the gateway's own cost; and OpenAI's chat
completions (`/v1/chat/completions`, whole answers), the upstream LiteLLM's proxy calls in the
same benchmark. A raw asyncio HTTP/1.1 server, so the stand-in itself costs next to nothing.
"""

from __future__ import annotations

import asyncio
import json
import uuid


def _standin_reply(method: str, path: str, body: bytes) -> tuple[str, str, bytes | list[bytes]]:
    """(status, media type, body): a list of events for a stream (sent chunked)."""
    if path == "/health" or path == "/v1/models":
        return "200 OK", "application/json", b'{"status":"ok","object":"list","data":[]}'
    if path == "/abort_requests":
        return "200 OK", "application/json", b""
    if method == "POST" and path == "/v1/chat/completions":
        return _chat_reply(json.loads(body))
    if method != "POST" or path != "/inference/v1/generate":
        return "404 Not Found", "application/json", b'{"error":{"message":"not found"}}'
    request = json.loads(body)
    params = request.get("sampling_params", {})
    n, max_tokens = params.get("n", 1), params.get("max_tokens", 16)
    prompt = len(request["token_ids"])
    rid = json.dumps(request.get("request_id", str(uuid.uuid4())))
    tokens = json.dumps([300] * max_tokens)
    choices = ",".join(
        f'{{"index":{i},"token_ids":{tokens},"finish_reason":"length","stop_reason":null,'
        f'"logprobs":null}}'
        for i in range(n)
    )
    usage = f'{{"prompt_tokens":{prompt},"completion_tokens":{n * max_tokens},"cached_tokens":0}}'
    if not request.get("stream"):
        out = f'{{"request_id":{rid},"choices":[{choices}],"usage":{usage}}}'
        return "200 OK", "application/json", out.encode()
    # One event per token (a chunk each on the wire), as an engine streams: the gateway relays
    # max_tokens chunks (bench/gateway_stream.py times them).
    events = []
    for t in range(max_tokens):
        reason = '"length"' if t == max_tokens - 1 else "null"
        step = ",".join(
            f'{{"index":{i},"token_ids":[300],"finish_reason":{reason},"stop_reason":null,'
            f'"logprobs":null}}'
            for i in range(n)
        )
        events.append(f'data: {{"request_id":{rid},"choices":[{step}],"usage":null}}\n\n'.encode())
    events.append(f'data: {{"request_id":{rid},"choices":[],"usage":{usage}}}\n\n'.encode())
    events.append(b"data: [DONE]\n\n")
    return "200 OK", "text/event-stream", events


def _chat_reply(request: dict[str, object]) -> tuple[str, str, bytes]:
    """A whole chat completion of `max_tokens` words, whatever the messages say."""
    max_tokens = request.get("max_tokens") or 16
    if not isinstance(max_tokens, int):
        return "400 Bad Request", "application/json", b'{"error":{"message":"max_tokens"}}'
    answer = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": 0,
        "model": request.get("model", "standin"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": " word" * max_tokens},
                "finish_reason": "length",
            }
        ],
        "usage": {
            "prompt_tokens": 32,
            "completion_tokens": max_tokens,
            "total_tokens": 32 + max_tokens,
        },
    }
    return "200 OK", "application/json", json.dumps(answer).encode()


async def _standin_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = 0
            for line in lines[1:]:
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            body = await reader.readexactly(length) if length else b""
            status, media, out = _standin_reply(method, path, body)
            if isinstance(out, list):  # a stream: one chunk per event
                head = f"HTTP/1.1 {status}\r\ncontent-type: {media}\r\ntransfer-encoding: chunked\r\n\r\n"
                chunks = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in out)
                writer.write(head.encode() + chunks + b"0\r\n\r\n")
            else:
                writer.write(
                    f"HTTP/1.1 {status}\r\ncontent-type: {media}\r\ncontent-length: {len(out)}"
                    f"\r\n\r\n".encode()
                    + out
                )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def run_standin(port: int) -> None:
    async def main() -> None:
        server = await asyncio.start_server(_standin_connection, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()

    asyncio.run(main())
