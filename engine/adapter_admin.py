"""The adapter endpoints' work, between the server's thin routes and the engine loop thread:
parse the bodies, load (validation and disk reads off the loop thread; an adapter named by its
hash is fetched from the gateway's store first, lora/remote/), unload (wait until no sequence
uses the adapter), list models with each adapter's tier and rank."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.errors import InvalidRequestError
from lora.registry import AdapterRecord, check_adapter_name
from lora.remote.fetch import HttpBundleFetcher
from lora.remote.fetched import FetchedAdapters, fetched_adapters

__all__ = ["FetchedAdapters", "LoadRequest", "fetched_adapters"]  # the in-process client's too

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.loop.async_engine import AsyncEngine
    from engine.loop.llm_engine import LLMEngine
    from lora.manager import LoRAManager

# How often an unload that waits for running requests looks again (seconds).
UNLOAD_POLL_S = 0.02


def lora_of(engine: LLMEngine) -> LoRAManager:
    if engine.lora is None:
        raise InvalidRequestError("LoRA is disabled on this engine", param="lora_name")
    return engine.lora


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequestError("the body must be a JSON object") from exc
    if not isinstance(parsed, dict):
        raise InvalidRequestError("the body must be a JSON object")
    return parsed


def _string_field(fields: dict[str, Any], name: str) -> str:
    value = fields.get(name)
    if not isinstance(value, str):
        raise InvalidRequestError(f"{name} must be a string", param=name)
    return value


@dataclass(frozen=True)
class LoadRequest:
    """`/v1/load_lora_adapter`'s body: a local directory (`lora_path`), or the adapter's bundle
    hash (`lora_sha256`: fetched by `name` from the engine's adapter source), or both (the hash
    wins where the engine has a source, the path where it has none)."""

    name: str
    path: str | None
    sha256: str | None


def parse_load(body: bytes, *, base_model_name: str) -> LoadRequest:
    """The name is checked here (separators, control characters...)."""
    fields = _json_object(body)
    name = check_adapter_name(_string_field(fields, "lora_name"), base_model_name=base_model_name)
    if fields.get("lora_path") is None and fields.get("lora_sha256") is None:
        raise InvalidRequestError("lora_path or lora_sha256 is required", param="lora_path")
    path = None if fields.get("lora_path") is None else _string_field(fields, "lora_path")
    sha = None if fields.get("lora_sha256") is None else _string_field(fields, "lora_sha256")
    return LoadRequest(name=name, path=path, sha256=sha)


def adapter_source(
    url: str | None, token: str | None, config: EngineConfig
) -> FetchedAdapters | None:
    """`--adapter-source`: the gateway's store, reached with the engine's own admin token, into
    the cache the config names (None without a URL: adapters load from `lora_path` only)."""
    if url is None:
        return None
    fetcher = HttpBundleFetcher(url, token)
    return fetched_adapters(config.adapter_cache_dir, config.adapter_cache_bytes, fetcher)


async def attach_store(engine: AsyncEngine, adapters: FetchedAdapters) -> None:
    """Adapters fetched into `adapters`' disk cache are read through it from now on (kept while
    read, fetched again if evicted)."""
    await engine.run_in_loop(
        lambda e: e.lora.read_through(adapters.open) if e.lora is not None else None
    )


async def load_requested(
    engine: AsyncEngine, request: LoadRequest, adapters: FetchedAdapters | None
) -> AdapterRecord:
    """Fetch (hash checked, once per hash) when the request names a hash and this engine has an
    adapter source, then `load`."""
    if request.sha256 is not None and adapters is not None:
        path = str(adapters.cache.root / request.sha256)
        record = await engine.run_in_loop(lambda e: lora_of(e).existing(request.name, path))
        if record is not None:
            return record
        path = await asyncio.to_thread(adapters.materialize, request.name, request.sha256)
        return await load(engine, request.name, path)
    if request.path is None:
        raise InvalidRequestError(
            "this engine has no adapter source (--adapter-source) to fetch lora_sha256 from; "
            "send lora_path",
            param="lora_sha256",
        )
    return await load(engine, request.name, request.path)


def parse_unload(body: bytes) -> str:
    return _string_field(_json_object(body), "lora_name")


async def load(engine: AsyncEngine, name: str, path: str) -> AdapterRecord:
    """Idempotent for the same name and path; AdapterError (400/409) otherwise."""
    record = await engine.run_in_loop(lambda e: lora_of(e).existing(name, path))
    if record is not None:
        return record
    # Validation and disk reads run on a worker thread: the engine keeps serving meanwhile.
    read = await engine.run_in_loop(lambda e: lora_of(e).read)
    adapter = await asyncio.to_thread(read, path)
    return await engine.run_in_loop(lambda e: lora_of(e).add(name, path, adapter))


async def unload(engine: AsyncEngine, name: str) -> None:
    """New requests naming it are refused at once; returns when no sequence uses it and it has
    left every tier."""
    adapter_id = await engine.run_in_loop(lambda e: lora_of(e).begin_unload(name))
    while not await engine.run_in_loop(lambda e: e.is_adapter_unloaded(adapter_id)):
        await asyncio.sleep(UNLOAD_POLL_S)


async def unload_if_present(engine: AsyncEngine, name: str) -> bool:
    """`unload`, or False at once when the engine does not hold `name` (or runs no LoRA)."""
    held = await engine.run_in_loop(
        lambda e: e.lora is not None and e.lora.registry.get(name) is not None
    )
    if held:
        await unload(engine, name)
    return held


async def list_models(engine: AsyncEngine, *, created: int) -> list[dict[str, Any]]:
    adapters = await engine.run_in_loop(lambda e: [] if e.lora is None else e.lora.describe())
    base = {
        "id": engine.model_name,
        "object": "model",
        "created": created,
        "owned_by": "loragate",
        "root": engine.config.model,
        "parent": None,
        "max_model_len": engine.max_model_len,
        # Where the adapter slots (tier "gpu", vLLM's word) are: "cpu" for a CPU engine.
        "device": engine.config.device,
    }
    return [base] + [
        {
            "id": a.name,
            "object": "model",
            "created": created,
            "owned_by": "loragate",
            "root": a.path,
            "parent": a.base_model_name or engine.model_name,
            "tier": a.tier,
            "rank": a.rank,
        }
        for a in adapters
    ]
