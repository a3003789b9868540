"""The waiting line's index (engine/scheduling/waiting_queue.py) against its docstring's order
computed by brute force (`line_order`, tests/engine/scheduling/reference_scheduler.py), over
random sequences of operations (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.request import EngineRequest, RequestId
from engine.sampling_params import SamplingParams
from engine.scheduling.sequence import Sequence
from engine.scheduling.waiting_queue import WaitingQueue
from tests.engine.scheduling.reference_scheduler import line_order


def make_seq(i: int, *, step: int, priority: int, tenant: str, adapter: int | None) -> Sequence:
    request = EngineRequest(
        request_id=RequestId(f"r{i}"),
        prompt_token_ids=(1, 2, 3),
        sampling_params=SamplingParams(max_tokens=1),
        priority=priority,
        fairness_key=tenant,
    )
    return Sequence(
        seq_id=i, request=request, index=0, arrival_order=i, arrival_step=step,
        token_ids=[1, 2, 3], num_prompt_tokens=3, max_tokens=1, adapter_id=adapter,
    )  # fmt: skip


def another_choice(seq: Sequence, seq_id: int) -> Sequence:
    """A further choice of seq's request: the engine adds them together, sharing the request's
    arrival order and step."""
    return Sequence(
        seq_id=seq_id, request=seq.request, index=seq.index + 1, arrival_order=seq.arrival_order,
        arrival_step=seq.arrival_step, token_ids=[1, 2, 3], num_prompt_tokens=3, max_tokens=1,
        adapter_id=seq.adapter_id,
    )  # fmt: skip


op_st = st.one_of(
    st.tuples(st.just("add"), st.integers(-2, 2), st.integers(0, 4), st.sampled_from([None, 1, 2])),
    st.tuples(st.just("add_choice")),
    st.tuples(st.just("remove"), st.integers(0, 1000)),
    st.tuples(st.just("charge"), st.integers(0, 4), st.integers(1, 50)),
    st.tuples(st.just("pop_readd"), st.integers(1, 6)),
    st.tuples(st.just("tick"), st.integers(1, 5)),
)


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(op_st, max_size=80),
    aging_steps=st.integers(1, 6),
    by_priority=st.booleans(),
)
def test_index_pops_in_the_brute_force_line_order(ops, aging_steps, by_priority):
    served: dict[str, int] = {}
    queue = WaitingQueue(
        aging_steps=aging_steps, served=lambda t: served.get(t, 0), by_priority=by_priority
    )
    members: list[Sequence] = []
    step = count = 0

    def expected() -> list[Sequence]:
        return line_order(
            members, served=lambda t: served.get(t, 0), aging_steps=aging_steps,
            by_priority=by_priority,
        )  # fmt: skip

    last: Sequence | None = None
    for op in ops:
        if op[0] == "add":
            seq = last = make_seq(
                count, step=step, priority=op[1], tenant=f"t{op[2]}", adapter=op[3]
            )
            count += 1
            queue.add(seq)
            members.append(seq)
        elif op[0] == "add_choice" and last is not None:
            seq = last = another_choice(last, count)
            count += 1
            queue.add(seq)
            members.append(seq)
        elif op[0] == "remove" and members:
            seq = members.pop(op[1] % len(members))
            queue.remove(seq)
        elif op[0] == "charge":
            tenant = f"t{op[1]}"
            served[tenant] = served.get(tenant, 0) + op[2]  # the queue reads it when it needs it
        elif op[0] == "pop_readd":
            # A step's pass: take the first few (in line order), then put them back.
            line = expected()
            taken = [queue.pop() for _ in range(min(op[1], len(members)))]
            assert taken == line[: len(taken)]
            for seq in taken:
                queue.add(seq)
        elif op[0] == "tick":
            step += op[1]
        queue.check_invariants()
        assert len(queue) == len(members)
        assert queue.peek() is (expected()[0] if members else None)
        levels = [s.priority - (step - s.arrival_step) // aging_steps for s in members]
        if by_priority:
            assert queue.best_level(step) == (min(levels) if levels else None)
        assert queue.adapters() == sorted({s.adapter_id for s in members if s.adapter_id})

    line = expected()
    assert [queue.pop() for _ in range(len(members))] == line
    assert queue.pop() is None and not queue


def test_a_flood_that_waited_past_aging_does_not_outrank_a_newcomer_of_its_own_band():
    served = {"heavy": 1000, "light": 0}
    queue = WaitingQueue(aging_steps=4, served=served.__getitem__)
    flood = [make_seq(i, step=0, priority=0, tenant="heavy", adapter=None) for i in range(50)]
    for seq in flood:
        queue.add(seq)
    newcomer = make_seq(50, step=40, priority=0, tenant="light", adapter=None)
    queue.add(newcomer)
    assert queue.pop() is newcomer  # the flood aged 10 levels, but inside its own band


def test_aging_lets_a_band_overtake_another_by_its_oldest_only():
    queue = WaitingQueue(aging_steps=4, served=lambda _tenant: 0)
    old = make_seq(0, step=0, priority=5, tenant="x", adapter=None)  # deadline 5 * 4 + 0
    stream = [make_seq(1 + s, step=s, priority=0, tenant="y", adapter=None) for s in range(40)]
    fresh = make_seq(41, step=40, priority=5, tenant="x", adapter=None)  # deadline 60
    for seq in (old, *stream, fresh):
        queue.add(seq)
    order = [queue.pop() for _ in range(42)]
    # old outranks the stream's members that arrived after step 20 (ties to the older); the
    # fresh priority-5 request does not inherit old's age once old has gone.
    assert order == [*stream[:20], old, *stream[20:], fresh]
