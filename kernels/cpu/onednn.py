"""What PyTorch's oneDNN offers on this CPU.

Where it has no bf16 kernels (an AVX2 CPU: no AVX512-BF16, no AMX), a bf16 matmul falls back to
a loop several times slower than float32's (~18 against ~130 GFLOP/s on a 2-core AVX2 EPYC):
the engine then packs no bf16 weights for oneDNN (engine/step/packed_linear.py), the CPU LoRA path's
long runs multiply in float32 (kernels/cpu/reference.py), and the benchmarks take float32's matmul
peak as the machine's (bench/engine_throughput.py).
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def has_bf16() -> bool:
    """Whether PyTorch's bf16 matmuls run on oneDNN's bf16 kernels here."""
    return bool(
        torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )
