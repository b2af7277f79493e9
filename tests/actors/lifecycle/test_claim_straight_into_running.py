"""State-machine tests of claiming straight into running (:mod:`actors.lifecycle.claiming`).

When admission looks immediate (a durable, non-batch, unpaced tool; nothing waits for a
slot; the drained groups fit in the free width), the lifecycle asks the governor for
slots first (``immediate``: now or never) and claims the granted groups with their
receipts written ``running`` in the claim's transaction, so they are sent with no
``mark_running`` round. Every other case claims the usual way. Each test ends with
:meth:`Driver.assert_nothing_held` (slots back as granted, leases ended, callers
answered once) and checks that unsent grants give their ``provider_calls`` charge back.
The ``system`` tests run a real system on a SQLite file, where a fault shows as a caller
that hangs or a slot never returned.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from actors.errors import CallCancelledError, StoreError
from actors.lifecycle.calls import Role
from actors.tool import Pacing, Policy, Tool
from stores import SqliteReceiptStore, StoreCapabilities
from stores.types import ClaimDisposition, ClaimMode, ReceiptStatus

from ..conftest import WAIT_S
from .conftest import Driver, value_of


def test_straight_claims_granted_groups_into_running_and_sends_without_marking() -> None:
    d = Driver(straight=True)
    a, b = d.drain("a", "b")
    assert d.fx.immediate == [(2, False)] and d.fx.claims == {}  # slots before the claim
    d.grant_now(2)
    (batch,) = d.fx.claims
    assert d.fx.running[batch] == {"a", "b"}
    d.answer_claim()
    assert d.fx.marks == {} and len(d.fx.starts) == 2  # no mark_running round
    assert d.fx.acquires == []
    for spec in list(d.fx.starts):
        d.finish(spec=spec)
        d.persisted()
    assert [value_of(d.outcome(c)) for c in (a, b)] == [{"v": "a"}, {"v": "b"}]
    assert d.fx.refunds == 0
    d.assert_nothing_held()


def test_straight_partial_grant_claims_the_rest_the_usual_way() -> None:
    d = Driver(straight=True)
    a, b = d.drain("a", "b")
    d.grant_now(1)
    (batch,) = d.fx.claims
    assert d.fx.running[batch] == {"a"}  # one claim: a into running, b as usual
    d.answer_claim()
    assert len(d.fx.starts) == 1 and d.fx.acquires == [(1, False)]
    d.grant()
    d.mark()
    assert [lease.key for leases in d.fx.marks.values() for lease in leases] == ["b"]
    for spec in list(d.fx.starts):
        d.finish(spec=spec)
        d.persisted()
    assert {value_of(d.outcome(c))["v"] for c in (a, b)} == {"a", "b"}
    d.assert_nothing_held()


@pytest.mark.parametrize("answer", [0, -1], ids=["no-room", "paced"])
def test_straight_no_grant_claims_every_group_the_usual_way(answer: int) -> None:
    d = Driver(straight=True)
    (call,) = d.drain("a")
    d.grant_now(answer)
    (batch,) = d.fx.claims
    assert d.fx.running[batch] == frozenset()
    d.answer_claim()
    d.grant()
    d.mark()
    d.finish()
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"}
    assert d.fx.refunds == 0
    d.assert_nothing_held()


@pytest.mark.parametrize(
    "disposition",
    [ClaimDisposition.REUSED, ClaimDisposition.RUNNING, ClaimDisposition.FAILED],
    ids=["reused", "held-by-another", "failed"],
)
def test_straight_a_slotted_group_the_claim_does_not_take_gives_its_slot_and_charge_back(
    disposition: ClaimDisposition,
) -> None:
    d = Driver(straight=True)
    a, b = d.drain("a", "b")
    d.grant_now(2)
    d.answer_claim({"b": disposition})
    assert len(d.fx.starts) == 1
    assert d.fx.slots_released[False] == 1 and d.fx.refunds == 1  # b's slot: never sent
    d.finish()
    d.persisted()
    assert value_of(d.outcome(a)) == {"v": "a"}
    if disposition is ClaimDisposition.RUNNING:  # waits on the other owner: let it go
        d.stop()
    d.outcome(b)
    d.assert_nothing_held()


def test_straight_a_claim_that_fails_gives_every_slot_and_charge_back() -> None:
    d = Driver(straight=True)
    a, b = d.drain("a", "b")
    d.grant_now(2)
    d.fail_claim(StoreError("disk full"))
    assert d.fx.slots_released[False] == 2 and d.fx.refunds == 2
    assert all(isinstance(d.outcome(c), StoreError) for c in (a, b))
    d.assert_nothing_held()


def test_straight_cancelled_while_its_slots_are_asked_for_is_never_slotted() -> None:
    d = Driver(straight=True)
    a, b = d.drain("a", "b")
    assert d.cancel(b)
    d.grant_now(2)
    (batch,) = d.fx.claims
    assert d.fx.running[batch] == {"a"}
    assert d.fx.slots_released[False] == 1 and d.fx.refunds == 1
    d.answer_claim()
    d.finish()
    d.persisted()
    assert value_of(d.outcome(a)) == {"v": "a"}
    assert isinstance(d.outcome(b), CallCancelledError)
    d.assert_nothing_held()


def test_straight_stop_while_its_slots_are_asked_for_sends_nothing() -> None:
    d = Driver(straight=True)
    (call,) = d.drain("a")
    d.stop()
    d.grant_now(1)
    assert d.fx.slots_released[False] == 1 and d.fx.refunds == 1
    d.answer_claim()
    assert d.fx.starts == []
    assert isinstance(d.outcome(call), CallCancelledError)
    d.assert_nothing_held()


def test_straight_a_send_the_latch_refuses_gives_the_running_receipt_back() -> None:
    d = Driver(straight=True)
    (call,) = d.drain("a")
    d.grant_now(1)
    d.fx.latch = "store down"
    d.answer_claim()
    assert d.fx.starts == []
    assert [lease.key for lease in d.fx.released] == ["a"]  # running -> released, never sent
    assert d.fx.refunds == 1
    d.outcome(call)
    d.assert_nothing_held()


@pytest.mark.parametrize(
    "tool",
    [
        Tool(tool_id="stated", fn=lambda i, c: i, pacing=Pacing(rps=5)),
        Tool(tool_id="learnt", fn=lambda i, c: i, pacing=Pacing(start_rps=5)),
    ],
    ids=["stated-rate", "start-rate"],
)
def test_straight_a_paced_tool_claims_the_usual_way(tool: Tool) -> None:
    d = Driver(tool=tool, straight=True)
    d.drain("a")
    assert d.fx.immediate == [] and len(d.fx.claims) == 1


def test_straight_more_groups_than_free_slots_claim_the_usual_way() -> None:
    d = Driver(straight=True, width=2)
    d.drain("a", "b", "c")
    assert d.fx.immediate == [] and len(d.fx.claims) == 1


def test_straight_not_while_units_wait_for_slots() -> None:
    d = Driver(straight=True, width=2)
    d.drain("a", "b", "c")
    d.answer_claim()  # a, b admitted; c waits for a slot
    d.grant(1)
    d.drain("d")
    assert d.fx.immediate == []  # c waits first: d is claimed as usual, behind it


# -- a real system, a SQLite file ---------------------------------------------------------


def test_straight_system_an_idle_call_runs_on_a_receipt_claimed_running_with_no_mark(
    make_system: Any, open_store: Any, read_receipts: Any, key_of: Any
) -> None:
    marks: list[int] = []
    seen: list[Any] = []

    class Counting(SqliteReceiptStore):
        def mark_running_many(self, *args: Any, **kwargs: Any) -> Any:
            marks.append(1)
            return super().mark_running_many(*args, **kwargs)

    def fn(i: Any, c: Any) -> Any:
        (receipt,) = read_receipts([c.receipt_keys[0]])
        seen.append(receipt.status if receipt else None)
        return {"n": i["n"]}

    tool = Tool(tool_id="t", fn=fn)
    store = Counting(open_store().path)
    try:
        system = make_system([tool], store=store)
        for n in range(3):
            assert system.proxy().execute("t", {"n": n}).get(timeout=WAIT_S).value == {"n": n}
        assert marks == []  # every call claimed straight into running
        assert seen == [ReceiptStatus.RUNNING] * 3  # running while the tool ran
        receipts = read_receipts([key_of(tool, {"n": n}) for n in range(3)])
        assert [r.status for r in receipts if r] == [ReceiptStatus.COMPLETED] * 3
    finally:
        store.close()


def test_straight_system_calls_beyond_the_free_width_are_marked_as_usual(
    make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    tool = Tool(tool_id="t", fn=lambda i, c: {"n": i["n"]})
    system = make_system([tool], policy=Policy(max_concurrency=4, batch_grace_s=0.01))
    futures = system.proxy().execute_many("t", [{"n": n} for n in range(40)])
    assert [f.get(timeout=WAIT_S).value["n"] for f in futures] == list(range(40))
    receipts = read_receipts([key_of(tool, {"n": n}) for n in range(40)])
    assert all(r is not None and r.status is ReceiptStatus.COMPLETED for r in receipts)


def test_straight_a_bulk_drain_is_claimed_in_chunks_and_its_first_calls_start_before_the_rest() -> None:
    from actors.lifecycle.claiming import CLAIM_CHUNK

    n = 2 * CLAIM_CHUNK + 7
    d = Driver(straight=True, width=n)
    calls = d.drain(*(f"k{i}" for i in range(n)))
    d.grant_now(n)
    sizes = [len(requests) for _, requests in d.fx.claims.values()]
    assert sizes == [CLAIM_CHUNK, CLAIM_CHUNK, 7]  # one transaction each, in order
    assert all(d.fx.running[b] == {r.key for r in d.fx.claims[b][1]} for b in d.fx.claims)
    first = max(d.fx.claims)
    d.answer_claim()
    assert len(d.fx.starts) == 7 and len(d.fx.claims) == 3  # started while two claims are out
    del d.fx.claims[first]
    while d.fx.claims:
        batch = max(d.fx.claims)
        d.answer_claim()
        del d.fx.claims[batch]
    assert len(d.fx.starts) == n and d.fx.marks == {}
    for spec in list(d.fx.starts):
        d.finish(spec=spec)
        d.persisted()
    assert {value_of(d.outcome(c))["v"] for c in calls} == {f"k{i}" for i in range(n)}
    d.assert_nothing_held()


# -- a nested call joins a group whose (non-exempt) slot was taken before its claim -------


def test_straight_a_nested_call_joining_during_the_claim_keeps_the_slot_non_exempt() -> None:
    d = Driver(straight=True)
    (call,) = d.drain("a")
    d.grant_now(1)  # a's slot (not exempt) is taken; its claim is out
    nested = d.call("a", nested=True)
    d.life.groups["a"].join(nested, Role.ATTACHED)  # as ToolQueue.submit, then nested_joined
    d.life.nested_joined("a")
    d.pump()
    d.answer_claim()
    (spec,) = d.fx.starts
    d.finish(spec=spec)
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"} and value_of(d.outcome(nested)) == {"v": "a"}
    # the slot granted as non-exempt comes back as non-exempt (else the governor's count
    # of the provider's slots in use and the tool's width stay taken for good)
    assert d.fx.slots_released == {False: 1, True: 0}
    d.assert_nothing_held()


def test_straight_system_a_nested_call_joining_during_the_claim_leaves_the_tool_usable(
    make_system: Any, open_store: Any
) -> None:
    claiming, go = threading.Event(), threading.Event()
    holder: list[Any] = []

    class HeldClaim(SqliteReceiptStore):
        """The first claim into running waits until the test lets it go."""

        def claim_many(self, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("running") and not claiming.is_set():
                claiming.set()
                go.wait(WAIT_S)
            return super().claim_many(*args, **kwargs)

    def parent(i: Any, c: Any) -> Any:  # a running tool calls the child: a nested call
        return holder[0].execute("child", {"n": i["n"]}).get(timeout=WAIT_S).value

    child = Tool(tool_id="child", fn=lambda i, c: {"n": i["n"]}, pacing=Pacing(max_concurrency=1))
    system = make_system(
        [Tool(tool_id="parent", fn=parent, durable=False), child],
        store=HeldClaim(open_store().path),
        policy=Policy(batch_grace_s=0.01),
    )
    proxy = system.proxy()
    holder.append(proxy)
    top = proxy.execute("child", {"n": 1})
    assert claiming.wait(WAIT_S), "the child's call was not claimed straight into running"
    nesting = proxy.execute("parent", {"n": 1})
    end = time.monotonic() + WAIT_S
    while system.stats().get("deduped", 0) < 1:  # the nested call joined the child's group
        assert time.monotonic() < end, "the nested call never joined"
        threading.Event().wait(0.01)
    go.set()
    assert top.get(timeout=WAIT_S).value == {"n": 1}
    assert nesting.get(timeout=WAIT_S).value == {"n": 1}
    # its one slot came back: the child's next call runs (it hung for good)
    assert proxy.execute("child", {"n": 2}).get(timeout=WAIT_S).value == {"n": 2}


# -- a provider_calls budget: a charge held for a claim that reuses its receipt ----------


def test_straight_with_a_budget_no_charge_is_held_for_a_call_the_claim_answers(
    make_system: Any, open_store: Any, recorder: Any
) -> None:
    """Policy(max_provider_calls=1) allows one real call: a rerun's cached call, whose
    claim is slow, must not hold the budget's one charge while a new call asks for it."""
    cached = Tool(tool_id="cached", fn=lambda i, c: {"n": i["n"]})
    first = make_system([cached], run_id="r0")
    assert first.proxy().execute("cached", {"n": 1}).get(timeout=WAIT_S).execution == "live"
    first.stop(timeout_s=WAIT_S)  # a new system: the receipt is in the file, not in its memo

    claiming, go = threading.Event(), threading.Event()

    class HeldClaim(SqliteReceiptStore):
        """Claims of the cached tool wait until the test lets them go."""

        def claim_many(self, org_id: str, requests: Any, *args: Any, **kwargs: Any) -> Any:
            if any(r.tool_id == "cached" for r in requests):
                claiming.set()
                go.wait(WAIT_S)
            return super().claim_many(org_id, requests, *args, **kwargs)

        def read_reusable(self, *args: Any, **kwargs: Any) -> Any:
            return {}  # the caller's plain read finds nothing: the call goes to its claim

    def api(i: Any, c: Any) -> Any:
        recorder.record("api", i, c)
        return {"api": i["n"]}

    system = make_system(
        [cached, Tool(tool_id="api", fn=api, durable=False)],
        store=HeldClaim(open_store().path),
        policy=Policy(batch_grace_s=0.01, max_provider_calls=1),
    )
    proxy = system.proxy()
    reused = proxy.execute("cached", {"n": 1})
    try:
        assert claiming.wait(WAIT_S)
        fresh = proxy.execute("api", {"n": 2})  # the one real call the budget allows
        assert fresh.get(timeout=WAIT_S).value == {"api": 2}
    finally:
        go.set()
    assert reused.get(timeout=WAIT_S).execution == "cached"
    assert recorder.count("api") == 1


