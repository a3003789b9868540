"""The element-wise steps of a decoder layer, each one call: PyTorch operators (the reference, and
what torch.compile traces) or, where the engine turned them on, the fused CPU kernels of
kernels/cpu/layer.py, which compute the same values in one call instead of ~30 operators a layer
(their dispatch is most of a small decode step's time outside the matmuls).

One LayerOps is shared by every module of a model; `LlamaForCausalLM.use_layer_ops` installs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.rope import RotaryEmbedding, apply_rotary
from kernels.cpu.layer import NativeLayer


@dataclass
class RotaryInputs:
    """One forward pass's positions and their cos/sin (gathered once, on first use)."""

    table: RotaryEmbedding
    positions: torch.Tensor  # [num_tokens] long
    dtype: torch.dtype
    _cos_sin: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    def cos_sin(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._cos_sin is None:
            self._cos_sin = self.table.lookup(self.positions, self.dtype)
        return self._cos_sin


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalise in float32 and cast back before the weight, as transformers does; the fused
    # op is ~20x faster on CPU than the pow/mean/rsqrt chain and gives the same values.
    normed = F.rms_norm(x.to(torch.float32), (x.shape[-1],), eps=eps)
    return weight * normed.to(x.dtype)


class LayerOps:
    """`native`: the fused kernels, or None for PyTorch operators everywhere."""

    def __init__(self, native: NativeLayer | None = None):
        self.native = native

    def _fused(self, *tensors: torch.Tensor) -> NativeLayer | None:
        # Under torch.compile the operators are traced and inductor fuses them itself.
        if self.native is None or torch.compiler.is_compiling():
            return None
        return self.native if self.native.supports(*tensors) else None

    def rms_norm(
        self,
        x: torch.Tensor,  # [num_tokens, dim]
        weight: torch.Tensor,
        eps: float,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """RMSNorm(x) * weight; with `residual`, first `residual += x` (in place) and normalise
        the sum: the residual stream's add fused with the norm that follows it."""
        native = self._fused(x, weight) if x.dim() == 2 else None
        if native is not None and (residual is None or residual.dtype == x.dtype):
            return native.add_rms_norm(x, residual, weight, eps)
        if residual is not None:
            x = residual.add_(x)
        return rms_norm_reference(x, weight, eps)

    def rope_and_cache(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, kv_heads, head_dim]
        v: torch.Tensor,
        rotary: RotaryInputs,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        slot_mapping: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k rotated, and k, v written to the paged cache at slot_mapping."""
        k_cache, v_cache = kv_cache
        native = self._fused(q, k, v, k_cache, v_cache)
        if native is not None:
            table = rotary.table
            native.rope_kv(
                q, k, v, table.cos, table.sin, rotary.positions, k_cache, v_cache, slot_mapping
            )
            return q, k
        q, k = apply_rotary(q, k, rotary.cos_sin())
        k_cache.index_copy_(1, slot_mapping, k.transpose(0, 1))
        v_cache.index_copy_(1, slot_mapping, v.transpose(0, 1))
        return q, k

    def gate_up_silu(self, proj: nn.Module, x: torch.Tensor, width: int) -> torch.Tensor:
        """silu(gate) * up of the fused projection `proj` of x: in one pass where `proj` offers
        it (`silu_forward`: the native matmul kernel, engine/step/packed_linear.py), else the
        projection and then `silu_mul`. Both round alike."""
        fused = getattr(proj, "silu_forward", None)
        if fused is not None and not torch.compiler.is_compiling():
            out: torch.Tensor | None = fused(x)
            if out is not None:
                return out
        return self.silu_mul(proj(x), width)

    def silu_mul(self, gate_up: torch.Tensor, width: int) -> torch.Tensor:
        """[num_tokens, 2 * width] (gate, up) -> silu(gate) * up."""
        native = self._fused(gate_up)
        if native is not None and gate_up.dim() == 2 and gate_up.stride(1) == 1:
            return native.silu_mul(gate_up)
        gate, up = gate_up.split(width, dim=-1)
        return F.silu(gate) * up
