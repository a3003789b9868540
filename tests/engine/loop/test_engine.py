"""Engine behaviour on the real tiny model: seeds, priority, preemption, fcfs, fairness,
prefix caching, aborts, stop conditions and logprobs. After every run the block manager's
invariant holds (run_to_completion checks it after each step)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.config import EngineConfig
from engine.errors import AdapterNotFoundError, InvalidRequestError
from engine.loop.llm_engine import LLMEngine
from engine.outputs import FinishReason
from tests.engine.engine_helpers import Collected, random_prompts, request, run_to_completion


def make_engine(model_dir, **overrides) -> LLMEngine:  # type: ignore[no-untyped-def]
    settings = {"dtype": "float32", "num_kv_blocks": 512, "max_num_seqs": 16, **overrides}
    return LLMEngine(EngineConfig(model=str(model_dir), **settings))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def shared_engine(tiny_model_dir) -> LLMEngine:  # type: ignore[no-untyped-def]
    return make_engine(tiny_model_dir)


@pytest.fixture
def engine(shared_engine: LLMEngine):  # type: ignore[no-untyped-def]
    """The module's engine; after every test nothing is in flight and the KV accounting holds."""
    yield shared_engine
    assert not shared_engine.has_unfinished_requests()
    shared_engine.check_invariants()
    manager = shared_engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks


def test_seeded_request_gives_the_same_tokens_alone_and_in_a_batch_of_16(engine):
    prompts = random_prompts(
        seed=7, lengths=[5 + 3 * i for i in range(16)], vocab=engine.vocab_size
    )
    seeded = {"temperature": 1.0, "seed": 1234, "max_tokens": 24}
    engine.add_request(request("alone", prompts[0], **seeded))
    alone = run_to_completion(engine).tokens_of("alone")

    engine.add_request(request("first", prompts[3], temperature=1.0, max_tokens=24))
    for i in range(1, 15):
        params = {"temperature": 0.8, "max_tokens": 20} if i % 3 else {"max_tokens": 20}
        if i % 4 == 0:
            params["seed"] = i
        engine.add_request(request(f"other{i}", prompts[i], **params))
    engine.add_request(request("batched", prompts[0], **seeded))
    batched = run_to_completion(engine).tokens_of("batched")
    assert len(alone) == 24
    assert batched == alone


def test_unseeded_sampling_differs_between_runs(engine):
    prompt = random_prompts(seed=8, lengths=[12], vocab=engine.vocab_size)[0]
    for name in ("u1", "u2"):
        engine.add_request(request(name, prompt, temperature=1.5, max_tokens=24))
    collected = run_to_completion(engine)
    assert collected.tokens_of("u1") != collected.tokens_of("u2")


def test_priority_request_gets_its_first_token_before_queued_ones_start(tiny_model_dir):
    engine = make_engine(tiny_model_dir, max_num_seqs=2)
    prompts = random_prompts(seed=9, lengths=[20] * 9, vocab=engine.vocab_size)
    for i in range(8):
        engine.add_request(request(f"low{i}", prompts[i], max_tokens=12))
    collected = Collected()
    for out in engine.step():
        collected.add(out, 0)
    engine.add_request(request("urgent", prompts[8], max_tokens=4, priority=-10))
    run_to_completion(engine, collected)
    urgent_first = collected.first_token_step["urgent"]
    # Two were already running; none of the six queued ones may start before the urgent one.
    assert all(urgent_first < collected.first_token_step[f"low{i}"] for i in range(2, 8))
    assert engine.scheduler.num_preemptions >= 1


def test_preempted_request_finishes_with_the_same_greedy_tokens(tiny_model_dir):
    prompts = random_prompts(seed=10, lengths=[30, 45, 28, 50, 33, 41], vocab=4096)

    def run(num_kv_blocks: int) -> tuple[Collected, int]:
        engine = make_engine(
            tiny_model_dir, num_kv_blocks=num_kv_blocks, block_size=16, max_num_seqs=6
        )
        for i, prompt in enumerate(prompts):
            engine.add_request(request(f"r{i}", prompt, max_tokens=40))
        return run_to_completion(engine), engine.scheduler.num_preemptions

    roomy, roomy_preemptions = run(num_kv_blocks=512)
    tight, tight_preemptions = run(num_kv_blocks=12)  # 6 requests need up to 6 blocks each
    assert roomy_preemptions == 0
    assert tight_preemptions > 0
    for i in range(len(prompts)):
        assert tight.tokens_of(f"r{i}") == roomy.tokens_of(f"r{i}")
        assert len(tight.tokens_of(f"r{i}")) == 40


