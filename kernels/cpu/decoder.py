"""A step's decoder layers in one native call (kernels/cpu/native/decoder.cpp): decode rows, and
prefill chunks after them (`PrefillStep`).

`NativeDecoder` runs what the eager model runs over the native kernels (the matmul kernel of
kernels/cpu/matmul.py, the fused layer kernels of kernels/cpu/layer.py, decode attention of
kernels/cpu/attention.py), in the same order over the same values, from C instead of Python:
the outputs equal the eager native path's bit for bit. The caller describes the model once
(`DecoderModel`: plain tensors, kept alive here) and each step by its rows' positions, slots,
block tables and context lengths.

The kernels are reached through their libraries' entry points (one build of each), which the
decoder reads from the libraries the caller already loaded.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.cpu.native.build import build, entry_address
from kernels.cpu.prefill import PrefillChunks

SOURCE = Path(__file__).parent / "native" / "decoder.cpp"
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SUFFIX = {torch.bfloat16: "bf16", torch.float32: "f32"}


class _Entries(ctypes.Structure):
    _fields_ = [
        (name, _P)
        for name in (
            "matmul", "matmul_silu", "add_rms_norm", "rope_kv", "paged_decode", "silu_mul",
            "lora_runs", "matmul_spans", "prefill_many",
        )
    ]  # fmt: skip


class _Lora(ctypes.Structure):
    _fields_ = [
        ("a", _P),
        ("in_features", _I),
        ("b_rows", _P),
        ("out_features", _I),
        ("subs", _P),
        ("n", _I),
    ]


class _Linear(ctypes.Structure):
    _fields_ = [("packed", _P), ("bias", _P), ("n", _I), ("k", _I)]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("input_norm", _P),
        ("post_norm", _P),
        ("qkv", _Linear),
        ("o", _Linear),
        ("gate_up", _Linear),
        ("down", _Linear),
        ("k_cache", _P),
        ("v_cache", _P),
        ("lora", _Lora * 4),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        ("entries", _Entries),
        ("layers", ctypes.POINTER(_Layer)),
        ("num_layers", _I),
        ("final_norm", _P),
        ("cos_table", _P),
        ("sin_table", _P),
        ("num_positions", _I),
        ("hidden", _I),
        ("num_heads", _I),
        ("kv_heads", _I),
        ("head_dim", _I),
        ("intermediate", _I),
        ("num_slots", _I),
        ("block_size", _I),
        ("eps", _F),
        ("scale", _F),
        ("element_size", _I),
    ]


class _Step(ctypes.Structure):
    _fields_ = [
        ("rows", _I),
        ("positions", _P),
        ("slots", _P),
        ("tables", _P),
        ("table_stride", _I),
        ("lengths", _P),
        ("residual", _P),
        ("hidden", _P),
        ("normed", _P),
        ("qkv", _P),
        ("attn", _P),
        ("act", _P),
        ("out", _P),
        ("segments", _P),
        ("num_segments", _I),
        ("slot_ranks", _P * 3),
        ("rank", _I),
        ("lora_on", _P),
        ("gate_up_mixed", _P),
        ("gate_up", _P),
        ("decodes", _I),
        ("chunks", _P),
        ("num_chunks", _I),
        ("chunk_slots", _P),
        ("kept", _P),
        ("num_kept", _I),
    ]


# The most sub-projections one adapter wrapper fuses (q, k, v): Step.slot_ranks' length.
MAX_FUSED = 3


@dataclass(frozen=True)
class PackedWeight:
    """A projection in the matmul kernel's layout: y = x W^T + bias, W [n, k]."""

    packed: torch.Tensor
    bias: torch.Tensor | None
    n: int
    k: int


@dataclass(frozen=True)
class LoraStacks:
    """One projection's adapter slot stacks, as lora/layers.py keeps them on the CPU."""

    a: torch.Tensor  # [slots, n * rank, in_features], contiguous
    b_rows: torch.Tensor  # [slots, n * rank, out_features], contiguous
    subs: torch.Tensor  # [2 n] int64: each sub-projection's (offset, width) in the output


