"""Wiring between the engine and lora/: size the adapter pool, wrap the model's projections,
build the manager, register the start-up adapters, and snapshot the adapter cache for stats.

The pool is sized in bytes (S-LoRA's idea, without its paging): `lora_pool_memory_bytes` buys
as many max-rank slots as it holds (lora/layers.py's slot_num_bytes, in the model's dtype),
at most `max_loras` if set, else at most `max_num_seqs` (a batch never holds more distinct
adapters than sequences). It sits beside the KV cache's own budget; on a CPU both are host
memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.models.hf_config import ModelConfig
from engine.models.llama import LORA_PROJECTIONS, LlamaForCausalLM
from engine.outputs import LoRAStats
from lora.dims import BaseModelDims
from lora.layers import LoRALayers, slot_num_bytes
from lora.manager import LoRAManager
from lora.registry import AdapterId


def model_dims(mc: ModelConfig, config: EngineConfig) -> BaseModelDims:
    names = [config.model_name, config.model, str(Path(config.model).resolve())]
    names += [m.base_model_name for m in config.lora_modules if m.base_model_name]
    return BaseModelDims(
        num_layers=mc.num_layers,
        hidden_size=mc.hidden_size,
        q_size=mc.q_size,
        kv_size=mc.kv_size,
        intermediate_size=mc.intermediate_size,
        names=tuple(dict.fromkeys(names)),
    )


def build_lora_manager(
    model: LlamaForCausalLM, config: EngineConfig, mc: ModelConfig, device: torch.device
) -> LoRAManager:
    """Wraps the model's projections in place; start-up adapters that fail validation raise
    their AdapterError (the engine does not start with a broken --lora-modules)."""
    dims = model_dims(mc, config)
    num_slots = config.num_lora_slots(
        slot_num_bytes(
            LORA_PROJECTIONS,
            dims,
            max_rank=config.max_lora_rank,
            element_size=model.embed_tokens.weight.element_size(),
        )
    )
    layers = LoRALayers(
        model.layers,
        LORA_PROJECTIONS,
        dims,
        max_loras=num_slots,
        max_rank=config.max_lora_rank,
    )
    if device.type == "cpu":
        layers.warm_up_cpu()  # builds the short-run kernel (cached on disk: once per machine)
    manager = LoRAManager(
        layers,
        dims,
        max_loras=num_slots,
        max_cpu_loras=config.num_cpu_loras(num_slots),
        max_lora_rank=config.max_lora_rank,
        device=device,
        base_model_name=config.model_name,
    )
    for module in config.lora_modules:
        manager.add(module.name, module.path, base_model_name=module.base_model_name)
    return manager


def _names(manager: LoRAManager, adapter_ids: Iterable[AdapterId | None]) -> tuple[str, ...]:
    records = {record.adapter_id: record.name for record in manager.registry.records()}
    return tuple(sorted({records[a] for a in adapter_ids if a is not None and a in records}))


def lora_stats(
    manager: LoRAManager,
    *,
    running: Iterable[AdapterId | None] = (),
    waiting: Iterable[AdapterId | None] = (),
) -> LoRAStats:
    """`running` / `waiting`: the adapter of each running / waiting request (None: the base)."""
    cache, counters = manager.cache, manager.cache.stats
    return LoRAStats(
        num_adapters=len(manager.registry),
        num_slots=cache.max_loras,
        num_slots_occupied=cache.num_occupied_slots,
        num_slots_in_use=cache.num_pinned_slots,
        num_cpu_cached=cache.num_cpu,
        gpu_hits_total=counters.gpu_hits,
        gpu_misses_total=counters.gpu_misses,
        cpu_hits_total=counters.cpu_hits,
        cpu_misses_total=counters.cpu_misses,
        loads_total=counters.num_loads,
        load_seconds_total=counters.load_seconds,
        prefetches_total=counters.num_prefetches,
        gpu_evictions_total=counters.gpu_evictions,
        cpu_evictions_total=counters.cpu_evictions,
        running_adapters=_names(manager, running),
        waiting_adapters=_names(manager, waiting),
    )
