"""Tensors backed by transparent huge pages (2 MiB) where Linux offers them on request.

Why: the engine's big CPU buffers are read in ways that 4 KiB pages serve badly. Decode
attention reads the paged KV cache in 2 KiB blocks scattered over hundreds of MiB: nearly every
block is a page of its own, a TLB miss and a page walk, and the CPU's prefetchers stop at page
boundaries. With 2 MiB pages a step's whole cache is a few hundred TLB entries. Most kernels set
`transparent_hugepage` to `madvise`, so a region gets huge pages only when asked (madvise
MADV_HUGEPAGE) before it is first touched. `empty` maps fresh memory for that: memory from
malloc may be heap memory touched before (glibc serves allocations below its moving mmap
threshold, up to 32 MiB, from the heap). Elsewhere (no MADV_HUGEPAGE, small buffers) it is
torch.empty.
"""

from __future__ import annotations

import contextlib
import mmap

import torch

HUGE_PAGE = 2 << 20
# Below this a buffer is not worth its own mapping.
_MIN_BYTES = HUGE_PAGE


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.empty(shape, dtype) on the CPU, on huge pages where the system grants them (the
    tensor keeps its mapping alive; it is unmapped when the last view goes)."""
    numel = 1
    for size in shape:
        numel *= size
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or nbytes < _MIN_BYTES:
        return torch.empty(shape, dtype=dtype)
    # private: a shared anonymous mapping is shmem, whose huge pages are a separate setting
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(region, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE  # the first 2 MiB boundary
    with contextlib.suppress(OSError):  # refused (THP off): small pages, the same memory
        region.madvise(advice, start, len(region) - start)
    return raw[start : start + nbytes].view(dtype).view(shape)
