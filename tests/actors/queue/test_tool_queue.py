"""State-machine tests of one tool's queue: batch grace, dedupe, drains, generations, memo.

The queue shares its in-flight map with the tool's lifecycle (``Lifecycle.groups``):
the lifecycle puts a group there once it leaves the queue and takes it out when it
settles; these tests play the lifecycle's part on a plain dict.
"""

from __future__ import annotations

import json

import pytest

from actors.lifecycle.calls import Call, Group, Role
from actors.queue.actor import Memo, Submitted, ToolQueue
from actors.runtime.futures import new_future
from actors.tool import BatchStrategy, Tool
from stores.types import ClaimMode

GRACE_S = 0.25
MEMO_BYTES = 1 << 20


def _noop(value: object, ctx: object) -> object:
    return value


PLAIN = Tool(tool_id="lookup", fn=_noop)
BATCHED = Tool(tool_id="verify", fn=_noop, batch=BatchStrategy(batch_fn=_noop, max_batch_size=3))


def _call(tool: Tool, key: str, at: float = 0.0, mode: ClaimMode = ClaimMode.NORMAL) -> Call:
    return Call(
        tool=tool,
        input={"k": key},
        key=key,
        input_hash=f"h-{key}",
        credential_digest="cred",
        mode=mode,
        stale_after_s=None,
        timeout_s=30.0,
        future=new_future(),
        submitted_at=at,
    )


def _queue(tool: Tool, memo_bytes: int = MEMO_BYTES) -> tuple[ToolQueue, dict[str, Group]]:
    """A queue and its in-flight map (the lifecycle's ``groups``)."""
    inflight: dict[str, Group] = {}
    return ToolQueue(tool, GRACE_S, inflight, memo=Memo(memo_bytes)), inflight


def _leave_queue(inflight: dict[str, Group], groups: list[Group]) -> list[Group]:
    """What ``Lifecycle.drained`` does first: the drained groups are in flight."""
    for group in groups:
        inflight[group.key] = group
    return groups


def test_tool_queue_without_batch_drains_now_on_every_new_key() -> None:
    queue, _ = _queue(PLAIN)
    assert [queue.submit(_call(PLAIN, k)) for k in ("a", "b", "c")] == [Submitted.DRAIN_NOW] * 3
    assert queue.window_opened_at is None  # no grace window for an unbatched tool
    assert [g.key for g in queue.drain()] == ["a", "b", "c"]


def test_tool_queue_batched_arms_then_queues_then_drains_at_max_batch_size() -> None:
    queue, _ = _queue(BATCHED)
    assert queue.submit(_call(BATCHED, "a", at=1.0)) is Submitted.ARM
    assert queue.submit(_call(BATCHED, "b", at=1.1)) is Submitted.QUEUED
    assert queue.submit(_call(BATCHED, "c", at=1.2)) is Submitted.DRAIN_NOW
    assert [g.key for g in queue.drain()] == ["a", "b", "c"]


def test_tool_queue_same_key_is_a_follower_and_not_a_new_unique_call() -> None:
    queue, _ = _queue(BATCHED)
    owner = _call(BATCHED, "a")
    assert queue.submit(owner) is Submitted.ARM
    followers = [_call(BATCHED, "a") for _ in range(5)]
    assert [queue.submit(c) for c in followers] == [Submitted.FOLLOWER] * 5
    assert queue.submit(_call(BATCHED, "b")) is Submitted.QUEUED  # still only 2 unique
    assert queue.submit(_call(BATCHED, "c")) is Submitted.DRAIN_NOW  # the 3rd unique key
    groups = queue.drain()
    assert [g.key for g in groups] == ["a", "b", "c"]
    assert groups[0].calls == [owner, *followers]
    assert owner.role is Role.OWNER
    assert {c.role for c in followers} == {Role.FOLLOWER}


def test_tool_queue_follower_mode_strengthens_the_group_claim() -> None:
    queue, _ = _queue(BATCHED)
    queue.submit(_call(BATCHED, "a"))
    queue.submit(_call(BATCHED, "a", mode=ClaimMode.FORCE_REFRESH))
    (group,) = queue.drain()
    assert group.mode is ClaimMode.FORCE_REFRESH


def test_tool_queue_group_of_and_join_keep_roles_mode_and_nesting() -> None:
    owner = _call(BATCHED, "a")
    group = Group.of(owner)
    assert (group.key, group.calls, owner.role, group.mode, group.nested) == (
        "a", [owner], Role.OWNER, ClaimMode.NORMAL, False,
    )  # fmt: skip
    nested = _call(BATCHED, "a", mode=ClaimMode.RETRY_FAILED)
    nested.nested = True
    group.join(nested, Role.ATTACHED)
    assert nested.role is Role.ATTACHED
    assert group.mode is ClaimMode.RETRY_FAILED and group.nested
    group.join(_call(BATCHED, "a"), Role.FOLLOWER)
    assert group.mode is ClaimMode.RETRY_FAILED  # a weaker mode never weakens the group