def test_fcfs_policy_takes_priorities_and_serves_in_arrival_order(tiny_model_dir):
    """Under fcfs a priority is accepted and has no effect: one running slot, the later (and
    more urgent, lower) priority still waits for the earlier request."""
    engine = make_engine(tiny_model_dir, policy="fcfs", max_num_seqs=1)
    engine.add_request(request("first", [1, 2, 3], priority=5, max_tokens=4))
    engine.add_request(request("urgent", [4, 5, 6], priority=-5, max_tokens=4))
    done = run_to_completion(engine)
    assert done.tokens_of("first") and done.tokens_of("urgent")
    assert done.finish_step["first"] < done.first_token_step["urgent"]


def test_fairness_light_tenant_finishes_before_heavy_tenants_twelfth(tiny_model_dir):
    engine = make_engine(tiny_model_dir, max_num_seqs=4)
    prompts = random_prompts(seed=11, lengths=[16] * 44, vocab=engine.vocab_size)
    for i in range(40):
        engine.add_request(request(f"A{i}", prompts[i], max_tokens=6, tenant="tenant-a"))
    collected = Collected()
    for out in engine.step():
        collected.add(out, 0)
    for i in range(4):
        engine.add_request(request(f"B{i}", prompts[40 + i], max_tokens=6, tenant="tenant-b"))
    run_to_completion(engine, collected)
    a_finish = sorted(collected.finish_step[f"A{i}"] for i in range(40))
    b_finish = [collected.finish_step[f"B{i}"] for i in range(4)]
    assert max(b_finish) < a_finish[11]


def test_prefix_cache_reports_full_blocks_per_salt(engine):
    prompt = random_prompts(seed=12, lengths=[40], vocab=engine.vocab_size)[0]  # 2 full blocks
    cached = {}
    for name, salt in [
        ("first", "tenant-1"),
        ("same", "tenant-1"),
        ("other", "tenant-2"),
        ("none", None),
    ]:
        engine.add_request(request(name, prompt, max_tokens=2, salt=salt))
        cached[name] = run_to_completion(engine).outputs[name][-1].num_cached_tokens
    assert cached == {"first": 0, "same": 32, "other": 0, "none": 0}
    stats = engine.stats()
    assert stats.prefix_cache_hits_total >= 32
    assert stats.prefix_cache_queries_total >= 4 * 40


def test_abort_frees_every_block(engine):
    prompts = random_prompts(seed=13, lengths=[50, 60, 70], vocab=engine.vocab_size)
    for i, prompt in enumerate(prompts):
        engine.add_request(request(f"a{i}", prompt, max_tokens=100))
    engine.step()
    engine.step()
    outputs = engine.abort_requests(["a0", "a2", "unknown-id"])
    assert [o.request_id for o in outputs] == ["a0", "a2"]
    assert all(o.finished and o.choices[0].finish_reason is FinishReason.ABORT for o in outputs)
    engine.check_invariants()
    engine.abort_requests(["a1"])
    engine.check_invariants()
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_stop_tokens_min_tokens_and_length(engine):
    prompt = random_prompts(seed=14, lengths=[10], vocab=engine.vocab_size)[0]
    engine.add_request(request("free", prompt, max_tokens=12))
    free = run_to_completion(engine).tokens_of("free")
    stop_at = free[5]
    first_index = free.index(stop_at)
    engine.add_request(request("stop", prompt, max_tokens=12, stop_token_ids=(stop_at,)))
    engine.add_request(
        request("min", prompt, max_tokens=12, stop_token_ids=(stop_at,), min_tokens=12)
    )
    collected = run_to_completion(engine)
    stopped = collected.outputs["stop"][-1].choices[-1]
    assert collected.tokens_of("stop") == free[: first_index + 1]
    assert stopped.finish_reason is FinishReason.STOP and stopped.stop_reason == stop_at
    assert len(collected.tokens_of("min")) == 12
    assert collected.finish["min"][0] is FinishReason.LENGTH


