"""Paged KV block accounting with reference counts and hash-chained prefix caching.

A full block's key is SHA-256 over (parent key, the block's token ids, typed extras): the
first block carries ("salt", cache_salt) and every block carries ("adapter", adapter_id), so
two tenants or two adapters never share a block. Blocks whose last reference goes away stay
findable by their key until the allocator reuses them (least recently freed first, after every
free block that holds no prefix: engine/scheduling/free_blocks.py, which also keeps a sequence's blocks
side by side where it can).

Invariant (check_invariants): every block is either free (ref_count 0, in the free pool) or
used (ref_count == the number of block tables that hold it); free + used == total.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from engine.scheduling.free_blocks import FreeBlocks
from engine.scheduling.sequence import Sequence


def block_key(
    parent: bytes | None,
    token_ids: list[int],
    *,
    cache_salt: str | None,
    adapter_id: int | None,
) -> bytes:
    extras: list[list[object]] = []
    if parent is None and cache_salt is not None:
        extras.append(["salt", cache_salt])
    if adapter_id is not None:
        extras.append(["adapter", adapter_id])
    payload = json.dumps([token_ids, extras], separators=(",", ":")).encode()
    return hashlib.sha256((parent or b"") + payload).digest()


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    key: bytes | None = None


@dataclass(frozen=True)
class PrefixHit:
    block_ids: list[int]
    keys: list[bytes]

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # A cached block that is free stays findable until reused or hit again.
        self._free = FreeBlocks(num_blocks)
        self._cached: dict[bytes, int] = {}
        self.num_prefix_queries = 0  # tokens looked up
        self.num_prefix_hits = 0  # tokens found

    # -- queries -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def find_prefix(self, seq: Sequence) -> PrefixHit:
        """Cached full blocks at the start of seq's tokens (never all of them: the last token
        is always recomputed so the forward pass has a position to sample from)."""
        if not self.enable_prefix_caching:
            return PrefixHit([], [])
        max_blocks = (seq.num_tokens - 1) // self.block_size
        ids: list[int] = []
        keys: list[bytes] = []
        parent: bytes | None = None
        for i in range(max_blocks):
            key = self._key(seq, parent, i)
            block_id = self._cached.get(key)
            if block_id is None:
                break
            ids.append(block_id)
            keys.append(key)
            parent = key
        return PrefixHit(ids, keys)

    def can_allocate(
        self, seq: Sequence, num_new_tokens: int, hit: PrefixHit | None = None
    ) -> bool:
        return self._num_needed(seq, num_new_tokens, hit) <= len(self._free)

    # -- mutations -----------------------------------------------------------------------

    def allocate(self, seq: Sequence, num_new_tokens: int, hit: PrefixHit | None = None) -> None:
        """Give seq blocks for its next num_new_tokens (after taking the prefix hit, if any)."""
        if not self.can_allocate(seq, num_new_tokens, hit):
            raise RuntimeError("allocate() without can_allocate(): out of KV blocks")
        if hit is not None and hit.num_blocks:
            assert not seq.block_table, "a prefix hit applies to a sequence with no blocks"
            for block_id in hit.block_ids:
                block = self.blocks[block_id]
                if block.ref_count == 0:
                    self._free.take(block_id)
                block.ref_count += 1
                seq.block_table.append(block_id)
            seq.block_hashes = list(hit.keys)
            seq.num_computed_tokens = hit.num_blocks * self.block_size
        self._append_blocks(seq, self.num_blocks_for(seq.num_computed_tokens + num_new_tokens))

    def grow(self, seq: Sequence, num_new_tokens: int) -> bool:
        """allocate() for a sequence already running (no prefix hit) if the free blocks suffice;
        False, taking nothing, if not. One call per running sequence per step, and most of
        them (decodes inside their last block) need no block: that case returns at once."""
        needed = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        missing = needed - len(seq.block_table)
        if missing <= 0:
            return True
        if missing > len(self._free):
            return False
        self._append_blocks(seq, needed)
        return True

    def _append_blocks(self, seq: Sequence, needed: int) -> None:
        while len(seq.block_table) < needed:
            block_id, _ = self._free.take_next(seq.block_table[-1] if seq.block_table else None)
            block = self.blocks[block_id]
            if block.key is not None:
                # Reusing a cached-but-free block evicts its prefix entry.
                if self._cached.get(block.key) == block_id:
                    del self._cached[block.key]
                block.key = None
            block.ref_count = 1
            seq.block_table.append(block_id)

    def record_prefix_lookup(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        self.num_prefix_queries += num_query_tokens
        self.num_prefix_hits += num_hit_tokens

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register seq's newly completed blocks (those fully computed) in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        while len(seq.block_hashes) < num_full:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            key = self._key(seq, parent, i)
            seq.block_hashes.append(key)
            block = self.blocks[seq.block_table[i]]
            if block.key is None and key not in self._cached:
                block.key = key
                self._cached[key] = block.block_id

    def free(self, seq: Sequence) -> None:
        # Tail blocks first, so that a prefix's later blocks are evicted before its head.
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                # uncached blocks are worthless: the pool reuses them before any cached one
                self._free.put(block_id, cached=block.key is not None)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def reset_prefix_cache(self) -> None:
        for block_id in self._free.forget_prefixes():
            block = self.blocks[block_id]
            if block.key is not None:
                self._cached.pop(block.key, None)
                block.key = None

    # -- helpers -------------------------------------------------------------------------

    def _key(self, seq: Sequence, parent: bytes | None, block_index: int) -> bytes:
        start = block_index * self.block_size
        return block_key(
            parent,
            seq.token_ids[start : start + self.block_size],
            cache_salt=seq.request.cache_salt,
            adapter_id=seq.adapter_id,
        )

    def _num_needed(self, seq: Sequence, num_new_tokens: int, hit: PrefixHit | None) -> int:
        num_computed = seq.num_computed_tokens
        held = len(seq.block_table)
        reclaimed = 0
        if hit is not None and hit.num_blocks:
            num_computed = hit.num_blocks * self.block_size
            held = hit.num_blocks
            # Hit blocks that are currently free leave the free pool when taken.
            reclaimed = sum(1 for b in hit.block_ids if self.blocks[b].ref_count == 0)
        return max(0, self.num_blocks_for(num_computed + num_new_tokens) - held) + reclaimed

    def check_invariants(self, live: list[Sequence]) -> None:
        refs = [0] * self.num_blocks
        for seq in live:
            for block_id in seq.block_table:
                refs[block_id] += 1
        for block in self.blocks:
            assert block.ref_count == refs[block.block_id], (
                f"block {block.block_id}: ref_count {block.ref_count} != {refs[block.block_id]} references"
            )
            is_free = block.block_id in self._free
            assert is_free == (block.ref_count == 0), f"block {block.block_id} free-list mismatch"
        num_used = sum(1 for b in self.blocks if b.ref_count > 0)
        assert num_used + len(self._free) == self.num_blocks, "free + used != total"
        for key, block_id in self._cached.items():
            assert self.blocks[block_id].key == key, "prefix index points at a reused block"
