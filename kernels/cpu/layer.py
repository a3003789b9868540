"""A decoder layer's element-wise work fused into single calls (kernels/cpu/native/layer.cpp): RMSNorm
with the residual add before it, RoPE with the K/V cache write after it, SiLU times up; and
the causal softmax between a prefill chunk's two attention matmuls (engine/step/attention.py).

`NativeLayer` computes what the eager PyTorch operators in engine/models/ compute (the .cpp file
states each), for bfloat16 and float32 CPU tensors whose rows are contiguous; `supports` says
whether a call qualifies, and engine/models/layer_ops.py keeps the operators for every other
call and whenever torch.compile traces the model (inductor fuses those itself).

OpenMP: as for kernels/cpu/rows.py's kernel, the library's threads are PyTorch's; each call is
told `torch.get_num_threads()` and spreads rows only when there are enough of them.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch

from kernels.cpu.native.build import build

SOURCE = Path(__file__).parent / "native" / "layer.cpp"
# PyTorch rounds a product before the add that follows it; a contracted FMA would not.
EXTRA_FLAGS = ("-ffp-contract=off",)
_SUFFIX = {torch.bfloat16: "bf16", torch.float32: "f32"}
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    "add_rms_norm": ([_P, _I, _P, _I, _I, _P, _P, _I, _I, _I, _F, _I], None),
    "rope_kv": ([_P, _I, _P, _I, _P, _I, _P, _P, _P, _I, _I, _I, _I, _I, _P, _P, _I, _P, _I], _I),
    "silu_mul": ([_P, _I, _P, _I, _I, _I, _I], None),
    "causal_softmax": ([_P, _I, _I, _I, _I, _F, _I], None),
    "argmax_rows": ([_P, _I, _I, _I, _P, _I], None),
}


def _rows_ok(t: torch.Tensor) -> bool:
    """2-D (tokens by features) with unit stride inside a row."""
    return t.dim() == 2 and t.stride(1) == 1


class NativeLayer:
    def __init__(self, library: Path):
        lib = ctypes.CDLL(str(library))
        self._entries: dict[tuple[str, torch.dtype], Any] = {}
        for name, (argtypes, restype) in _SIGNATURES.items():
            for dtype, suffix in _SUFFIX.items():
                entry = getattr(lib, f"{name}_{suffix}")
                entry.argtypes = argtypes
                entry.restype = restype
                self._entries[name, dtype] = entry
        self.library = library

    def supports(self, *tensors: torch.Tensor) -> bool:
        """One dtype the kernels have, all on the CPU."""
        dtype = tensors[0].dtype
        return dtype in _SUFFIX and all(
            t.dtype == dtype and t.device.type == "cpu" for t in tensors
        )

    def add_rms_norm(
        self,
        x: torch.Tensor,  # [tokens, dim]
        residual: torch.Tensor | None,  # [tokens, dim]: residual += x first, in place
        weight: torch.Tensor,  # [dim], contiguous
        eps: float,
    ) -> torch.Tensor:  # [tokens, dim]: the normalised sum (or x), times weight
        rows, dim = x.shape
        if not (_rows_ok(x) and weight.is_contiguous() and weight.shape == (dim,)):
            raise ValueError("add_rms_norm needs rows with unit stride and a [dim] weight")
        if residual is not None and (not _rows_ok(residual) or residual.shape != x.shape):
            raise ValueError("add_rms_norm needs the residual shaped as x, unit stride in a row")
        out = torch.empty(rows, dim, dtype=x.dtype)
        target = residual if residual is not None else x
        self._entries["add_rms_norm", x.dtype](
            x.data_ptr(),
            x.stride(0),
            target.data_ptr(),
            target.stride(0),
            int(residual is not None),
            weight.data_ptr(),
            out.data_ptr(),
            out.stride(0),
            rows,
            dim,
            eps,
            torch.get_num_threads(),
        )
        return out

    def rope_kv(
        self,
        q: torch.Tensor,  # [tokens, num_heads, head_dim]: rotated in place
        k: torch.Tensor,  # [tokens, kv_heads, head_dim]: rotated in place
        v: torch.Tensor,  # [tokens, kv_heads, head_dim]
        cos_table: torch.Tensor,  # [max_positions, head_dim] float32, contiguous
        sin_table: torch.Tensor,
        positions: torch.Tensor,  # [tokens] int64
        k_cache: torch.Tensor,  # [kv_heads, num_slots, head_dim], contiguous
        v_cache: torch.Tensor,
        slots: torch.Tensor,  # [tokens] int64: where each token's K/V goes
    ) -> None:
        tokens, num_heads, head_dim = q.shape
        kv_heads, num_slots, _ = k_cache.shape
        for t in (q, k, v):  # heads side by side within a token, unit stride within a head
            if t.stride(2) != 1 or t.stride(1) != head_dim:
                raise ValueError("rope_kv needs each token's heads side by side")
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            raise ValueError("rope_kv needs contiguous caches")
        if cos_table.dtype != torch.float32 or not cos_table.is_contiguous():
            raise ValueError("rope_kv needs contiguous float32 cos/sin tables")
        positions = positions.to(torch.int64).contiguous()
        slots = slots.to(torch.int64).contiguous()
        bad = self._entries["rope_kv", q.dtype](
            q.data_ptr(),
            q.stride(0),
            k.data_ptr(),
            k.stride(0),
            v.data_ptr(),
            v.stride(0),
            cos_table.data_ptr(),
            sin_table.data_ptr(),
            positions.data_ptr(),
            cos_table.shape[0],
            tokens,
            num_heads,
            kv_heads,
            head_dim,
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            num_slots,
            slots.data_ptr(),
            torch.get_num_threads(),
        )
        if bad:
            raise IndexError(f"rope_kv: {bad} tokens with a position or cache slot out of range")

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[tokens, 2 * width] (gate, then up) -> [tokens, width]."""
        if not _rows_ok(gate_up) or gate_up.shape[1] % 2:
            raise ValueError("silu_mul needs [tokens, 2 * width] rows with unit stride")
        rows, width = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty(rows, width, dtype=gate_up.dtype)
        self._entries["silu_mul", gate_up.dtype](
            gate_up.data_ptr(),
            gate_up.stride(0),
            out.data_ptr(),
            out.stride(0),
            rows,
            width,
            torch.get_num_threads(),
        )
        return out

    def causal_softmax(
        self, scores: torch.Tensor, *, query_len: int, offset: int, scale: float
    ) -> None:
        """In place over [rows, keys] contiguous scores of a prefill chunk: rows are query heads
        by the chunk's `query_len` queries, query t of each head seeing keys 0 .. offset + t
        (offset: tokens cached before the chunk); probabilities rounded to the dtype, 0 beyond."""
        if scores.dim() != 2 or not scores.is_contiguous() or scores.shape[0] % query_len:
            raise ValueError("causal_softmax needs contiguous [heads * query_len, keys] scores")
        if offset + query_len > scores.shape[1]:
            raise ValueError("causal_softmax: the chunk's last query sees past the keys")
        self._entries["causal_softmax", scores.dtype](
            scores.data_ptr(),
            scores.shape[0],
            scores.shape[1],
            query_len,
            offset,
            scale,
            torch.get_num_threads(),
        )

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        """`x.argmax(dim=-1)` of [rows, cols] logits (ties: the first; a NaN wins), int64,
        without torch's float32 copy of bf16 logits."""
        if not _rows_ok(x) or not self.supports(x):
            raise ValueError(f"argmax needs [rows, cols] CPU rows with unit stride, got {x.dtype}")
        out = torch.empty(x.shape[0], dtype=torch.int64)
        self._entries["argmax_rows", x.dtype](
            x.data_ptr(),
            x.stride(0),
            x.shape[0],
            x.shape[1],
            out.data_ptr(),
            torch.get_num_threads(),
        )
        return out


@functools.cache
def native_layer() -> NativeLayer:
    """The kernels, built on first call. Raises kernels.cpu.native.build.NativeBuildError where they
    cannot be built; not cached then."""
    return NativeLayer(build(source=SOURCE, extra_flags=EXTRA_FLAGS))
