"""One pool per served base model: its engine client (in process, HTTP replicas or vLLM servers),
its tokenizer and chat template, the planner that checks requests against its engine's limits,
and the shapes its adapters are validated against.

The primary model's pool is built from the gateway's own settings (the single-model fields);
each `models` entry's from its view of them (gateway/model_entries.py). A request runs on the pool
of the base model it resolved to (gateway/policy.py: an adapter's pool is its base model's).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from gateway.engines.api import EngineClient
from gateway.engines.build import build_engine_client
from gateway.lifecycle.grammars import GrammarChecks
from gateway.lifecycle.job import Planner
from gateway.model_entries import model_view
from gateway.settings import GatewaySettings
from gateway.text.tokenizer import Tokenizer
from tenancy.adapters.validation import FormatChecksValidator
from tenancy.runtime import TenancyRuntime
from tenancy.settings import BaseModelSpec


@dataclass
class ModelPool:
    name: str  # the served name: what `model` takes, and an adapter's `base_model`
    base: BaseModelSpec  # the shapes its adapters must fit
    engine: EngineClient
    planner: Planner  # with the model's tokenizer and chat template, and its engine's limits
    # Output constraints are compiled by the engine that runs them (its tokenizer's vocabulary).
    grammars: GrammarChecks


def make_pool(settings: GatewaySettings, tokenizer: Tokenizer, engine: EngineClient) -> ModelPool:
    planner = Planner(
        tokenizer, settings, vocab_size=engine.vocab_size, max_model_len=engine.max_model_len
    )
    return ModelPool(
        name=settings.model_name,
        base=settings.base_model,
        engine=engine,
        planner=planner,
        grammars=GrammarChecks(engine.check_constraint),
    )


async def start_engine(
    settings: GatewaySettings, runtime: TenancyRuntime, engine: EngineClient
) -> None:
    """An in-process engine loads adapters by hash from the gateway's store; then it starts."""
    use_store = getattr(engine, "use_adapter_store", None)
    if use_store is not None:
        await use_store(
            lambda adapter_id: runtime.adapters.open_bundle(runtime.sessionmaker, adapter_id),
            cache_dir=settings.engine.adapter_cache_dir,
            max_bytes=int(settings.engine.adapter_cache_gb * (1 << 30)),
        )
    await engine.start()


async def build_other_pools(
    settings: GatewaySettings,
    runtime: TenancyRuntime,
    vllm_priority: Callable[[int], int],
) -> list[ModelPool]:
    """A started pool per `models` entry, each model's adapter shapes registered with the upload
    validation. On a failure the pools built so far are closed again."""
    pools: list[ModelPool] = []
    try:
        for entry in settings.models:
            view = model_view(settings, entry)
            tokenizer = await asyncio.to_thread(Tokenizer.load, view.model, view.chat_template)
            engine = await build_engine_client(view, vllm_priority)
            pools.append(make_pool(view, tokenizer, engine))
            await start_engine(view, runtime, engine)
            runtime.adapters.serve_base_model(view.base_model, FormatChecksValidator(view))
    except BaseException:
        for pool in pools:
            with contextlib.suppress(Exception):
                await pool.engine.close()
        raise
    return pools
