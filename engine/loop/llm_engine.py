"""The synchronous engine: validate and admit requests, step (schedule, forward, sample), emit
per-request deltas. Not thread-safe: the async engine drives it from one thread."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterable

import torch

from engine.config import EngineConfig
from engine.errors import AdapterNotFoundError, InvalidRequestError
from engine.loop.engine_parts import (
    build_grammars,
    build_sampler,
    check_prompt,
    num_kv_blocks,
    optional_path,
    resolve_dtype,
)
from engine.loop.request_state import RequestState, seeded_generators
from engine.models.hf_config import load_model_config
from engine.models.loader import load_model
from engine.outputs import (
    EngineStats,
    FailedSeq,
    FinishReason,
    RequestOutput,
    RequestTimes,
)
from engine.request import EngineRequest, RequestId
from engine.sampling.sampler import SamplingRow, reads_token_history
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import Scheduler, adapter_of
from engine.scheduling.sequence import Sequence
from engine.step.choices.startup import StartupChoices
from engine.step.compile_decode import use_compile_cache
from engine.step.lora_setup import build_lora_manager, lora_stats
from engine.step.model_runner import ForwardOutput, ModelRunner
from engine.step.native_matmul import prepare_linears
from engine.step.threads import apply_threads
from lora.manager import LoRAManager
from lora.registry import AdapterId

log = logging.getLogger(__name__)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.num_threads = apply_threads(config.threads)
        self.model_config = load_model_config(config.model)
        mc = self.model_config
        self.device = torch.device(config.device)
        self.dtype = resolve_dtype(config.dtype, mc.torch_dtype, self.device)
        self.vocab_size = mc.vocab_size
        self.max_model_len = min(
            config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings
        )
        self.model_name = config.model_name
        self.eos_token_ids = frozenset(mc.eos_token_ids)
        model = load_model(
            config.model, mc, dtype=self.dtype, device=self.device, max_positions=self.max_model_len
        )
        num_blocks = num_kv_blocks(config, mc, self.dtype)
        self.block_manager = BlockManager(
            num_blocks, config.block_size, enable_prefix_caching=config.enable_prefix_caching
        )
        # Before the LoRA set-up, whose CPU kernel compiles there too.
        use_compile_cache(optional_path(config.compile_cache_dir))
        self.lora: LoRAManager | None = (
            build_lora_manager(model, config, mc, self.device) if config.enable_lora else None
        )
        # After use_compile_cache: the tuning file's default place is in that cache.
        choices = StartupChoices.for_engine(config, mc, self.dtype, self.num_threads)
        # After the LoRA wrappers: they hold the base layers, which get packed in place.
        self.packed_linears, self.native_matmul = prepare_linears(
            model,
            config.native_matmul,
            self.dtype,
            self.device,
            pack=config.prepack_weights and config.enforce_eager,
            choices=choices,
        )
        self.scheduler = Scheduler(
            config, self.block_manager, None if self.lora is None else self.lora.cache
        )
        self.runner = ModelRunner(
            model,
            mc,
            num_blocks=num_blocks,
            block_size=config.block_size,
            dtype=self.dtype,
            device=self.device,
            lora=self.lora,
            decode_attention=config.decode_attention,
            prefill_attention=config.prefill_attention,
            compile_decode=not config.enforce_eager,
            fused_layer_ops=config.fused_layer_ops,
            native_decode_step=config.native_decode_step,
            max_num_seqs=config.max_num_seqs,
            compile_cache_dir=optional_path(config.compile_cache_dir),
            choices=choices,
        )
        self.startup_choices = tuple(choices.made.values())  # for /metrics
        self.sampler = build_sampler(
            config, mc, self.runner, self.dtype, self.device, self.num_threads
        )
        self.grammars = build_grammars(config, mc)
        self._requests: dict[RequestId, RequestState] = {}
        self._seq_ids = itertools.count()
        self._arrivals = itertools.count()
        self._num_prompt_tokens = 0
        self._num_generation_tokens = 0

    # -- requests ------------------------------------------------------------------------

    def validate(self, request: EngineRequest) -> None:
        if request.request_id in self._requests:
            raise InvalidRequestError(
                f"request_id {request.request_id!r} is already in flight", param="request_id"
            )
        check_prompt(request.prompt_token_ids, self.vocab_size, self.max_model_len)
        request.sampling_params.validate(vocab_size=self.vocab_size)
        if not INT64_MIN <= request.priority <= INT64_MAX:
            raise InvalidRequestError("priority must be a signed 64-bit integer", param="priority")
        self._resolve_adapter(request)

    def _resolve_adapter(self, request: EngineRequest) -> AdapterId | None:
        name = request.adapter_name
        if name is None or name == self.model_name:
            return None
        adapter_id = None if self.lora is None else self.lora.find(name)
        if adapter_id is None:
            raise AdapterNotFoundError(f"model {name[:200]!r} does not exist", param="model")
        return adapter_id

    def add_request(self, request: EngineRequest) -> None:
        self.validate(request)
        adapter_id = self._resolve_adapter(request)
        params = request.sampling_params
        grammar = request.grammar
        if grammar is None and params.structured_outputs is not None:
            grammar = self.grammars.compile(params.structured_outputs)  # raises its 400
        num_prompt = len(request.prompt_token_ids)
        max_tokens = min(params.max_tokens, self.max_model_len - num_prompt)
        arrival = next(self._arrivals)
        seqs = [
            Sequence(
                seq_id=next(self._seq_ids),
                request=request,
                index=i,
                arrival_order=arrival,
                arrival_step=self.scheduler.num_steps,
                token_ids=list(request.prompt_token_ids),
                num_prompt_tokens=num_prompt,
                max_tokens=max_tokens,
                adapter_id=adapter_id,
                grammar=None if grammar is None else grammar.new_matcher(),
            )
            for i in range(params.n)
        ]
        generators = seeded_generators(params.seed, params.n, self.device)
        state = RequestState(request, seqs, RequestTimes(arrival=request.arrival_time), generators)
        if params.prompt_logprobs is not None:
            state.prompt_logprobs = [None]
        self._requests[request.request_id] = state
        for seq in seqs:
            self.scheduler.add(seq)

    def abort_requests(self, request_ids: Iterable[str]) -> list[RequestOutput]:
        outputs = []
        for request_id in request_ids:
            state = self._requests.get(RequestId(request_id))
            if state is None:
                continue
            for seq in state.seqs:
                if not seq.is_finished:
                    self.scheduler.finish(seq)
                    seq.finish_reason = FinishReason.ABORT
            outputs.append(self._output(state))
        return outputs

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def num_unfinished_requests(self) -> int:
        return len(self._requests)

    # -- the step ------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        try:
            self._take_step_threads()
            return self._step()
        finally:
            self.grammars.cores.step_done()

    def _step(self) -> list[RequestOutput]:
        sched = self.scheduler.schedule()
        failed = self._fail(sched.failed)
        if sched.is_empty:
            if self.lora is not None:  # all that waits may wait for a read: no busy spin
                self.lora.cache.wait_for_load(self.config.idle_wait_s)
            self._finish_unloads()
            return [self._output(self._requests[rid]) for rid in failed if rid in self._requests]
        now = time.monotonic()
        for item in sched.scheduled:
            times = self._requests[item.seq.request.request_id].times
            if times.first_scheduled is None:
                times.first_scheduled = now
        forward = self.runner.execute(sched)
        block_size = self.block_manager.block_size
        for item in sched.scheduled:
            seq = item.seq
            seq.num_computed_tokens += item.num_new_tokens
            # a decode token completes a block only on a block boundary (the call costs ~2 us a
            # row every step otherwise; a late call catches up on every block before it)
            if item.num_new_tokens > 1 or seq.num_computed_tokens % block_size == 0:
                self.block_manager.cache_full_blocks(seq)
        touched = self._record_prompt_logprobs(forward)
        touched |= self._sample(forward)
        touched |= failed
        outputs = [self._output(self._requests[rid]) for rid in touched if rid in self._requests]
        self._finish_unloads()
        return outputs

    def _take_step_threads(self) -> None:
        """While a grammar compiles on its own thread, the step runs on one thread fewer, and a
        compile starts only once a step on every core has ended (core_handoff.py): a compile
        beside a step on every core delayed one of its threads at each barrier, and steps of
        9 ms took 240-290 ms (bench/RESULTS.md, structured outputs); one core fewer costs the
        step 1/N of its speed, steadily, for the compile's duration."""
        threads = self.grammars.cores.step_threads(self.num_threads)
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)

    def _fail(self, failed: list[FailedSeq]) -> set[RequestId]:
        """Sequences the scheduler ended (their adapter became unreadable): the request fails."""
        touched: set[RequestId] = set()
        for item in failed:
            state = self._requests[item.seq.request.request_id]
            state.error = item.message
            for seq in state.seqs:
                if not seq.is_finished:
                    self.scheduler.finish(seq)
                    seq.finish_reason = FinishReason.ERROR
            touched.add(item.seq.request.request_id)
        return touched

    def _sample(self, forward: ForwardOutput) -> set[RequestId]:
        if not forward.sampling_seqs:
            return set()
        rows = [self._sampling_row(seq) for seq in forward.sampling_seqs]
        sampled = self.sampler.sample(forward.logits, rows)
        now = time.monotonic()
        touched: set[RequestId] = set()
        for seq, token in zip(forward.sampling_seqs, sampled, strict=True):
            state = self._requests[seq.request.request_id]
            if state.times.first_token is None:
                state.times.first_token = now
            if not state.counted_prompt:
                state.counted_prompt = True
                self._num_prompt_tokens += seq.num_prompt_tokens
            seq.token_ids.append(token.token_id)
            self._num_generation_tokens += 1
            if token.logprobs is not None:
                seq.pending_logprobs.append(token.logprobs)
            if seq.grammar is not None and not seq.grammar.accept(token.token_id):
                self._fail_grammar(state, seq)
            else:
                self._check_stop(seq, token.token_id)
            touched.add(seq.request.request_id)
        return touched

    def _sampling_row(self, seq: Sequence) -> SamplingRow:
        params = seq.request.sampling_params
        state = self._requests[seq.request.request_id]
        banned: list[int] = []
        if seq.num_output_tokens < params.min_tokens:
            banned.extend(params.stop_token_ids)
            if not params.ignore_eos:
                banned.extend(self.eos_token_ids)
        # the ids are copied out only for rows that read them: a 500-token prompt sliced for
        # each of 64 rows every step was ~0.1 ms of a decode step's Python
        history = reads_token_history(params)
        return SamplingRow(
            params=params,
            generator=state.generators[seq.index],
            prompt_token_ids=seq.token_ids[: seq.num_prompt_tokens] if history else (),
            output_token_ids=seq.output_token_ids if history else (),
            banned_token_ids=banned,
            grammar=seq.grammar,
        )

    def _fail_grammar(self, state: RequestState, seq: Sequence) -> None:
        """The grammar refused the sampled token: only when its matcher failed (a step past
        llguidance's per-step limits); the request ends with an error. llguidance's own message
        quotes the generated text, so it stays out of the answer and the logs."""
        state.error = (
            "structured outputs: the grammar could not follow the output "
            "(a step exceeded the grammar engine's limits)"
        )
        for other in state.seqs:
            if not other.is_finished:
                self.scheduler.finish(other)
                other.finish_reason = FinishReason.ERROR

    def _check_stop(self, seq: Sequence, token_id: int) -> None:
        params = seq.request.sampling_params
        reason: FinishReason | None = None
        if seq.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token_id in self.eos_token_ids:
                reason = FinishReason.STOP
            elif token_id in params.stop_token_ids:
                reason, seq.stop_reason = FinishReason.STOP, token_id
        if reason is None and seq.grammar is not None and seq.grammar.is_stopped:
            reason = FinishReason.STOP  # the grammar is complete: nothing more may follow
        if reason is None and (
            seq.num_output_tokens >= seq.max_tokens or seq.num_tokens >= self.max_model_len
        ):
            reason = FinishReason.LENGTH
        if reason is not None:
            seq.finish_reason = reason
            self.scheduler.finish(seq)

    def _record_prompt_logprobs(self, forward: ForwardOutput) -> set[RequestId]:
        touched: set[RequestId] = set()
        for chunk in forward.prompt_logits:
            state = self._requests[chunk.seq.request.request_id]
            if state.prompt_logprobs is None:
                continue
            known = len(state.prompt_logprobs)  # positions 0..known-1 done (recompute repeats)
            k = chunk.seq.request.sampling_params.prompt_logprobs or 0
            first_new = max(0, known - 1 - chunk.first_position)
            if first_new >= len(chunk.target_ids):
                continue
            entries = self.sampler.prompt_logprobs(
                chunk.logits[first_new:], chunk.target_ids[first_new:], k
            )
            state.prompt_logprobs.extend(entries)
            touched.add(chunk.seq.request.request_id)
        return touched

    # -- outputs -------------------------------------------------------------------------

    def _output(self, state: RequestState) -> RequestOutput:
        output = state.take_output()
        if output.finished:
            self._requests.pop(state.request.request_id, None)
        return output

    # -- adapters (control path, on the loop thread) -------------------------------------

    def is_adapter_unloaded(self, adapter_id: AdapterId) -> bool:
        """Finish pending unloads that nothing uses any more; True once this one is gone."""
        self._finish_unloads()
        return self.lora is None or adapter_id not in self.lora.pending_unloads

    def _finish_unloads(self) -> None:
        if self.lora is None or not self.lora.pending_unloads:
            return
        self.lora.finish_unloads({adapter_of(s) for s in self.scheduler.live_sequences()})

    # -- introspection -------------------------------------------------------------------

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_usage=self.block_manager.usage,
            num_preemptions_total=self.scheduler.num_preemptions,
            prefix_cache_queries_total=self.block_manager.num_prefix_queries,
            prefix_cache_hits_total=self.block_manager.num_prefix_hits,
            prompt_tokens_total=self._num_prompt_tokens,
            generation_tokens_total=self._num_generation_tokens,
            served_tokens_by_tenant=self.scheduler.fairness.snapshot(),
            lora=None
            if self.lora is None
            else lora_stats(
                self.lora,
                running=(adapter_of(s) for s in self.scheduler.running),
                waiting=(adapter_of(s) for s in self.scheduler.waiting),
            ),
        )

    def check_invariants(self) -> None:
        self.block_manager.check_invariants(self.scheduler.live_sequences())
