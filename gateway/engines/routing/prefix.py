"""Prefix keys: what the gateway can tell, before it sends a request, about the KV blocks an
engine may already hold for it.

The engine keys each full KV block by a hash chained from its parent's, the first block salted
with the tenant's cache salt and every block carrying the adapter
(engine/scheduling/block_manager.py). The gateway builds keys of the same shape: key 0 over
(salt, model, block 0's token ids), key i over (key i-1, block i's token ids). Two requests
share key k exactly when they share the salt, the model and the first k + 1 blocks of tokens,
which is when an engine that served one could serve the other's first k + 1 blocks from cache
(block_size: the engines', LORAGATE_ENGINE__BLOCK_SIZE).

These keys only choose a replica; the engine's own SHA-256 keys decide what is shared. So a
fast non-cryptographic hash will do: Python's hash of a tuple of ints, which (unlike str hashes)
is the same in every process, so every gateway process derives the same keys. A collision, even
a crafted one, can only send a request to another replica.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

# Keys for at most this many leading blocks (2,048 tokens at block size 16): hashing costs
# about a microsecond a block on the request path, and a conversation is told apart from
# others by its head long before that.
MAX_PREFIX_BLOCKS = 128


@dataclass(frozen=True)
class PrefixKeys:
    """The chained keys of a prompt's leading full blocks (keys[i] covers blocks 0..i)."""

    keys: tuple[int, ...]
    anchor: int  # the first block's key, or (salt, model) alone for a prompt under one block
    block_size: int
    num_prompt_tokens: int

    def num_cacheable_tokens(self, num_blocks: int) -> int:
        """Prompt tokens an engine can take from cache when it holds `num_blocks` of these
        blocks (never the last token: it is computed again to sample from)."""
        num_full = (self.num_prompt_tokens - 1) // self.block_size
        return min(num_blocks, num_full) * self.block_size


def seed(cache_salt: str | None, model: str | None) -> int:
    """The chain's start: the salt and the model (a stable digest; str hashes vary by process)."""
    text = f"{cache_salt or ''}\x00{model or ''}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def prefix_keys(
    token_ids: list[int],
    *,
    cache_salt: str | None,
    model: str | None,
    block_size: int,
    max_blocks: int = MAX_PREFIX_BLOCKS,
) -> PrefixKeys:
    key = seed(cache_salt, model)
    num_tokens = min(len(token_ids) // block_size, max_blocks) * block_size
    keys = []
    for start in range(0, num_tokens, block_size):
        key = hash((key, *token_ids[start : start + block_size]))
        keys.append(key)
    return PrefixKeys(
        keys=tuple(keys),
        anchor=keys[0] if keys else key,
        block_size=block_size,
        num_prompt_tokens=len(token_ids),
    )