def test_tool_queue_grace_deadline_is_first_submit_plus_grace() -> None:
    queue, _ = _queue(BATCHED)
    queue.submit(_call(BATCHED, "a", at=10.0))
    queue.submit(_call(BATCHED, "b", at=10.2))
    assert queue.grace_deadline() == pytest.approx(10.0 + GRACE_S)


def test_tool_queue_drain_empties_the_window_and_opens_a_new_one() -> None:
    queue, inflight = _queue(BATCHED)
    queue.submit(_call(BATCHED, "a", at=1.0))
    queue.submit(_call(BATCHED, "b", at=1.0))
    groups = _leave_queue(inflight, queue.drain())
    assert queue.queued == {}
    assert queue.inflight is inflight  # the lifecycle's map, shared
    assert [queue.inflight[g.key] for g in groups] == groups
    assert queue.window_opened_at is None
    assert queue.submit(_call(BATCHED, "c", at=5.0)) is Submitted.ARM
    assert queue.grace_deadline() == pytest.approx(5.0 + GRACE_S)


def test_tool_queue_submit_with_an_in_flight_key_is_attached() -> None:
    queue, inflight = _queue(BATCHED)
    owner = _call(BATCHED, "a")
    queue.submit(owner)
    (group,) = _leave_queue(inflight, queue.drain())
    late = _call(BATCHED, "a")
    assert queue.submit(late) is Submitted.ATTACHED
    assert group.calls == [owner, late]
    assert late.role is Role.ATTACHED
    assert queue.queued == {}  # attached calls never start another execution


def test_tool_queue_stronger_mode_never_attaches_to_a_normal_execution() -> None:
    queue, inflight = _queue(BATCHED)
    queue.submit(_call(BATCHED, "a"))
    _leave_queue(inflight, queue.drain())
    refresh = _call(BATCHED, "a", mode=ClaimMode.FORCE_REFRESH)
    assert queue.submit(refresh) is Submitted.ARM  # its own execution, queued
    assert queue.drain() == []  # held behind the running normal call of that key
    assert set(queue.queued) == {"a"}
    del inflight["a"]  # the normal call settled
    (group,) = queue.drain()
    assert group.calls == [refresh] and group.mode is ClaimMode.FORCE_REFRESH


def test_tool_queue_a_lost_lease_group_takes_no_new_callers() -> None:
    queue, inflight = _queue(BATCHED)
    queue.submit(_call(BATCHED, "a"))
    (group,) = _leave_queue(inflight, queue.drain())
    group.lease_lost = True
    assert queue.submit(_call(BATCHED, "a")) is Submitted.ARM


def test_tool_queue_drain_of_an_old_generation_returns_nothing() -> None:
    queue, _ = _queue(BATCHED)
    queue.submit(_call(BATCHED, "a"))
    armed = queue.generation
    queue.submit(_call(BATCHED, "b"))
    queue.submit(_call(BATCHED, "c"))  # DRAIN_NOW
    assert len(queue.drain()) == 3
    queue.submit(_call(BATCHED, "d"))  # a new window
    assert queue.drain(generation=armed) == []  # the first window's timer fires late
    assert set(queue.queued) == {"d"}
    assert [g.key for g in queue.drain(generation=queue.generation)] == ["d"]


def test_tool_queue_drain_of_the_current_generation_takes_the_window() -> None:
    queue, _ = _queue(BATCHED)
    queue.submit(_call(BATCHED, "a"))
    generation = queue.generation
    assert [g.key for g in queue.drain(generation=generation)] == ["a"]
    assert queue.drain(generation=generation) == []  # the same timer cannot drain twice


def test_tool_queue_settled_key_starts_a_new_execution() -> None:
    queue, inflight = _queue(BATCHED)
    queue.submit(_call(BATCHED, "a"))
    _leave_queue(inflight, queue.drain())
    del inflight["a"]  # Lifecycle._settle takes it out of the map
    assert queue.submit(_call(BATCHED, "a")) is Submitted.ARM  # a new execution, not attached


def test_tool_queue_remove_takes_a_cancelled_call_out_of_the_window() -> None:
    queue, _ = _queue(BATCHED)
    first, second = _call(BATCHED, "a"), _call(BATCHED, "a")
    queue.submit(first)
    queue.submit(second)
    assert queue.remove(first)
    assert queue.queued["a"].calls == [second]
    assert not queue.remove(first)  # already gone
    assert queue.remove(second)
    assert queue.queued == {}  # the empty group went too


def test_tool_queue_cancel_queued_returns_every_queued_call() -> None:
    queue, inflight = _queue(BATCHED)
    queue.submit(_call(BATCHED, "running"))
    _leave_queue(inflight, queue.drain())
    queued = [_call(BATCHED, "a"), _call(BATCHED, "a"), _call(BATCHED, "b")]
    for call in queued:
        queue.submit(call)
    attached = _call(BATCHED, "running")
    queue.submit(attached)
    generation = queue.generation
    cancelled = queue.cancel_queued()
    assert set(map(id, cancelled)) == set(map(id, queued))
    assert queue.queued == {}
    assert queue.window_opened_at is None
    assert queue.drain(generation=generation) == []  # the armed timer finds nothing
    assert set(queue.inflight) == {"running"}  # in-flight calls finish normally


