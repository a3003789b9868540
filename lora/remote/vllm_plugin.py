"""loragate's LoRA resolver for vLLM: adapters fetched from the gateway, no shared volume.

vLLM consults its LoRA resolvers when a request names a model it does not serve
(`OpenAIServing._check_model`, which the tokens-only generate route the gateway drives calls
too, with VLLM_ALLOW_RUNTIME_LORA_UPDATING set); `/v1/load_lora_adapter` does not, it takes a
local path only. So the gateway, without a path to give, sends the request and this resolver
loads the adapter named by it (the adapter version's id): fetched from the gateway's internal
endpoint with the engine token, its sha256 checked against the one the store sends before
anything is unpacked, kept in a local disk cache bounded in bytes (lora/remote/fetched.py, the
code the loragate engine runs).

Registered by the `vllm.general_plugins` entry point (pyproject.toml; `make vllm-venv` installs
it) when LORAGATE_ADAPTER_SOURCE is set. Settings, from the environment: LORAGATE_ADAPTER_SOURCE
(the gateway's URL), LORAGATE_ENGINE_ADMIN_TOKEN, LORAGATE_ADAPTER_CACHE_DIR (default: a
temporary directory) and LORAGATE_ADAPTER_CACHE_GB (default 4). vLLM is imported only inside.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from typing import Any

from lora.errors import AdapterError, AdapterNotFoundError
from lora.remote.fetch import HttpBundleFetcher
from lora.remote.fetched import FetchedAdapters, fetched_adapters

log = logging.getLogger(__name__)
RESOLVER_NAME = "loragate"
# What it reads (docs/operations.md names them; tests/docs checks that against this).
ENVIRONMENT = (
    "LORAGATE_ADAPTER_SOURCE",
    "LORAGATE_ENGINE_ADMIN_TOKEN",
    "LORAGATE_ADAPTER_CACHE_DIR",
    "LORAGATE_ADAPTER_CACHE_GB",
)


class GatewayResolver:
    """vLLM's LoRAResolver interface (`resolve_lora`), by composition: vLLM calls the method
    and checks nothing else."""

    def __init__(self, adapters: FetchedAdapters) -> None:
        self.adapters = adapters
        # Empty, never written: what a refused adapter's request points vLLM's loader at.
        self._refused_dir = tempfile.mkdtemp(prefix="loragate-refused-")

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> Any:
        from vllm.lora.request import LoRARequest

        try:
            path = await asyncio.to_thread(self.adapters.materialize_reported, lora_name)
        except AdapterNotFoundError:
            return None  # vLLM answers 404: no such model
        except AdapterError as exc:
            # Refused (a wrong hash, a truncated transfer): never loaded. Raising here would be
            # vLLM's bare 500; a request for a directory with nothing in it fails vLLM's load,
            # which answers the 400 "LoRA adapter '<name>' was found but could not be loaded."
            # that the gateway turns into the loragate engine's "could not be loaded" (502).
            log.error("loragate adapter %s refused: %s", lora_name[:80], exc.message)
            return LoRARequest(lora_name=lora_name, lora_int_id=1, lora_path=self._refused_dir)
        # lora_int_id is vLLM's to assign (resolve_lora overwrites it; it must be > 0 here)
        return LoRARequest(lora_name=lora_name, lora_int_id=1, lora_path=path)


def resolver_from_env(env: dict[str, str]) -> GatewayResolver | None:
    source = env.get("LORAGATE_ADAPTER_SOURCE")
    if not source:
        return None
    fetcher = HttpBundleFetcher(source, env.get("LORAGATE_ENGINE_ADMIN_TOKEN"))
    max_bytes = int(float(env.get("LORAGATE_ADAPTER_CACHE_GB", "4")) * (1 << 30))
    return GatewayResolver(
        fetched_adapters(env.get("LORAGATE_ADAPTER_CACHE_DIR"), max_bytes, fetcher)
    )


def register() -> None:
    """The entry point: vLLM calls it in each of its processes at start-up."""
    resolver = resolver_from_env(dict(os.environ))
    if resolver is None:
        return
    from vllm.lora.resolver import LoRAResolverRegistry

    fetch_log = logging.getLogger("lora.remote")
    if not fetch_log.handlers:  # each fetch and refusal in the server's log, as vLLM's own lines
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        fetch_log.addHandler(handler)
        fetch_log.setLevel(logging.INFO)

    LoRAResolverRegistry.register_resolver(RESOLVER_NAME, resolver)
