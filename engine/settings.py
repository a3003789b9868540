"""The engine's options, once: `loragate engine`'s flags and the gateway's embedded engine both
come from `EngineSettings`, and `to_engine_config` is the one mapping to `EngineConfig`.

Torch-free (the gateway reads it in HTTP mode too). Each field's description is its `--help`;
the flag is the field's name with dashes (`max_loras` -> `--max-loras`), the gateway's
environment variable `LORAGATE_ENGINE__` + its name upper-cased. Range checks live in
`EngineConfig` and run here at validation, so a bad value is refused where it is read, naming
the option.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.config import EngineConfig, LoraModule


class LoraModuleSpec(BaseModel):
    """An adapter served from the start."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    path: str = Field(min_length=1)
    base_model_name: str | None = None


class EngineSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="weights and activations dtype (auto: the checkpoint's)"
    )
    device: str = Field(default="cpu", description="torch device: cpu, cuda, cuda:1, ...")
    seed: int = Field(default=0, description="seed of the sampler's default generator")
    block_size: int = Field(default=16, description="tokens per KV-cache block (a power of two)")
    num_kv_blocks: int | None = Field(
        default=None,
        description="KV-cache blocks to allocate (default: sized by kv-cache-memory-gb)",
    )
    kv_cache_memory_gb: float = Field(
        default=1.0, gt=0, description="memory for the KV cache, in GiB"
    )
    max_num_seqs: int = Field(default=64, description="running requests at most (the batch)")
    max_num_batched_tokens: int = Field(default=2048, description="tokens per engine step at most")
    max_model_len: int | None = Field(
        default=None,
        ge=2,
        description="context length (default: the model's max_position_embeddings)",
    )
    scheduling_policy: Literal["priority", "fcfs"] = Field(
        default="priority", description="priority (tenant-fair, aging) or fcfs"
    )
    aging_steps: int = Field(
        default=64, description="a waiting request gains one priority level per this many steps"
    )
    enable_prefix_caching: bool = Field(
        default=True, description="reuse KV blocks of shared prefixes"
    )
    decode_attention: Literal["auto", "matmul", "sdpa", "native"] = Field(
        default="auto",
        description="decode attention backend; auto times them at start-up (CPU): native (reads "
        "the paged cache in place), matmul or sdpa (after gathering)",
    )
    prefill_attention: Literal["auto", "sdpa", "matmul"] = Field(
        default="auto",
        description="prefill attention backend; auto times them at start-up (CPU): sdpa, or "
        "matmul (two matmuls around a fused causal softmax; needs fused_layer_ops)",
    )
    enforce_eager: bool = Field(
        default=True,
        description="run every step eager; off: decode-only steps run a torch.compile'd forward "
        "(compiled at start, one graph)",
    )
    prepack_weights: bool = Field(
        default=True,
        description="CPU: pack linear weights into oneDNN's layout at load (bfloat16 where "
        "oneDNN has it; float32 where a start-up timing finds it faster); off: plain F.linear",
    )
    native_matmul: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="CPU, bf16, packed weights: matmuls by a hand-written AVX512-BF16 (and "
        "AMX, where the CPU has it) kernel instead of oneDNN; auto: timed at start-up, every "
        "step where the kernel keeps up (oneDNN's copy of the weights dropped), only small "
        "steps over a second copy where it wins only there and the copy fits in a quarter of "
        "free memory; on: every step",
    )
    fused_layer_ops: bool = Field(
        default=True,
        description="CPU: run each layer's norms, RoPE with the K/V cache write, SiLU and (where "
        "a start-up timing finds it faster than SDPA) prefill attention's softmax by fused C++ "
        "kernels built at start; off: PyTorch operators and SDPA (the reference)",
    )
    native_decode_step: bool = Field(
        default=True,
        description="CPU: a decode-only step of the base model runs its layers in one native "
        "call where the matmuls, layer ops and decode attention all run native already (the "
        "same kernels, the same values); off: layer by layer from Python",
    )
    tune: bool = Field(
        default=False,
        description="time the start-up choices of native paths again and replace the ones saved "
        "in the tuning file (run on a quiet machine: every later start keeps what this one "
        "chose); off: read them from the file, timing only what it lacks",
    )
    tuning_file: str | None = Field(
        default=None,
        description="JSON file of the start-up choices timed on this machine, one entry per "
        "CPU, model shape, dtype, thread count and torch version (default: tuning.json in "
        "loragate_native/ of the compile cache, where the native kernels are built)",
    )
    compile_cache_dir: str | None = Field(
        default=None,
        description="where torch.compile caches its artefacts for fast restarts (default: "
        "inductor's, under the temporary directory)",
    )
    max_queue_len: int = Field(
        default=4096, ge=1, description="requests in flight at most (more are refused with 503)"
    )
    enable_lora: bool = Field(default=True, description="LoRA wrappers and adapter slots")
    lora_pool_memory_gb: float = Field(
        default=1.0,
        gt=0,
        description="device memory for adapter slots, in GiB (beside the KV cache; host memory "
        "on CPU); it holds as many max-lora-rank slots as fit",
    )
    max_loras: int | None = Field(
        default=None,
        description="adapter slots at most (default: max-num-seqs; fewer if the pool holds fewer)",
    )
    max_cpu_loras: int | None = Field(
        default=None,
        description="adapters cached in CPU memory (>= max-loras; default and at least: the slots)",
    )
    max_lora_rank: int = Field(default=16, description="the largest adapter rank served")
    lora_modules: tuple[LoraModuleSpec, ...] = Field(
        default=(), description="adapters to serve from the start"
    )
    adapter_cache_dir: str | None = Field(
        default=None,
        description="where adapters fetched from the gateway's store are unpacked and kept "
        "(default: a fresh temporary directory, removed at exit)",
    )
    adapter_cache_gb: float = Field(
        default=4.0,
        gt=0,
        description="disk the fetched adapters may take, in GiB (least recently used go first)",
    )
    threads: int | None = Field(
        default=None,
        ge=1,
        description="torch intra-op threads, set at engine start (default: every core available)",
    )
    grammar_cache_entries: int = Field(
        default=256, description="compiled structured-output grammars kept (least recently used go)"
    )
    grammar_compile_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="the longest a request waits for its grammar to compile (then a 400)",
    )
    grammar_compile_nice: int = Field(
        default=5,
        description="how much lower (nice, 0-19) the grammar compile threads' CPU priority is "
        "than the engine step's",
    )

    @model_validator(mode="after")
    def _engine_rules(self) -> EngineSettings:
        self.to_engine_config(model="")  # EngineConfig's checks raise ValueError naming the field
        return self

    def to_engine_config(self, *, model: str, served_model_name: str | None = None) -> EngineConfig:
        return EngineConfig(
            model=model,
            served_model_name=served_model_name,
            dtype=self.dtype,
            device=self.device,
            seed=self.seed,
            block_size=self.block_size,
            num_kv_blocks=self.num_kv_blocks,
            kv_cache_memory_bytes=int(self.kv_cache_memory_gb * (1 << 30)),
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            policy=self.scheduling_policy,
            aging_steps=self.aging_steps,
            enable_prefix_caching=self.enable_prefix_caching,
            decode_attention=self.decode_attention,
            prefill_attention=self.prefill_attention,
            enforce_eager=self.enforce_eager,
            prepack_weights=self.prepack_weights,
            native_matmul=self.native_matmul,
            fused_layer_ops=self.fused_layer_ops,
            native_decode_step=self.native_decode_step,
            tuning="tune" if self.tune else "saved",
            tuning_file=self.tuning_file,
            compile_cache_dir=self.compile_cache_dir,
            max_queue_len=self.max_queue_len,
            enable_lora=self.enable_lora,
            lora_pool_memory_bytes=int(self.lora_pool_memory_gb * (1 << 30)),
            max_loras=self.max_loras,
            max_cpu_loras=self.max_cpu_loras,
            max_lora_rank=self.max_lora_rank,
            adapter_cache_dir=self.adapter_cache_dir,
            adapter_cache_bytes=int(self.adapter_cache_gb * (1 << 30)),
            lora_modules=tuple(
                LoraModule(name=m.name, path=m.path, base_model_name=m.base_model_name)
                for m in self.lora_modules
            ),
            threads=self.threads,
            grammar_cache_entries=self.grammar_cache_entries,
            grammar_compile_timeout_s=self.grammar_compile_timeout_s,
            grammar_compile_nice=self.grammar_compile_nice,
        )