# -- the in-memory result memo (encoded text, bounded by bytes) ----------------------


def _text(key: str) -> str:
    return json.dumps({"k": key}, separators=(",", ":"))


def test_tool_queue_memo_answers_a_completed_key_as_cached() -> None:
    queue, inflight = _queue(BATCHED)
    queue.submit(_call(BATCHED, "a"))
    _leave_queue(inflight, queue.drain())
    del inflight["a"]
    queue.memo.remember("a", _text("a"), at=1.0)
    again = _call(BATCHED, "a", at=2.0)
    assert queue.submit(again) is Submitted.MEMO
    assert queue.recalled == _text("a")
    assert queue.queued == {}  # no drain, no provider call


def test_tool_queue_memo_is_bypassed_by_force_refresh_and_staleness() -> None:
    queue, _ = _queue(BATCHED)
    queue.memo.remember("a", _text("a"), at=1.0)
    assert queue.submit(_call(BATCHED, "a", mode=ClaimMode.FORCE_REFRESH)) is Submitted.ARM
    stale = _call(BATCHED, "b", at=100.0)
    queue.memo.remember("b", _text("b"), at=1.0)
    stale.stale_after_s = 10.0
    assert queue.submit(stale) is Submitted.QUEUED  # remembered 99 s ago, older than allowed


def test_tool_queue_memo_is_off_for_non_durable_tools() -> None:
    volatile = Tool(tool_id="now", fn=_noop, durable=False)
    memo = Memo(MEMO_BYTES)
    memo.remember("a", _text("a"), at=1.0)
    queue = ToolQueue(volatile, GRACE_S, {}, memo=memo)
    assert queue.memo is not memo and queue.memo.max_bytes == 0
    assert queue.submit(_call(volatile, "a")) is Submitted.DRAIN_NOW


def test_tool_queue_memo_keeps_the_most_recent_keys_within_its_bytes() -> None:
    size = len(_text("a"))
    queue, _ = _queue(BATCHED, memo_bytes=2 * size)
    for i, key in enumerate(("a", "b", "c")):
        queue.memo.remember(key, _text(key), at=float(i))
    assert list(queue.memo.entries) == ["b", "c"]
    assert queue.memo.bytes == 2 * size
    assert queue.submit(_call(BATCHED, "a")) is Submitted.ARM


def test_tool_queue_memo_refuses_an_entry_larger_than_its_bound_and_forgets() -> None:
    memo = Memo(10)
    memo.remember("big", "x" * 11, at=0.0)
    assert memo.entries == {} and memo.bytes == 0
    memo.remember("a", "12345", at=0.0)
    memo.remember("a", "123", at=1.0)  # replacing an entry counts its new size only
    assert memo.bytes == 3
    memo.remember("b", "1234", at=1.0)
    memo.forget("a")
    assert list(memo.entries) == ["b"] and memo.bytes == 4
    memo.forget()
    assert memo.entries == {} and memo.bytes == 0
    assert memo.recall("b", None, 2.0) is None


def test_tool_queue_memo_of_a_reused_receipt_never_answers_a_staleness_bound() -> None:
    # a reused (cached) receipt may be arbitrarily old: a call with stale_after_s must
    # go to the store, which judges staleness by the receipt's completion time. The
    # lifecycle remembers a reused output as of -inf (ActorEffects.remember).
    queue, _ = _queue(BATCHED)
    queue.memo.remember("a", _text("a"), at=-float("inf"))
    bounded = _call(BATCHED, "a", at=101.0)
    bounded.stale_after_s = 60.0
    assert queue.submit(bounded) is Submitted.ARM
    assert set(queue.queued) == {"a"}  # goes to the store
    unbounded, _ = _queue(BATCHED)
    unbounded.memo.remember("a", _text("a"), at=-float("inf"))
    assert unbounded.submit(_call(BATCHED, "a", at=101.0)) is Submitted.MEMO


def test_tool_queue_drain_whole_batches_leaves_the_rest_in_the_window() -> None:
    tool = Tool(
        tool_id="b", fn=lambda i, c: i, batch=BatchStrategy(batch_fn=lambda p, c: p, max_batch_size=3)
    )
    queue = ToolQueue(tool, 0.25, {}, memo=Memo(MEMO_BYTES))
    for i in range(5):
        queue.submit(_call(tool, f"k{i}", at=float(i) / 100))
    generation = queue.generation
    taken = queue.drain(whole_batches=True)
    assert [g.key for g in taken] == ["k0", "k1", "k2"]
    assert list(queue.queued) == ["k3", "k4"]
    assert queue.generation == generation  # the window's timer still drains the rest
    assert [g.key for g in queue.drain(generation)] == ["k3", "k4"]
