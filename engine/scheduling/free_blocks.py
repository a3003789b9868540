"""The pool of free KV blocks (engine/scheduling/block_manager.py), and which free block a sequence gets.

Two kinds of free block:

- uncached: holds no findable prefix, so it is worth nothing. Given out first, by address: the
  block right after the sequence's last one where that is free, else the lowest free block.
- cached: its prefix is still findable by its key. Given out only when no uncached block is
  left, least recently freed first (a sequence frees its tail blocks first, so a prefix chain
  loses its tail before its head).

Why by address: decode attention reads each sequence's blocks in turn, and on a 2-core AMX
Xeon it read them at 12-14 GB/s where they lay at random against 18-22 GB/s where a sequence's
blocks, or consecutive sequences' blocks, lay side by side (bench/history/RESULTS-2026-11.md, session 20). The
least-recently-freed queue alone kept the order a fresh pool starts with (ascending ids) only
until sequences began to finish: rerunning the mixed-lengths workload on one engine (prefix
caching off) left 61% -> 22% -> 8% of a decode table's neighbouring blocks adjacent, and
throughput fell ~6% by the third run; given out by address, 65% each run and no fall. Only
uncached blocks are placed this way: with prefix caching on, a finished sequence's full blocks
stay cached and come back in the queue's order (taking one out of turn would cut its prefix
chain early); keeping those side by side too is left open.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict


class FreeBlocks:
    def __init__(self, num_blocks: int):
        self._uncached: set[int] = set(range(num_blocks))
        # The uncached ids, lowest first; entries taken another way (take, the block after a
        # sequence's last) stay until popped and are skipped then (not in _uncached).
        self._heap: list[int] = list(range(num_blocks))
        self._cached: OrderedDict[int, None] = OrderedDict()  # front: freed longest ago

    def __len__(self) -> int:
        return len(self._uncached) + len(self._cached)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._uncached or block_id in self._cached

    def put(self, block_id: int, *, cached: bool) -> None:
        """A block whose last reference went away; `cached`: its prefix is still findable."""
        if cached:
            self._cached[block_id] = None
        else:
            self._uncached.add(block_id)
            heapq.heappush(self._heap, block_id)
            if len(self._heap) > 2 * len(self._uncached) + 64:  # stale entries: rebuild
                self._heap = sorted(self._uncached)

    def take(self, block_id: int) -> None:
        """Take this free block (a prefix hit on a cached one)."""
        if block_id in self._cached:
            del self._cached[block_id]
        else:
            self._uncached.remove(block_id)

    def take_next(self, after: int | None) -> tuple[int, bool]:
        """A block for a sequence whose last block is `after` (None: it has none), and whether
        it came from the cached kind (the caller drops its prefix entry). Raises IndexError
        where none is free."""
        if self._uncached:
            if after is not None and after + 1 in self._uncached:
                self._uncached.remove(after + 1)
                return after + 1, False
            while True:
                block_id = heapq.heappop(self._heap)
                if block_id in self._uncached:
                    self._uncached.remove(block_id)
                    return block_id, False
        if not self._cached:
            raise IndexError("no free KV block")
        block_id, _ = self._cached.popitem(last=False)
        return block_id, True

    def forget_prefixes(self) -> list[int]:
        """Every cached free block becomes uncached (the prefix cache was reset); returns them."""
        ids = list(self._cached)
        self._cached.clear()
        for block_id in ids:
            self.put(block_id, cached=False)
        return ids
