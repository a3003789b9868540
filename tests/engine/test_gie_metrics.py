"""The metrics the Gateway API Inference Extension's endpoint picker reads from a model server
(its model-server protocol): LoRA residency in vLLM's exact shape, queue and KV usage."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engine.metrics import EngineMetrics
from engine.outputs import EngineStats, LoRAStats


def _lora(running: tuple[str, ...], waiting: tuple[str, ...]) -> LoRAStats:
    return LoRAStats(
        num_adapters=3, num_slots=4, num_slots_occupied=2, num_slots_in_use=1, num_cpu_cached=3,
        gpu_hits_total=0, gpu_misses_total=0, cpu_hits_total=0, cpu_misses_total=0,
        loads_total=0, load_seconds_total=0.0, prefetches_total=0, gpu_evictions_total=0,
        cpu_evictions_total=0, running_adapters=running, waiting_adapters=waiting,
    )  # fmt: skip


def _samples(stats: EngineStats) -> dict[str, list[tuple[dict[str, str], float]]]:
    metrics = EngineMetrics(model_name="tiny", stats=lambda: stats)
    text = generate_latest(metrics.registry).decode()
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def _stats(lora: LoRAStats | None) -> EngineStats:
    return EngineStats(
        num_running=2, num_waiting=5, kv_usage=0.25, num_preemptions_total=0,
        prefix_cache_queries_total=0, prefix_cache_hits_total=0, prompt_tokens_total=0,
        generation_tokens_total=0, lora=lora,
    )  # fmt: skip


def test_lora_requests_info_has_vllm_labels_and_a_timestamp_value() -> None:
    samples = _samples(_stats(_lora(("a1", "a2"), ("a3",))))
    [(labels, value)] = samples["vllm:lora_requests_info"]
    assert labels == {"max_lora": "4", "running_lora_adapters": "a1,a2",
                      "waiting_lora_adapters": "a3"}  # fmt: skip
    assert value > 1.7e9  # seconds since the epoch: the picker keeps the newest series
    [(labels, _)] = _samples(_stats(_lora((), ())))["vllm:lora_requests_info"]
    assert labels["running_lora_adapters"] == "" and labels["waiting_lora_adapters"] == ""


def test_queue_and_kv_metrics_the_picker_scores() -> None:
    samples = _samples(_stats(None))
    assert samples["vllm:num_requests_waiting"] == [({"model_name": "tiny"}, 5.0)]
    assert samples["vllm:num_requests_running"] == [({"model_name": "tiny"}, 2.0)]
    assert samples["vllm:kv_cache_usage_perc"] == [({"model_name": "tiny"}, 0.25)]
    assert "vllm:lora_requests_info" not in samples  # LoRA disabled: no residency to report


def test_the_real_engine_reports_running_and_waiting_adapters(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """One running seat: the request on `sql` runs, the one on `chat` waits, and the metric
    names them as the endpoint picker reads them."""
    from engine.config import EngineConfig
    from engine.loop.llm_engine import LLMEngine
    from tests.engine.engine_helpers import request
    from tests.lora.peft_builders import AdapterSpec, make_peft_adapter

    engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), served_model_name="tiny",
                                    num_kv_blocks=64, max_num_seqs=1, max_loras=2,
                                    max_lora_rank=16))  # fmt: skip
    assert engine.lora is not None
    for name, seed in (("sql", 1), ("chat", 2)):
        spec = AdapterSpec(name, r=8, alpha=16, seed=seed)
        engine.lora.add(name, str(make_peft_adapter(tiny_model_dir, tmp_path / name, spec)))
    for rid, adapter in (("r1", "sql"), ("r2", "chat"), ("r3", None)):
        req = request(rid, [5, 6, 7], max_tokens=4)
        engine.add_request(dataclasses.replace(req, adapter_name=adapter))
    engine.step()
    [(labels, _)] = _samples(engine.stats())["vllm:lora_requests_info"]
    assert labels == {"max_lora": "2", "running_lora_adapters": "sql",
                      "waiting_lora_adapters": "chat"}  # fmt: skip
