"""kernels/cpu/huge_pages.py: tensors on transparent huge pages where the system grants them, and
plain tensors everywhere else; either way the tensor torch.empty would give."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from kernels.cpu import huge_pages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _huge_kib_at(address: int) -> int:
    """AnonHugePages of the mapping holding `address` (/proc/self/smaps)."""
    mapping = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            mapping = int(head[1], 16) <= address < int(head[2], 16)
        elif mapping and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


def test_a_large_buffer_is_aligned_and_on_huge_pages_where_the_system_grants_them() -> None:
    t = huge_pages.empty((3, 1_000_000, 4), torch.bfloat16)
    assert t.shape == (3, 1_000_000, 4) and t.dtype is torch.bfloat16 and t.is_contiguous()
    assert t.data_ptr() % huge_pages.HUGE_PAGE == 0
    t.fill_(1.5)  # writable, and the first touch is when the pages are chosen
    assert bool((t == 1.5).all())
    mode = THP.read_text() if THP.exists() else "[never]"
    print(f"transparent_hugepage: {mode.strip()}")
    huge_kib = _huge_kib_at(t.data_ptr())
    if "[never]" in mode:
        assert huge_kib == 0
    else:  # madvise or always: most of the 24 MB (a busy, fragmented machine may grant fewer)
        assert huge_kib >= 4 * 1024, huge_kib


def test_small_buffers_are_plain_tensors_and_views_keep_the_mapping() -> None:
    small = huge_pages.empty((100, 8), torch.float32)
    assert small.shape == (100, 8) and small.dtype is torch.float32
    big = huge_pages.empty((5 << 20,), torch.float32)
    view = big[10:20]
    del big
    view.fill_(3.0)  # the mapping lives as long as a view of it
    assert view.sum().item() == 30.0
