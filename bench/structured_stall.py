"""Does a big grammar's compile stall the requests already decoding? (bench/structured.py)

16 structured requests decode in an LLMEngine stepped on this (the main) thread, as `loragate
engine` steps its loop. Then a ~1 MB JSON Schema (structured_workload.big_schema: thousands of
described properties, which llguidance accepts) is compiled through the engine's own
`GrammarCompiler.compile_async`, the path AsyncEngine.add_request takes: on the compiler's
worker thread at its lower priority, while this thread keeps stepping: asked for between two
steps (bench/structured.py) or later (`arrival`, bench/compile_stall.py: in the middle of a
step, as most of a busy server's requests arrive). Once compiled, the big
request joins the batch with its grammar, as AsyncEngine admits it. Every step's duration is
kept: before the compile, during it (any step that overlaps it) and after the big request
joined, then as many steps as the compile overlapped with no compile at all (the control: the
machine's own noise in the slowest of that many steps). The 16 decoding requests generate a
JSON array of at least 1,000 digits, so none ends before the measurement does (checked) and
every step decodes the same batch.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import engine_run
from structured_engine import compact_spec
from structured_workload import BIG_NUM_PROPERTIES, BIG_NUM_REQUIRED, big_schema, stall_figures
from workload import BenchRequest

from engine.errors import InvalidRequestError
from engine.loop.llm_engine import LLMEngine
from engine.request import EngineRequest, RequestId
from engine.sampling_params import SamplingParams
from engine.structured.matcher import CompiledGrammar
from engine.structured.spec import StructuredSpec

NUM_DECODING = 16
NUM_STEPS_BEFORE = 30
NUM_STEPS_AFTER = 30
LONG_ARRAY = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "maximum": 9},
    "minItems": 1000,
}
DECODE_MAX_TOKENS = 1800  # room for the 1,000 items; the requests are aborted long before


def _request(
    rid: str, prompt: Sequence[int], spec: StructuredSpec, max_tokens: int
) -> EngineRequest:
    return EngineRequest(
        request_id=RequestId(rid),
        prompt_token_ids=tuple(prompt),
        sampling_params=SamplingParams(
            temperature=0.0, max_tokens=max_tokens, structured_outputs=spec
        ),
    )


class _Compile:
    """compile_async on a thread with an event loop of its own (the gateway's, in a server):
    the work itself runs on the compiler's worker thread; this thread only waits for it.

    `poll` says running until the compiler has stored the outcome: past compile_async's
    timeout (a refusal for the request) the native compile keeps running, and keeps taking CPU
    from the steps, until it lands in the cache."""

    def __init__(self, engine: LLMEngine, spec: StructuredSpec, delay_s: float) -> None:
        self.grammar: CompiledGrammar | None = None
        self.error: str | None = None
        self._grammars = engine.grammars
        self._num_cached = engine.grammars.num_cached
        self.started = time.perf_counter() + delay_s  # set again when the compile is asked for
        self.ended = self.started
        self._thread = threading.Thread(target=self._run, args=(spec, delay_s), daemon=True)
        self._thread.start()

    def _run(self, spec: StructuredSpec, delay_s: float) -> None:
        time.sleep(delay_s)
        self.started = time.perf_counter()
        try:
            self.grammar = asyncio.run(self._grammars.compile_async(spec))
        except InvalidRequestError as exc:
            self.error = exc.message
        self.ended = time.perf_counter()

    def poll(self) -> bool:
        """True while the compile runs; on the first False, `ended` is final."""
        if self._thread.is_alive() or self._grammars.num_cached == self._num_cached:
            return True
        if self.error is not None:  # timed out: it ended when the cache grew (seen between steps)
            self.ended = time.perf_counter()
        return False


def _timed_step(engine: LLMEngine) -> tuple[float, float]:
    start = time.perf_counter()
    engine.step()
    return start, time.perf_counter()


def _check_batch(engine: LLMEngine, num_expected: int, phase: str) -> None:
    num_running = len(engine.scheduler.running)
    if num_running != num_expected:
        raise RuntimeError(f"{phase}: {num_running} sequences running, expected {num_expected}")


def _idle_compile_s(engine: LLMEngine, num_properties: int) -> float:
    """The same compile with nothing decoding (another cache key: a title), for scale."""
    schema = {**big_schema(num_properties), "title": "idle"}
    start = time.perf_counter()
    engine.grammars.compile(compact_spec(schema))
    return time.perf_counter() - start


def measure_compile_stall(
    model_dir: Path,
    dtype: str,
    render: Callable[[str], Sequence[int]],
    warmup: Sequence[BenchRequest],
    num_properties: int = BIG_NUM_PROPERTIES,
    arrival: float = 0.0,
) -> dict[str, Any]:
    """The stall figures (structured_workload.stall_figures) and every step's duration; the
    compile is asked for `arrival` median steps after the last step before it ended."""
    prompt = render("Answer in JSON.")
    big_prompt = render("Fill in the order record as JSON.")
    num_tokens = NUM_DECODING * (len(prompt) + DECODE_MAX_TOKENS) + len(big_prompt) + 64
    settings = engine_run.EngineSettings(
        max_num_seqs=64, max_num_batched_tokens=2048, num_kv_blocks=-(-num_tokens // 16) + 16
    )
    engine = engine_run.build_engine(model_dir, dtype, settings)
    engine_run.warm_up(engine, warmup)
    decoding = compact_spec(LONG_ARRAY)
    engine.grammars.compile(decoding)  # loads the llguidance tokenizer: not part of the stall
    idle_s = _idle_compile_s(engine, num_properties)
    schema = big_schema(num_properties)
    big = compact_spec(schema)  # parsed and checked at the boundary, before the engine sees it

    for i in range(NUM_DECODING):
        engine.add_request(_request(f"decode-{i}", prompt, decoding, DECODE_MAX_TOKENS))
    engine.step()  # every prompt prefills in this one step (16 short prompts < 2,048 tokens)
    _check_batch(engine, NUM_DECODING, "after the prefill")
    before = [_timed_step(engine) for _ in range(NUM_STEPS_BEFORE)]

    # `arrival`: when the compile is asked for, as a fraction of a median step after the last
    # timed step ended (0: between two steps, the next one beginning as it starts; 0.5: in the
    # middle of a step, as most of a busy server's requests arrive)
    delay_s = arrival * statistics.median(e - s for s, e in before)
    job = _Compile(engine, big, delay_s)
    during = []
    while job.poll():
        during.append(_timed_step(engine))
    _check_batch(engine, NUM_DECODING, "after the compile")
    # Refused only by the timeout: the finished compile is in the cache now (a client's retry
    # would find it), and the big request joins with it so the after-steps are measured.
    grammar = job.grammar or engine.grammars.compile(big)
    engine.add_request(replace(_request("big", big_prompt, big, 64), grammar=grammar))
    after = [_timed_step(engine) for _ in range(NUM_STEPS_AFTER)]
    _check_batch(engine, NUM_DECODING + 1, "after the compile's request joined")
    # The control: as many steps as the compile overlapped, same batch, no compile (the noise
    # floor of `compile_stall_ms`), within the tokens the decoding requests have left.
    engine.abort_requests(["big"])
    # A step counts as during the compile if it overlapped it at all.
    overlapping = [(s, e) for s, e in during if s < job.ended and e > job.started]
    room = DECODE_MAX_TOKENS - 1 - len(before) - len(during) - len(after) - 8
    control = [_timed_step(engine) for _ in range(min(len(overlapping), room))]
    _check_batch(engine, NUM_DECODING, "at the end")
    engine.abort_requests([f"decode-{i}" for i in range(NUM_DECODING)])
    engine.grammars.shutdown()

    ms = lambda steps: [(e - s) * 1e3 for s, e in steps]  # noqa: E731
    return {
        **stall_figures(ms(before), ms(overlapping), ms(after), ms(control)),
        "compile_s": job.ended - job.started,
        "compile_s_idle": idle_s,
        "refused": job.error,  # None: compile_async answered the grammar in time
        "schema_bytes": len(json.dumps(schema, separators=(",", ":")).encode()),
        "schema": f"object, {num_properties} string properties with descriptions, "
        f"{BIG_NUM_REQUIRED} required, additionalProperties false",
        "arrival": arrival,
        "num_decoding": NUM_DECODING,
        "decoding_schema": LONG_ARRAY,
        "num_steps_before": len(before),
        "num_steps_during": len(overlapping),
        "num_steps_after": len(after),
        "num_steps_control": len(control),
        "steps_ms": {
            "before": ms(before),
            "during": ms(overlapping),
            "after": ms(after),
            "control": ms(control),
        },
        "compile_nice": engine.config.grammar_compile_nice,
        "compile_timeout_s": engine.config.grammar_compile_timeout_s,
        "engine_settings": asdict(settings),
    }
