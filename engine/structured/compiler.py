"""Compiling a spec against the engine's tokenizer: off the engine loop, cached, bounded.

llguidance builds a grammar's lexer and parser when its first matcher is made (about 1 ms for
a typical schema, up to about a second for a megabyte of schema); everything past that happens
lazily, token by token, inside its per-step limits. So:

- `compile_async` (AsyncEngine.add_request, before the request reaches the loop) runs a cache
  miss on a thread of its own while the loop keeps stepping; the request waits for its grammar
  outside the scheduler, holding no batch slot. Each of these threads holds a core of its own
  (`cores`, core_handoff.py): it starts once the step in progress, if that step uses every
  core, has ended, and the engine steps on one thread fewer while it runs
  (LLMEngine._take_step_threads). llguidance first parses the grammar document
  holding the GIL (~8 ms a megabyte), then builds without it: the thread starts at the loop's
  priority and lowers itself (`compile_nice`) once that parse is behind it, so where no core can
  be yielded (a one-thread engine) the long part takes CPU only where the step leaves it.
  Lowered from the start, the thread was descheduled while it held the GIL and the loop waited
  on it: steps of 70-200 ms against 11 ms (bench/RESULTS.md, structured outputs). A Linux
  thread cannot raise its priority back, so each compile runs on a fresh thread; `num_workers`
  bounds how many run.
- A compile that llguidance's limits refuse (`LLParserLimits`: grammar size, lexer fuel) or that
  outlives `compile_timeout_s` fails that request alone: InvalidRequestError naming the field.
  A timed-out compile still finishes in the background (native code cannot be interrupted);
  its result lands in the cache.
- The cache is an LRU keyed by the spec (canonical source and options; one tokenizer per
  engine), bounded in entries and in source characters, and it remembers failures too, so a
  bad schema sent again costs a dictionary lookup. Concurrent requests for one uncached spec
  share one compile.
- `compile` (the synchronous engine, offline use) does the same work on the caller's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llguidance

from engine.errors import InvalidRequestError
from engine.structured.core_handoff import CoreHandoff
from engine.structured.matcher import CompiledGrammar
from engine.structured.spec import StructuredSpec, grammar_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompilerLimits:
    cache_entries: int = 256
    cache_source_chars: int = 64 << 20
    compile_timeout_s: float = 30.0
    # Added to the worker threads' nice value (Linux: per thread); 0 keeps the loop's.
    compile_nice: int = 5
    num_workers: int = 2

    def __post_init__(self) -> None:
        if self.cache_entries < 1 or self.cache_source_chars < 1:
            raise ValueError("the grammar cache needs room for at least one entry")
        if self.compile_timeout_s <= 0:
            raise ValueError("compile_timeout_s must be > 0")
        if not 0 <= self.compile_nice <= 19:
            raise ValueError("compile_nice must be in [0, 19]")
        if self.num_workers < 1:
            raise ValueError("num_workers must be >= 1")


Outcome = CompiledGrammar | InvalidRequestError


class GrammarCompiler:
    def __init__(
        self, tokenizer: Callable[[], llguidance.LLTokenizer], limits: CompilerLimits
    ) -> None:
        """`tokenizer` builds the llguidance tokenizer on first use (loading the model's
        tokenizer costs ~0.1 s, which an engine that never sees a grammar does not pay)."""
        self.limits = limits
        self._make_tokenizer = tokenizer
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()  # the cache, the in-flight map and the tokenizer
        self._cache: OrderedDict[StructuredSpec, Outcome] = OrderedDict()
        self._cache_chars = 0
        self._in_flight: dict[StructuredSpec, concurrent.futures.Future[Outcome]] = {}
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.num_compiles = 0  # cache misses compiled (tests and metrics read it)
        # the core a compile on its own thread takes from the step (the engine asks it how many
        # threads each step may use)
        self.cores = CoreHandoff()

    @classmethod
    def for_model(
        cls,
        model_dir: str | Path,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        limits: CompilerLimits,
    ) -> GrammarCompiler:
        def load() -> llguidance.LLTokenizer:
            import llguidance.hf
            from transformers import AutoTokenizer

            try:
                hf: Any = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
                return llguidance.hf.from_tokenizer(
                    hf, n_vocab=vocab_size, eos_token=list(eos_token_ids)
                )
            except (OSError, ValueError, TypeError, AttributeError) as exc:
                raise InvalidRequestError(
                    "structured outputs need the model's fast tokenizer (tokenizer.json): "
                    f"{type(exc).__name__}",
                    param="sampling_params.structured_outputs",
                ) from None

        return cls(load, limits)

    # ---- compiling ---------------------------------------------------------------------------

    def compile(self, spec: StructuredSpec) -> CompiledGrammar:
        """The compiled grammar for `spec`, on this thread; raises InvalidRequestError."""
        with self._lock:
            cached = self._lookup(spec)
        if cached is None:
            cached = self._build(spec)
            with self._lock:
                self._store(spec, cached)
        return _result(cached)

    async def compile_async(self, spec: StructuredSpec) -> CompiledGrammar:
        """As `compile`, on a worker thread, waiting at most compile_timeout_s."""
        with self._lock:
            cached = self._lookup(spec)
            if cached is not None:
                return _result(cached)
            future = self._in_flight.get(spec)
            if future is None or future.cancelled():
                future = self._pool().submit(self._build_and_store, spec)
                self._in_flight[spec] = future
        try:
            async with asyncio.timeout(self.limits.compile_timeout_s):
                outcome = await asyncio.shield(asyncio.wrap_future(future))
        except TimeoutError:
            raise InvalidRequestError(
                f"{spec.param} took longer than {self.limits.compile_timeout_s:g} s to compile; "
                "simplify it (fewer alternatives, shallower nesting)",
                param=spec.param,
            ) from None
        return _result(outcome)

    def _build_and_store(self, spec: StructuredSpec) -> Outcome:
        try:
            outcome = self._build_lowering(spec)
        except BaseException as exc:  # an unexpected failure must not leave waiters hanging
            outcome = InvalidRequestError(
                f"{spec.param} could not be compiled ({type(exc).__name__})", param=spec.param
            )
        with self._lock:
            self._store(spec, outcome)
            self._in_flight.pop(spec, None)
        return outcome

    def _build_lowering(self, spec: StructuredSpec) -> Outcome:
        """`_build` on a fresh thread that lowers its own priority after the GIL-held parse."""
        outcomes: list[Outcome] = []
        failures: list[BaseException] = []

        def run() -> None:
            try:
                outcomes.append(self._build(spec, lower=self.limits.compile_nice))
            except BaseException as exc:  # raised again on the waiting thread
                failures.append(exc)

        thread = threading.Thread(target=run, name="grammar-compile", daemon=True)
        with self.cores.core():
            thread.start()
            thread.join()
        if failures:
            raise failures[0]
        return outcomes[0]

    def _build(self, spec: StructuredSpec, lower: int = 0) -> Outcome:
        """Compile on this thread; `lower`: nice added to it once llguidance's parse of the
        grammar (GIL held, ~8 ms a megabyte; 20 ms a megabyte allowed here) is done."""
        try:
            grammar = grammar_text(spec)
            tokenizer = self._llg_tokenizer()
        except InvalidRequestError as exc:
            return exc
        timer = None
        if lower > 0:
            delay_s = 0.005 + 20e-9 * len(grammar)
            timer = threading.Timer(delay_s, _lower_priority, (threading.get_native_id(), lower))
            timer.start()
        try:
            matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        finally:
            if timer is not None:
                timer.cancel()
        self.num_compiles += 1
        if matcher.is_error():
            error = " ".join(matcher.get_error().split())
            return InvalidRequestError(
                f"{spec.param} does not compile: {error[:300]}", param=spec.param
            )
        return CompiledGrammar(spec, matcher)

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = self._make_tokenizer()
            return self._tokenizer

    # ---- the cache (callers hold _lock) ------------------------------------------------------

    def _lookup(self, spec: StructuredSpec) -> Outcome | None:
        outcome = self._cache.get(spec)
        if outcome is not None:
            self._cache.move_to_end(spec)
        return outcome

    def _store(self, spec: StructuredSpec, outcome: Outcome) -> None:
        if spec in self._cache:
            return
        self._cache[spec] = outcome
        self._cache_chars += len(spec.source)
        limits = self.limits
        while len(self._cache) > 1 and (
            len(self._cache) > limits.cache_entries or self._cache_chars > limits.cache_source_chars
        ):
            old, _ = self._cache.popitem(last=False)
            self._cache_chars -= len(old.source)

    @property
    def num_cached(self) -> int:
        with self._lock:
            return len(self._cache)

    # ---- workers -----------------------------------------------------------------------------

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """The threads that wait for compiles (each on a fresh thread: _build_lowering)."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.limits.num_workers, thread_name_prefix="grammar-wait"
            )
        return self._executor

    def shutdown(self) -> None:
        """Stop the worker threads; a later compile_async starts new ones."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


def _result(outcome: Outcome) -> CompiledGrammar:
    if isinstance(outcome, InvalidRequestError):
        # a fresh exception per request: a raised one carries its traceback and context
        raise InvalidRequestError(outcome.message, param=outcome.param)
    return outcome


def _lower_priority(tid: int, nice: int) -> None:
    """Lower thread `tid`'s CPU priority by `nice` (Linux sets nice per thread)."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
    except OSError as exc:  # a sandbox may forbid it: compiles then run at the loop's priority
        log.info("grammar compile threads keep their priority (%s)", exc)
