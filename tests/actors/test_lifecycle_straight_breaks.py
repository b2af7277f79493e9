"""Ways found to break claiming straight into running (:mod:`actors.lifecycle.claiming`), each
kept as a test: the state machine driven by hand (:class:`Driver`), then a real system
on a SQLite file where the fault shows as a caller that hangs or a slot never returned.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from actors.lifecycle.calls import Role
from actors.tool import Pacing, Policy, Tool
from stores import SqliteReceiptStore, StoreCapabilities
from stores.types import ClaimMode, ReceiptStatus

from .conftest import WAIT_S
from .test_lifecycle import Driver, _value

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
    assert _value(d.outcome(call)) == {"v": "a"} and _value(d.outcome(nested)) == {"v": "a"}
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
    assert _value(d.outcome(call)) == {"v": "a"}
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
