"""The compiled decode path (engine/step/compile_decode.py) against eager, the reference.

Same requests through an eager and a compiled engine (fp32, tiny model): every sampled token
equal and every sampled position's logits close, over steps that mix decodes with prefill chunks
(eager) and pure decode steps of several batch sizes crossing the compile sizes (compiled), with
prefix-cache hits and preemption on the way.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig
from engine.loop.llm_engine import LLMEngine
from engine.step.attention import AttentionMetadata
from engine.step.compile_decode import CompiledDecode, compile_sizes
from tests.engine.engine_helpers import random_prompts, request


def test_compile_sizes_cover_every_batch():
    assert compile_sizes(64) == (2, 4, 8, 16, 32, 64)
    assert compile_sizes(48) == (2, 4, 8, 16, 32, 48)
    assert compile_sizes(1) == (2,)


def _engine(
    model_dir: Path, cache_dir: Path, *, enforce_eager: bool, decode_attention: str
) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            dtype="float32",
            num_kv_blocks=24,  # tight: the long requests preempt others
            max_num_seqs=8,
            max_num_batched_tokens=96,
            enforce_eager=enforce_eager,
            decode_attention=decode_attention,
            prefill_attention="sdpa",  # prefill runs eager in both: the same form, not a timing
            # the compiled graph takes plain weights: the eager engine too, so the two differ by
            # the compile alone (packed float32 sums in another order: bench/RESULTS.md)
            prepack_weights=False,
            compile_cache_dir=str(cache_dir),
        )
    )


def _run(engine: LLMEngine) -> tuple[dict[str, list[int]], dict[tuple[str, int], torch.Tensor]]:
    """Requests arrive in three waves so batches grow and shrink; returns tokens and the logits
    of every sampled position, by (request, output index)."""
    logits: dict[tuple[str, int], torch.Tensor] = {}
    execute = engine.runner.execute

    def spy(sched):  # type: ignore[no-untyped-def]
        forward = execute(sched)
        for seq, row in zip(forward.sampling_seqs, forward.logits, strict=True):
            logits[(seq.request.request_id, seq.num_output_tokens)] = row.float().clone()
        return forward

    engine.runner.execute = spy  # type: ignore[method-assign]
    shared = random_prompts(seed=5, lengths=[40], vocab=2000)[0]
    lengths = [1, 3, 17, 33, 5, 64, 2, 9, 20, 48, 7, 30]
    prompts = random_prompts(seed=6, lengths=lengths, vocab=2000)
    # Every third prompt starts with the same 40 tokens: prefix-cache hits once one has run.
    prompts = [shared + p if i % 3 == 0 else p for i, p in enumerate(prompts)]
    waves = {0: range(0, 5), 6: range(5, 9), 15: range(9, 12)}
    tokens: dict[str, list[int]] = {}
    step = 0
    while step < 10_000:
        for i in waves.get(step, ()):
            engine.add_request(request(f"r{i}", prompts[i], max_tokens=6 + (i * 7) % 30))
        if not engine.has_unfinished_requests() and step > max(waves):
            break
        for out in engine.step():
            for choice in out.choices:
                tokens.setdefault(out.request_id, []).extend(choice.token_ids)
        engine.check_invariants()
        step += 1
    return tokens, logits


# The compiled graph attends by the C++ kernel as an opaque operator ("native") or by
# engine/step/paged_decode.py compiled into it (what the other backends get there).
BACKENDS = pytest.mark.parametrize("decode_attention", ["native", "matmul"])


@BACKENDS
def test_compiled_equals_eager_token_for_token(tiny_model_dir, tmp_path, decode_attention):
    eager = _engine(tiny_model_dir, tmp_path, enforce_eager=True, decode_attention="matmul")
    compiled = _engine(
        tiny_model_dir, tmp_path, enforce_eager=False, decode_attention=decode_attention
    )
    assert eager.runner.compiled is None
    runner = compiled.runner.compiled
    assert isinstance(runner, CompiledDecode)
    batch_sizes: list[int] = []
    forward = runner.forward

    def counting(input_ids, *rest):  # type: ignore[no-untyped-def]
        batch_sizes.append(input_ids.shape[0])
        return forward(input_ids, *rest)

    runner.forward = counting  # type: ignore[method-assign]

    eager_tokens, eager_logits = _run(eager)
    compiled_tokens, compiled_logits = _run(compiled)

    assert compiled_tokens == eager_tokens
    assert compiled_logits.keys() == eager_logits.keys()
    for key, row in eager_logits.items():
        diff = (compiled_logits[key] - row).abs().max().item()
        assert diff < 1e-4, f"{key}: logits differ by {diff}"
    # The run exercised what it claims to: compiled steps of sizes in several compile buckets
    # (odd sizes padded), prefix-cache hits and preemption, on both engines alike.
    assert len({runner.padded_size(n) for n in batch_sizes}) >= 3, batch_sizes
    assert any(n not in runner.sizes for n in batch_sizes), batch_sizes
    for engine in (eager, compiled):
        assert engine.scheduler.num_preemptions > 0
        assert engine.block_manager.num_prefix_hits > 0
    assert compiled.scheduler.num_preemptions == eager.scheduler.num_preemptions


@BACKENDS
def test_one_padded_step_equals_eager(tiny_model_dir, tmp_path, decode_attention):
    """One decode step at batch 3 (padded to 4) over contexts of different lengths, one of
    them a single block (its table widened): the compiled forward's hidden states and cache
    writes equal the eager forward's, and padding wrote nothing but the scratch block."""
    engine = _engine(
        tiny_model_dir, tmp_path, enforce_eager=False, decode_attention=decode_attention
    )
    runner = engine.runner
    assert runner.compiled is not None
    assert runner.compiled.native_attention == (decode_attention == "native")
    gen = torch.Generator().manual_seed(0)
    for k_layer, v_layer in runner.kv_caches:
        k_layer.copy_(torch.randn(k_layer.shape, generator=gen))
        v_layer.copy_(torch.randn(v_layer.shape, generator=gen))
    before = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    lengths = [5, 40, 17]
    tables = torch.tensor([[6, 0, 0], [1, 2, 3], [4, 5, 0]])  # padding -> block 0
    positions = torch.tensor(lengths) - 1
    slots = tables[torch.arange(3), positions // 16] * 16 + positions % 16
    input_ids = torch.tensor([3, 7, 11])
    scratch = engine.block_manager.num_blocks
    with torch.inference_mode():
        hidden = runner.compiled.forward(input_ids, positions, slots, tables, torch.tensor(lengths))
        compiled_caches = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
        for (k, v), (k_saved, v_saved) in zip(runner.kv_caches, before, strict=True):
            k.copy_(k_saved)
            v.copy_(v_saved)
        meta = AttentionMetadata(
            slot_mapping=slots,
            num_decodes=3,
            block_size=16,
            decode_tables=tables,
            decode_lengths=lengths,
            prefills=[],
            decode_backend="matmul",  # the eager reference
        )
        reference = runner.model(input_ids, positions, runner.kv_caches, meta)  # [3, hidden]
    torch.testing.assert_close(hidden, reference, rtol=1e-4, atol=1e-4)
    allowed = set(slots.tolist()) | set(range(scratch * 16, scratch * 16 + 16))
    for (k, v), (k_ref, v_ref), (k_old, _) in zip(
        compiled_caches, runner.kv_caches, before, strict=True
    ):
        torch.testing.assert_close(k[:, : scratch * 16], k_ref[:, : scratch * 16])
        torch.testing.assert_close(v[:, : scratch * 16], v_ref[:, : scratch * 16])
        changed = (k != k_old).any(dim=2).any(dim=0).nonzero().flatten().tolist()
        assert set(changed) <= allowed
