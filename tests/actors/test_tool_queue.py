"""State-machine tests of one tool's queue: batch grace, dedupe, drains, generations."""

from __future__ import annotations

import pykka
import pytest

from actors._calls import Call
from actors.results import ToolResult
from actors.tool import BatchStrategy, Tool
from actors.tool_queue import Submitted, ToolQueue
from stores.types import ClaimMode

GRACE_S = 0.25


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
        future=pykka.ThreadingFuture(),
        submitted_at=at,
    )


def test_tool_queue_without_batch_drains_now_on_every_new_key() -> None:
    queue = ToolQueue(PLAIN, GRACE_S)
    assert [queue.submit(_call(PLAIN, k)) for k in ("a", "b", "c")] == [Submitted.DRAIN_NOW] * 3
    assert queue.window_opened_at is None  # no grace window for an unbatched tool
    assert [g.key for g in queue.drain()] == ["a", "b", "c"]


def test_tool_queue_batched_arms_then_queues_then_drains_at_max_batch_size() -> None:
    queue = ToolQueue(BATCHED, GRACE_S)
    assert queue.submit(_call(BATCHED, "a", at=1.0)) is Submitted.ARM
    assert queue.submit(_call(BATCHED, "b", at=1.1)) is Submitted.QUEUED
    assert queue.submit(_call(BATCHED, "c", at=1.2)) is Submitted.DRAIN_NOW
    assert [g.key for g in queue.drain()] == ["a", "b", "c"]


def test_tool_queue_same_key_is_a_follower_and_not_a_new_unique_call() -> None:
    queue = ToolQueue(BATCHED, GRACE_S)
    owner = _call(BATCHED, "a")
    assert queue.submit(owner) is Submitted.ARM
    followers = [_call(BATCHED, "a") for _ in range(5)]
    assert [queue.submit(c) for c in followers] == [Submitted.FOLLOWER] * 5
    assert queue.submit(_call(BATCHED, "b")) is Submitted.QUEUED  # still only 2 unique
    assert queue.submit(_call(BATCHED, "c")) is Submitted.DRAIN_NOW  # the 3rd unique key
    groups = queue.drain()
    assert [g.key for g in groups] == ["a", "b", "c"]
    assert groups[0].owner is owner
    assert groups[0].followers == followers
    assert groups[0].calls == [owner, *followers]


def test_tool_queue_follower_mode_strengthens_the_group_claim() -> None:
    queue = ToolQueue(BATCHED, GRACE_S)
    queue.submit(_call(BATCHED, "a"))
    queue.submit(_call(BATCHED, "a", mode=ClaimMode.FORCE_REFRESH))
    (group,) = queue.drain()
    assert group.mode is ClaimMode.FORCE_REFRESH


def test_tool_queue_grace_deadline_is_first_submit_plus_grace() -> None:
    queue = ToolQueue(BATCHED, GRACE_S)
    queue.submit(_call(BATCHED, "a", at=10.0))
    queue.submit(_call(BATCHED, "b", at=10.2))
    assert queue.grace_deadline() == pytest.approx(10.0 + GRACE_S)


def test_tool_queue_drain_moves_groups_in_flight_and_opens_a_new_window() -> None:
    queue = ToolQueue(BATCHED, GRACE_S)
    queue.submit(_call(BATCHED, "a", at=1.0))
    queue.submit(_call(BATCHED, "b", at=1.0))
    groups = queue.drain()
    assert queue.queued == {}
    assert set(queue.inflight) == {"a", "b"}
    assert [queue.inflight[g.key] for g in groups] == groups
    assert queue.window_opened_at is None
    assert queue.submit(_call(BATCHED, "c", at=5.0)) is Submitted.ARM
    assert queue.grace_deadline() == pytest.approx(5.0 + GRACE_S)


def test_tool_queue_submit_with_an_in_flight_key_is_attached() -> None:
    queue = ToolQueue(BATCHED, GRACE_S)
    queue.submit(_call(BATCHED, "a"))
    (group,) = queue.drain()
    late = _call(BATCHED, "a")
    assert queue.submit(late) is Submitted.ATTACHED
    assert group.attached == [late]
    assert group.followers == []
    assert queue.queued == {}  # attached calls never start another execution


def test_tool_queue_drain_of_an_old_generation_returns_nothing() -> None:
    queue = ToolQueue(BATCHED, GRACE_S)
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
    queue = ToolQueue(BATCHED, GRACE_S)
    queue.submit(_call(BATCHED, "a"))
    generation = queue.generation
    assert [g.key for g in queue.drain(generation=generation)] == ["a"]
    assert queue.drain(generation=generation) == []  # the same timer cannot drain twice