@dataclass(frozen=True)
class LoraStep:
    """A step's adapters (kernels/cpu/rows.py's runs kernel takes them as lora_add_cpu
    does): runs of rows of one slot, each slot's rank scaled per fused count, the stacks'
    rank, and which projections of which layer some row's adapter targets."""

    segments: torch.Tensor  # [K, 3] int64 (start, end, slot)
    slot_ranks: tuple[torch.Tensor, ...]  # [n - 1]: [slots] int32, rank times n
    rank: int
    on: torch.Tensor  # [layers, 4] uint8: qkv, o, gate_up, down


@dataclass(frozen=True)
class DecoderLayer:
    input_norm: torch.Tensor  # [hidden]
    post_norm: torch.Tensor  # [hidden]
    qkv: PackedWeight  # [q | k | v] outputs
    o: PackedWeight
    gate_up: PackedWeight  # interleaved for the fused SiLU (kernels.cpu.matmul.interleave_gate_up)
    down: PackedWeight
    k_cache: torch.Tensor  # [kv_heads, num_slots, head_dim], contiguous
    v_cache: torch.Tensor
    # qkv, o, gate_up, down: each projection's adapter stacks, or None (no wrapper)
    lora: tuple[LoraStacks | None, ...] = (None, None, None, None)


@dataclass(frozen=True)
class DecoderModel:
    layers: tuple[DecoderLayer, ...]
    final_norm: torch.Tensor  # [hidden]
    cos_table: torch.Tensor  # [num_positions, head_dim] float32, contiguous
    sin_table: torch.Tensor
    num_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    block_size: int
    eps: float
    scale: float


@dataclass(frozen=True)
class PrefillStep:
    """A step's prefill chunks, after its `decodes` decode rows: their attention by the prefill
    kernel (kernels/cpu/prefill.py's `many`, the chunks as it takes them); `kept`: the rows the
    last layer keeps after attending (engine/models/llama.py's KeptRows), None for every row."""

    decodes: int
    chunks: PrefillChunks
    kept: torch.Tensor | None = None  # [num_kept] int64, increasing

    def check(self, rows: int, num_slots: int) -> None:
        table = self.chunks.table
        if not 0 <= self.decodes <= rows or self.chunks.num_rows > rows:
            raise ValueError(f"{self.decodes} decodes and chunks over {self.chunks.num_rows} "
                             f"rows do not fit a step of {rows}")  # fmt: skip
        if table.dtype is not torch.int64 or not table.is_contiguous():
            raise ValueError("the chunks' table must be contiguous int64")
        if self.chunks.slot_range[0] < 0 or self.chunks.slot_range[1] >= num_slots:
            raise ValueError(f"a chunk's key slot is outside the cache's {num_slots}")
        kept = self.kept
        if kept is not None and (
            kept.dtype is not torch.int64
            or not kept.is_contiguous()
            or kept.dim() != 1
            or (kept.numel() and (int(kept[0]) < 0 or int(kept[-1]) >= rows))
            or (kept.numel() > 1 and not bool((kept[1:] > kept[:-1]).all()))
        ):
            raise ValueError(f"kept must be increasing contiguous int64 rows of the {rows}")


