"""Engine configuration, built once at start-up and passed down (frozen)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SchedulingPolicy = Literal["priority", "fcfs"]


@dataclass(frozen=True)
class LoraModule:
    """An adapter registered at start-up (`--lora-modules`)."""

    name: str
    path: str
    base_model_name: str | None = None


@dataclass(frozen=True)
class EngineConfig:
    model: str
    served_model_name: str | None = None
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    device: str = "cpu"
    seed: int = 0
    block_size: int = 16
    # KV blocks to allocate; None sizes from kv_cache_memory_bytes.
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int = 1 << 30
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    policy: SchedulingPolicy = "priority"
    # A waiting request gains one priority level per `aging_steps` engine steps waited, so no
    # request waits forever behind a steady stream of better-priority work.
    aging_steps: int = 64
    enable_prefix_caching: bool = True
    # Decode attention: "auto" times the backends at start-up on this machine (CPU; CUDA uses
    # SDPA), or "native" / "matmul" / "sdpa" (engine/step/decode_backend.py).
    decode_attention: str = "auto"
    # Prefill attention on the CPU: "auto" times SDPA against two matmuls around the fused
    # causal softmax at start-up (engine/step/prefill_backend.py), or "sdpa" / "matmul".
    prefill_attention: str = "auto"
    # Decode-only steps of the base model run a torch.compile'd forward (engine/step/compile_decode.py)
    # unless enforce_eager; inductor caches its artefacts in compile_cache_dir (None: its default
    # under the system's temporary directory), so a restart loads instead of compiling.
    enforce_eager: bool = True
    # CPU: linear weights reordered once into oneDNN's packed layout at load (bf16 where oneDNN
    # has it, float32 where a start-up timing finds it faster: engine/step/packed_linear.py); off:
    # plain F.linear, the reference.
    prepack_weights: bool = True
    # CPU, bf16, packed weights: matmuls by a hand-written AVX512-BF16 (AMX where the CPU has
    # it) kernel instead of oneDNN
    # (engine/step/native_matmul.py): "auto" times both at start-up (every step where the kernel keeps
    # up, dropping oneDNN's copy; only small steps, over a second copy, where it wins only
    # there), "on" (every step), or "off".
    native_matmul: str = "auto"
    # CPU: each layer's RMSNorm (with its residual add), RoPE (with the K/V cache write),
    # SiLU-times-up and (where timed faster than SDPA) the causal softmax of prefill attention by
    # fused C++ kernels (kernels/cpu/layer.py); off: PyTorch operators and SDPA.
    fused_layer_ops: bool = True
    # CPU: a decode-only step of the base model runs its layers in one native call
    # (engine/step/native_decoder.py) where every part of the step already runs native: the same
    # kernels in the same order, so the same values; off: layer by layer from Python.
    native_decode_step: bool = True
    # The timed choices above ("auto": decode and prefill attention, the native matmul's rows,
    # float32 packing; engine/step/choices/tuning.py): "saved" reads them from tuning_file where
    # it holds them for this CPU, model, dtype, threads and torch, and times (then saves) only
    # what it lacks, so every start on a machine makes the same choices whatever its load;
    # "tune" times them all and replaces the saved ones; "off" times at every start and saves
    # nothing. "off" here, for tests and benchmarks that build this config themselves and may
    # monkeypatch a timing; `loragate engine` and the gateway (EngineSettings) use "saved" or
    # "tune".
    tuning: Literal["saved", "tune", "off"] = "off"
    tuning_file: str | None = None  # None: tuning.json beside the native kernels' builds
    compile_cache_dir: str | None = None
    max_queue_len: int = 4096
    # The loop waits this long for more requests before stepping an empty batch (seconds).
    idle_wait_s: float = 0.05
    # LoRA: the device memory for adapter slots (a batch never holds more distinct adapters than
    # slots; each slot is max_lora_rank wide, lora/layers.py), an upper bound on the slots
    # (None: max_num_seqs, more would never be in one batch), the CPU cache of adapters read
    # from disk (at least the slots; None: the slots), and the largest rank served.
    enable_lora: bool = True
    lora_pool_memory_bytes: int = 1 << 30
    max_loras: int | None = None
    max_cpu_loras: int | None = None
    max_lora_rank: int = 16
    lora_modules: tuple[LoraModule, ...] = ()
    # Adapters fetched from the gateway's store (lora/remote/) are unpacked here, at most
    # adapter_cache_bytes of them (least recently used go first); None: a fresh temporary
    # directory per process.
    adapter_cache_dir: str | None = None
    adapter_cache_bytes: int = 4 << 30
    # torch intra-op threads, set once at engine start (None: every core this process may use).
    threads: int | None = None
    # Structured outputs (engine/structured/compiler.py): compiled grammars kept (an LRU), the
    # longest a request waits for its compile, and how much lower a compile thread's CPU
    # priority is than the step's (nice) once llguidance's GIL-held parse is done, so a long
    # compile leaves running requests most of their CPU.
    grammar_cache_entries: int = 256
    grammar_compile_timeout_s: float = 30.0
    grammar_compile_nice: int = 5

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.policy not in ("priority", "fcfs"):
            raise ValueError(f"policy must be 'priority' or 'fcfs', got {self.policy!r}")
        if self.aging_steps < 1:
            raise ValueError("aging_steps must be >= 1")
        if self.decode_attention not in ("auto", "matmul", "sdpa", "native"):
            raise ValueError(
                "decode_attention must be 'auto', 'matmul', 'sdpa' or 'native', "
                f"got {self.decode_attention!r}"
            )
        if self.native_matmul not in ("auto", "on", "off"):
            raise ValueError(
                f"native_matmul must be 'auto', 'on' or 'off', got {self.native_matmul!r}"
            )
        if self.prefill_attention not in ("auto", "sdpa", "matmul"):
            raise ValueError(
                "prefill_attention must be 'auto', 'sdpa' or 'matmul', "
                f"got {self.prefill_attention!r}"
            )
        if self.tuning not in ("saved", "tune", "off"):
            raise ValueError(f"tuning must be 'saved', 'tune' or 'off', got {self.tuning!r}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be >= 1")
        if self.lora_pool_memory_bytes < 1:
            raise ValueError("lora_pool_memory_bytes must be >= 1")
        if self.max_loras is not None and self.max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {self.max_loras}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < 1:
            raise ValueError(f"max_cpu_loras must be >= 1, got {self.max_cpu_loras}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if (
            self.max_cpu_loras is not None
            and self.max_loras is not None
            and self.max_cpu_loras < self.max_loras
        ):
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})"
            )
        if not 1 <= self.max_lora_rank <= 1024:
            raise ValueError(f"max_lora_rank must be in [1, 1024], got {self.max_lora_rank}")
        if self.lora_modules and not self.enable_lora:
            raise ValueError("lora_modules needs enable_lora")
        if self.grammar_cache_entries < 1:
            raise ValueError(
                f"grammar_cache_entries must be >= 1, got {self.grammar_cache_entries}"
            )
        if self.grammar_compile_timeout_s <= 0:
            raise ValueError("grammar_compile_timeout_s must be > 0")
        if not 0 <= self.grammar_compile_nice <= 19:
            raise ValueError(
                f"grammar_compile_nice must be in [0, 19], got {self.grammar_compile_nice}"
            )
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(
                f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}"
            )

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    def num_lora_slots(self, slot_num_bytes: int) -> int:
        """Adapter slots: as many as lora_pool_memory_bytes holds at `slot_num_bytes` each
        (lora/layers.py's slot_num_bytes), at most max_loras (None: max_num_seqs)."""
        fit = self.lora_pool_memory_bytes // slot_num_bytes
        if fit < 1:
            raise ValueError(
                f"lora_pool_memory_bytes ({self.lora_pool_memory_bytes}) holds no adapter slot "
                f"({slot_num_bytes} bytes at max_lora_rank {self.max_lora_rank})"
            )
        return min(fit, self.max_num_seqs if self.max_loras is None else self.max_loras)

    def num_cpu_loras(self, num_slots: int) -> int:
        """The CPU tier's size for `num_slots` slots: max_cpu_loras, never below the slots."""
        return max(num_slots, self.max_cpu_loras or 0)
