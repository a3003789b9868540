"""Prefix keys (gateway/engines/routing/prefix.py) and the map of where each was last served
(affinity.py): plain data, no engine."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from gateway.engines.routing.affinity import Match, PrefixMap
from gateway.engines.routing.prefix import prefix_keys

BS = 4


def keys(tokens: list[int], salt: str = "s", model: str = "m") -> tuple[int, ...]:
    return prefix_keys(tokens, cache_salt=salt, model=model, block_size=BS).keys


def test_one_key_per_full_block_chained_from_the_start() -> None:
    prompt = list(range(10))
    assert len(keys(prompt)) == 2  # the last 2 tokens are no full block
    assert keys([*prompt, 7, 7])[:2] == keys(prompt)
    # a different first block changes every later key, as the engine's chained keys do
    changed = keys([99, *prompt[1:]])
    assert not set(changed) & set(keys(prompt))


def test_salt_and_model_separate_identical_prompts() -> None:
    prompt = list(range(8))
    assert keys(prompt, salt="a") != keys(prompt, salt="b")
    assert keys(prompt, model="a") != keys(prompt, model="b")


def test_keys_are_the_same_in_another_process() -> None:
    """Every gateway process derives the same keys (str hashes vary by process; these do not)."""
    code = (
        "from gateway.engines.routing.prefix import prefix_keys;"
        "print(prefix_keys(list(range(12)), cache_salt='s', model='m', block_size=4).keys)"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": "123"},
    ).stdout.strip()  # fmt: skip
    assert other == str(keys(list(range(12))))


def test_cacheable_tokens_never_count_the_last_token() -> None:
    exact = prefix_keys(list(range(8)), cache_salt=None, model=None, block_size=BS)
    assert len(exact.keys) == 2
    assert exact.num_cacheable_tokens(2) == 4  # the engine recomputes token 8: block 2 is not hit
    longer = prefix_keys(list(range(9)), cache_salt=None, model=None, block_size=BS)
    assert longer.num_cacheable_tokens(2) == 8
    assert longer.num_cacheable_tokens(0) == 0


def test_the_next_turn_finds_the_whole_previous_prompt() -> None:
    prefixes = PrefixMap()
    turn1 = list(range(1, 14))
    prefixes.record(keys(turn1), replica=2)
    turn2 = [*turn1, 50, 51, 52, 53, 54]
    assert prefixes.lookup(keys(turn2)) == Match(replica=2, num_blocks=3)
    assert prefixes.lookup(keys(list(range(100, 120)))) is None
    # a later turn served elsewhere moves the conversation there
    prefixes.record(keys(turn2), replica=0)
    assert prefixes.lookup(keys(turn2)) == Match(replica=0, num_blocks=4)


def test_the_map_is_bounded_and_forgets_a_prefix_tail_first() -> None:
    prefixes = PrefixMap(max_entries=3)
    prefixes.record(keys(list(range(16))), replica=1)  # four keys: the tail is dropped
    prefixes.check_invariants()
    assert len(prefixes) == 3
    assert prefixes.lookup(keys(list(range(16)))) == Match(replica=1, num_blocks=3)


@given(
    st.lists(st.tuples(st.lists(st.integers(0, 50), max_size=40), st.integers(0, 4)), max_size=30),
    st.integers(1, 20),
)
def test_bounded_under_any_records(records: list[tuple[list[int], int]], limit: int) -> None:
    prefixes = PrefixMap(max_entries=limit)
    for tokens, replica in records:
        prefixes.record(keys(tokens), replica)
        prefixes.check_invariants()
        found = prefixes.lookup(keys(tokens))
        if keys(tokens):  # the head of what was just recorded is the most recent entry
            assert found is not None and found.replica == replica