class NativeDecoder:
    """One model's decoder layers over the native kernels; `forward` runs a step."""

    def __init__(
        self,
        library: Path,
        model: DecoderModel,
        *,
        matmul_library: Path,
        layer_library: Path,
        attention_library: Path,
        rows_library: Path | None = None,
        prefill_library: Path | None = None,
    ):
        """`rows_library`: the LoRA runs kernel's (kernels/cpu/rows.py), for adapter steps;
        None: `forward` takes none. `prefill_library`: the prefill attention's
        (kernels/cpu/prefill.py), for steps with prefill chunks; None: `forward` takes none."""
        self.model = model  # keeps every tensor the C side points at alive
        self.dtype = model.final_norm.dtype
        if self.dtype not in _SUFFIX:
            raise ValueError(f"the native decoder runs bf16 or float32, not {self.dtype}")
        suffix = _SUFFIX[self.dtype]
        entries = _Entries(
            entry_address(matmul_library, f"matmul_{suffix}"),
            entry_address(matmul_library, f"matmul_silu_{suffix}"),
            entry_address(layer_library, f"add_rms_norm_{suffix}"),
            entry_address(layer_library, f"rope_kv_{suffix}"),
            entry_address(attention_library, f"paged_decode_{suffix}"),
            entry_address(layer_library, f"silu_mul_{suffix}"),
            None if rows_library is None else entry_address(rows_library, "lora_runs_bf16"),
            # in adapter steps the matmuls ask for the stacks the LoRA runs read next
            # (kernels/cpu/native/decoder.cpp); bf16 only: the float32 path asks for nothing
            entry_address(matmul_library, "matmul_spans_bf16") if suffix == "bf16" else None,
            None
            if prefill_library is None
            else entry_address(prefill_library, f"prefill_attention_many_{suffix}"),
        )
        self.takes_lora = rows_library is not None
        self.takes_prefill = prefill_library is not None
        self.prefetches_stacks = bool(entries.matmul_spans)  # adapter steps ask ahead
        self._layers = (_Layer * len(model.layers))(*(self._layer(layer) for layer in model.layers))
        first = model.layers[0]
        self.hidden = first.input_norm.shape[0]
        self.qkv_width = first.qkv.n
        self._model = _Model(
            entries,
            self._layers,
            len(model.layers),
            model.final_norm.data_ptr(),
            model.cos_table.data_ptr(),
            model.sin_table.data_ptr(),
            model.cos_table.shape[0],
            self.hidden,
            model.num_heads,
            model.kv_heads,
            model.head_dim,
            model.intermediate,
            first.k_cache.shape[1],
            model.block_size,
            model.eps,
            model.scale,
            torch.tensor([], dtype=self.dtype).element_size(),
        )
        lib = ctypes.CDLL(str(library))
        self._forward = lib.decoder_forward
        self._forward.argtypes = [ctypes.POINTER(_Model), ctypes.POINTER(_Step), _I]
        self._forward.restype = _I

    @staticmethod
    def _layer(layer: DecoderLayer) -> _Layer:
        def linear(w: PackedWeight) -> _Linear:
            return _Linear(w.packed.data_ptr(), None if w.bias is None else w.bias.data_ptr(), w.n, w.k)  # fmt: skip

        def lora(stacks: LoraStacks | None) -> _Lora:
            if stacks is None:
                return _Lora()
            return _Lora(
                stacks.a.data_ptr(),
                stacks.a.shape[2],
                stacks.b_rows.data_ptr(),
                stacks.b_rows.shape[2],
                stacks.subs.data_ptr(),
                stacks.subs.numel() // 2,
            )

        return _Layer(
            layer.input_norm.data_ptr(),
            layer.post_norm.data_ptr(),
            linear(layer.qkv),
            linear(layer.o),
            linear(layer.gate_up),
            linear(layer.down),
            layer.k_cache.data_ptr(),
            layer.v_cache.data_ptr(),
            (_Lora * 4)(*(lora(stacks) for stacks in layer.lora)),
        )

    def forward(
        self,
        embeddings: torch.Tensor,  # [rows, hidden]: the rows' token embeddings (overwritten)
        positions: torch.Tensor,  # [rows] int64
        slots: torch.Tensor,  # [rows] int64: where each row's K/V goes
        tables: torch.Tensor,  # [rows, max_blocks] int64 block tables
        lengths: torch.Tensor,  # [decodes] int64 context lengths, this token included
        lora: LoraStep | None = None,
        prefill: PrefillStep | None = None,
    ) -> torch.Tensor:  # [rows, hidden] after the final norm; [kept rows, hidden] with prefill.kept
        """A decode step; with `prefill`, a step whose rows after its decode rows are prefill
        chunks (`tables` and `lengths` then cover the decode rows alone)."""
        rows = embeddings.shape[0]
        if lora is not None and not self.takes_lora:
            raise ValueError("this decoder was built without the LoRA runs kernel")
        if prefill is not None and (lora is not None or not self.takes_prefill):
            raise ValueError("prefill chunks run here without adapters, where built for them")
        m = self.model
        decodes = rows if prefill is None else prefill.decodes
        for name, t, n in (("positions", positions, rows), ("slots", slots, rows),
                           ("lengths", lengths, decodes)):  # fmt: skip
            if t.dtype is not torch.int64 or not t.is_contiguous() or t.shape != (n,):
                raise ValueError(f"{name} must be contiguous int64 [{n}]")
        if tables.dtype is not torch.int64 or tables.dim() != 2 or tables.shape[0] != decodes:
            raise ValueError(f"tables must be int64 [{decodes}, max_blocks]")
        if tables.stride(1) != 1:
            tables = tables.contiguous()
        if not embeddings.is_contiguous() or embeddings.dtype is not self.dtype:
            raise ValueError(f"embeddings must be contiguous {self.dtype} [{rows}, {self.hidden}]")

        def buffer(width: int) -> torch.Tensor:
            return torch.empty(rows, width, dtype=self.dtype)

        hidden, normed, out = buffer(self.hidden), buffer(self.hidden), buffer(self.hidden)
        qkv, attn = buffer(self.qkv_width), buffer(m.num_heads * m.head_dim)
        act = buffer(m.intermediate)
        step = _Step(
            rows,
            positions.data_ptr(),
            slots.data_ptr(),
            tables.data_ptr(),
            tables.stride(0),
            lengths.data_ptr(),
            embeddings.data_ptr(),
            hidden.data_ptr(),
            normed.data_ptr(),
            qkv.data_ptr(),
            attn.data_ptr(),
            act.data_ptr(),
            out.data_ptr(),
        )
        if lora is not None:
            if lora.on.shape != (len(m.layers), 4) or lora.on.dtype is not torch.uint8:
                raise ValueError(f"lora.on must be uint8 [{len(m.layers)}, 4]")
            mixed, gate_up = buffer(2 * m.intermediate), buffer(2 * m.intermediate)
            ranks = [r.data_ptr() for r in lora.slot_ranks[:MAX_FUSED]]
            step.segments = lora.segments.data_ptr()
            step.num_segments = lora.segments.shape[0]
            step.slot_ranks = (_P * MAX_FUSED)(*ranks, *[None] * (MAX_FUSED - len(ranks)))
            step.rank = lora.rank
            step.lora_on = lora.on.data_ptr()
            step.gate_up_mixed, step.gate_up = mixed.data_ptr(), gate_up.data_ptr()
        if prefill is not None:
            prefill.check(rows, self.model.layers[0].k_cache.shape[1])
            step.decodes = decodes
            step.chunks = prefill.chunks.table.data_ptr()
            step.num_chunks = prefill.chunks.table.shape[0]
            step.chunk_slots = prefill.chunks.slots.data_ptr()
            if prefill.kept is not None:
                step.kept, step.num_kept = prefill.kept.data_ptr(), prefill.kept.shape[0]
        bad = self._forward(ctypes.byref(self._model), ctypes.byref(step), torch.get_num_threads())
        if bad:
            raise IndexError(
                f"native decoder: {bad} rows with a position or cache slot out of range"
            )
        if prefill is not None and prefill.kept is not None:
            return out[: prefill.kept.shape[0]]
        return out


@functools.cache
def decoder_library() -> Path:
    """The decoder's library, built on first call (kernels.cpu.native.build.NativeBuildError where it
    cannot be)."""
    return build(source=SOURCE)
