"""Where each prompt prefix was last served: a bounded LRU map, prefix key -> replica index.

A request records every one of its prefix keys (prefix.py) against the replica that took it;
the next request looks its own keys up from the longest down, and the first one found names
the replica holding the most of its blocks and how many. A tenant's next turn (the last turn
with the answer and a new message appended) finds the whole previous prompt there.

Bounded by entries, least recently used first out: a forgotten prefix costs one request routed
by its home replica instead (policy.py), never a wrong answer. Invariant (check_invariants): at
most `max_entries` entries.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

# 100,000 keys hold e.g. 780 conversations of 2,048 tokens at block size 16; an entry costs
# about 100 bytes, so 10 MB per gateway process.
MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class Match:
    replica: int  # the replica's index
    num_blocks: int  # leading blocks of the prompt that it served last


class PrefixMap:
    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.max_entries = max_entries
        self._where: OrderedDict[int, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._where)

    def lookup(self, keys: Sequence[int]) -> Match | None:
        """The longest recorded prefix of `keys`, or None."""
        for i in range(len(keys) - 1, -1, -1):
            replica = self._where.get(keys[i])
            if replica is not None:
                self._where.move_to_end(keys[i])
                return Match(replica=replica, num_blocks=i + 1)
        return None

    def record(self, keys: Sequence[int], replica: int) -> None:
        where = self._where
        # The head last (most recently used), so that under pressure a prefix's tail goes
        # before its head, as the engine evicts a prefix's later blocks first.
        for key in reversed(keys):
            where[key] = replica
            where.move_to_end(key)
        while len(where) > self.max_entries:
            where.popitem(last=False)

    def check_invariants(self) -> None:
        assert len(self._where) <= self.max_entries