# -- a store written before claims into running ------------------------------------------


def test_straight_a_claim_the_store_left_queued_is_marked_before_it_is_sent() -> None:
    d = Driver(straight=True)
    (call,) = d.drain("a")
    d.grant_now(1)
    batch = max(d.fx.claims)
    assert d.fx.running[batch] == {"a"}
    d.answer_claim(a=d.receipt("a", ReceiptStatus.QUEUED, lease_id="lease-a", attempts=1))
    assert d.fx.starts == [] and [lease.key for leases in d.fx.marks.values() for lease in leases] == ["a"]
    d.mark()
    d.finish()
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_straight_system_a_store_without_claims_into_running_keeps_working(
    make_system: Any, open_store: Any, read_receipts: Any, key_of: Any
) -> None:
    seen: list[Any] = []

    class Old(SqliteReceiptStore):
        """claim_many as written before claims into running (no ``running``), declared so."""

        capabilities = StoreCapabilities(group_commit=True)

        def claim_many(  # type: ignore[override]
            self, org_id: str, requests: Any, owner: Any, *, lease_ttl_s: float,
            mode: ClaimMode = ClaimMode.NORMAL, stale_after_s: float | None = None,
        ) -> Any:  # fmt: skip
            return super().claim_many(
                org_id, requests, owner, lease_ttl_s=lease_ttl_s, mode=mode, stale_after_s=stale_after_s
            )

    def fn(i: Any, c: Any) -> Any:
        (receipt,) = read_receipts([c.receipt_keys[0]])
        seen.append(receipt.status if receipt else None)
        return {"n": i["n"]}

    system = make_system([Tool(tool_id="t", fn=fn)], store=Old(open_store().path))
    assert system.proxy().execute("t", {"n": 1}).get(timeout=WAIT_S).value == {"n": 1}
    assert seen == [ReceiptStatus.RUNNING]  # marked running before it was sent