def test_max_tokens_is_capped_by_the_context_length(tiny_model_dir):
    engine = make_engine(tiny_model_dir, max_model_len=64)
    engine.add_request(request("long", list(range(1, 61)), max_tokens=1000))
    collected = run_to_completion(engine)
    assert len(collected.tokens_of("long")) == 4
    assert collected.finish["long"][0] is FinishReason.LENGTH
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request(request("too-long", list(range(64))))
    assert err.value.param == "token_ids"


def test_n_choices_share_the_prompt_and_finish_separately(engine):
    engine.add_request(request("n3", [5, 6, 7, 8], n=3, temperature=1.0, seed=3, max_tokens=8))
    collected = run_to_completion(engine)
    choices = collected.tokens["n3"]
    assert sorted(choices) == [0, 1, 2]
    assert all(len(tokens) == 8 for tokens in choices.values())
    assert len({tuple(t) for t in choices.values()}) > 1  # different seeds per choice
    assert collected.outputs["n3"][-1].num_output_tokens == 24


@pytest.mark.parametrize(
    "field, value, param",
    [
        ("token_ids", [-1, 2], "token_ids"),
        ("token_ids", [4096], "token_ids"),
        ("token_ids", [], "token_ids"),
        ("temperature", -1.0, "sampling_params.temperature"),
        ("top_p", 0.0, "sampling_params.top_p"),
        ("max_tokens", 0, "sampling_params.max_tokens"),
        ("logprobs", 10**6, "sampling_params.logprobs"),
        ("n", 10**6, "sampling_params.n"),
        ("temperature", float("nan"), "sampling_params.temperature"),
        ("logit_bias", {99999: 1.0}, "sampling_params.logit_bias"),
    ],
)
def test_bad_input_is_rejected_naming_the_field_and_leaves_the_engine_untouched(
    engine, field, value, param
):
    kwargs = {field: value} if field != "token_ids" else {}
    prompt = value if field == "token_ids" else [1, 2, 3]
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request(request("bad", prompt, **kwargs))
    assert err.value.param == param
    if field == "token_ids" and value and value[0] < 0:
        assert "must not be negative" in err.value.message
    assert not engine.has_unfinished_requests()
    engine.check_invariants()


def test_unknown_adapter_is_not_found(engine):
    bad = request("adapter", [1, 2, 3])
    object.__setattr__(bad, "adapter_name", "no-such-adapter")
    with pytest.raises(AdapterNotFoundError):
        engine.add_request(bad)
    assert not engine.has_unfinished_requests()


def test_logprobs_and_prompt_logprobs_match_transformers(engine, tiny_model_dir):
    prompt = random_prompts(seed=15, lengths=[24], vocab=engine.vocab_size)[0]
    engine.add_request(
        request("lp", prompt, max_tokens=3, logprobs=2, prompt_logprobs=1, salt="lp")
    )
    outputs = run_to_completion(engine).outputs["lp"]
    sampled = [lp for out in outputs for choice in out.choices for lp in (choice.logprobs or [])]
    prompt_lps = next(out.prompt_logprobs for out in outputs if out.prompt_logprobs is not None)
    tokens = [t for out in outputs for choice in out.choices for t in choice.token_ids]

    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        full = torch.tensor([prompt + tokens])
        ref = torch.log_softmax(hf(full).logits[0].float(), dim=-1)  # [len, vocab]
    assert prompt_lps[0] is None and len(prompt_lps) == len(prompt)
    for pos in range(1, len(prompt)):
        entry = prompt_lps[pos]
        assert entry.chosen.token_id == prompt[pos]
        assert abs(entry.chosen.logprob - ref[pos - 1, prompt[pos]].item()) < 1e-4
        assert len(entry.top) == 1 and entry.top[0].rank == 1
    assert len(sampled) == 3
    for i, entry in enumerate(sampled):
        row = ref[len(prompt) - 1 + i]
        assert entry.chosen.token_id == tokens[i] == int(row.argmax())
        assert abs(entry.chosen.logprob - row[tokens[i]].item()) < 1e-4
        assert [t.token_id for t in entry.top] == row.topk(2).indices.tolist()