def test_tool_queue_settle_pops_the_in_flight_group() -> None:
    queue = ToolQueue(BATCHED, GRACE_S)
    queue.submit(_call(BATCHED, "a"))
    (group,) = queue.drain()
    assert queue.settle("a") is group
    assert queue.settle("a") is None
    assert queue.inflight == {}
    assert queue.submit(_call(BATCHED, "a")) is Submitted.ARM  # a new execution, not attached


def test_tool_queue_cancel_queued_returns_every_queued_call() -> None:
    queue = ToolQueue(BATCHED, GRACE_S)
    queue.submit(_call(BATCHED, "running"))
    queue.drain()
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


# -- the in-memory result memo --------------------------------------------------------


def _result(key: str, execution: str = "live") -> ToolResult:
    return ToolResult(value={"k": key}, execution=execution, receipt_key=key, tool_id=BATCHED.tool_id)  # type: ignore[arg-type]


def test_tool_queue_memo_answers_a_completed_key_as_cached() -> None:
    queue = ToolQueue(BATCHED, GRACE_S)
    queue.submit(_call(BATCHED, "a"))
    queue.drain()
    queue.settle("a")
    queue.remember("a", _result("a"), now=1.0)
    again = _call(BATCHED, "a", at=2.0)
    assert queue.submit(again) is Submitted.MEMO
    assert queue.recall(again) == _result("a", execution="cached")
    assert queue.queued == {}  # no drain, no provider call


def test_tool_queue_memo_is_bypassed_by_force_refresh_and_staleness() -> None:
    queue = ToolQueue(BATCHED, GRACE_S)
    queue.remember("a", _result("a"), now=1.0)
    assert queue.submit(_call(BATCHED, "a", mode=ClaimMode.FORCE_REFRESH)) is Submitted.ARM
    stale = _call(BATCHED, "b", at=100.0)
    queue.remember("b", _result("b"), now=1.0)
    stale.stale_after_s = 10.0
    assert queue.submit(stale) is Submitted.QUEUED  # remembered 99 s ago, older than allowed


def test_tool_queue_memo_is_off_for_non_durable_tools() -> None:
    volatile = Tool(tool_id="now", fn=_noop, durable=False)
    queue = ToolQueue(volatile, GRACE_S)
    queue.remember("a", _result("a"), now=1.0)
    assert queue.submit(_call(volatile, "a")) is Submitted.DRAIN_NOW


def test_tool_queue_memo_keeps_the_most_recent_keys() -> None:
    queue = ToolQueue(BATCHED, GRACE_S, memo_size=2)
    for i, key in enumerate(("a", "b", "c")):
        queue.remember(key, _result(key), now=float(i))
    assert list(queue.memo) == ["b", "c"]
    assert queue.submit(_call(BATCHED, "a")) is Submitted.ARM


def test_tool_queue_memo_of_a_reused_receipt_never_answers_a_staleness_bound() -> None:
    # a reused (cached) receipt may be arbitrarily old: a call with stale_after_s must
    # go to the store, which judges staleness by the receipt's completion time
    queue = ToolQueue(BATCHED, GRACE_S)
    queue.remember("a", _result("a", execution="cached"), now=100.0)
    bounded = _call(BATCHED, "a", at=101.0)
    bounded.stale_after_s = 60.0
    assert queue.submit(bounded) is Submitted.ARM
    assert set(queue.queued) == {"a"}  # goes to the store
    unbounded = ToolQueue(BATCHED, GRACE_S)
    unbounded.remember("a", _result("a", execution="cached"), now=100.0)
    assert unbounded.submit(_call(BATCHED, "a", at=101.0)) is Submitted.MEMO


def test_tool_queue_drain_whole_batches_leaves_the_rest_in_the_window() -> None:
    tool = Tool(
        tool_id="b", fn=lambda i, c: i, batch=BatchStrategy(batch_fn=lambda p, c: p, max_batch_size=3)
    )
    queue = ToolQueue(tool, batch_grace_s=0.25)
    for i in range(5):
        queue.submit(_call(tool, f"k{i}", at=float(i) / 100))
    generation = queue.generation
    taken = queue.drain(whole_batches=True)
    assert [g.key for g in taken] == ["k0", "k1", "k2"]
    assert list(queue.queued) == ["k3", "k4"]
    assert queue.generation == generation  # the window's timer still drains the rest
    assert [g.key for g in queue.drain(generation)] == ["k3", "k4"]
