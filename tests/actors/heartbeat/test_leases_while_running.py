"""Leases while a provider call runs: heartbeats keep a long call owned; without them a
second run reclaims the expired lease once and the late completion is refused by fencing.

Two DispatchSystems (two run ids) share one real SQLite file, as two workers would.
Times are scaled down from the issue's 7 s call / 2 s TTL to 1.4 s / 0.4 s (3.5x).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from actors import DispatchSystem, LeaseLostError, Policy, RunInfo, SalvageLog, Tool
from stores import SqliteReceiptStore
from stores.types import ReceiptStatus

LEASE_TTL_S = 0.4
LONG_CALL_S = 1.4  # 3.5x the lease TTL
WAIT_S = 15.0  # generous bound for futures/events; never reached when things work


class ProviderLog:
    """Counts provider calls across systems (thread- and greenlet-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: list[str] = []

    def record(self, who: str) -> None:
        with self._lock:
            self.calls.append(who)


def _shut(*systems: DispatchSystem) -> None:
    """Stop each system, then close its store (a system never closes its store)."""
    for system in systems:
        system.stop()
        system.store.close()


def _run(run_id: str) -> RunInfo:
    return RunInfo(run_id=run_id, org_id="acme", scope="leases")


def _waiting_policy(**extra: Any) -> Policy:
    """A second system that polls the other owner's receipt often and long enough."""
    return Policy(
        lease_ttl_s=LEASE_TTL_S,
        receipt_poll_initial_s=0.01,
        receipt_poll_max_s=0.05,
        receipt_wait_max_attempts=400,
        **extra,
    )


@pytest.mark.waits
def test_lease_heartbeats_keep_long_call_owned(tmp_path: Path) -> None:
    db = str(tmp_path / "receipts.db")
    provider = ProviderLog()
    reader = SqliteReceiptStore(db)
    started = threading.Event()
    never = threading.Event()
    seen: dict[str, Any] = {}

    def slow(inp: Any, ctx: Any) -> Any:
        provider.record("first")
        (seen["at_start"],) = reader.get_many("acme", [ctx.receipt_key])
        started.set()
        never.wait(LONG_CALL_S)  # the provider takes 3.5 lease TTLs
        (seen["at_end"],) = reader.get_many("acme", [ctx.receipt_key])
        seen["end_clock"] = time.time()
        return {"by": "first", "x": inp["x"]}

    def must_not_run(inp: Any, ctx: Any) -> Any:
        provider.record("second")
        return {"by": "second", "x": inp["x"]}

    first = DispatchSystem.start(
        tools=[Tool(tool_id="enrich", fn=slow)],
        store=SqliteReceiptStore(db),
        run=_run("r1"),
        policy=Policy(lease_ttl_s=LEASE_TTL_S),
    )
    second = DispatchSystem.start(
        tools=[Tool(tool_id="enrich", fn=must_not_run)],
        store=SqliteReceiptStore(db),
        run=_run("r2"),
        policy=_waiting_policy(),
    )
    try:
        owner_future = first.proxy().execute("enrich", {"x": 1})
        assert started.wait(WAIT_S)
        # Submitted while the first call runs; it polls the receipt for the whole call,
        # so a lapse of the lease at any point would let it reclaim and run.
        waiter_future = second.proxy().execute("enrich", {"x": 1})
        owned = owner_future.get(timeout=WAIT_S)
        waited = waiter_future.get(timeout=WAIT_S)
        waiter_stats = second.stats()
    finally:
        _shut(first, second)

    assert owned.execution == "live"
    assert owned.value == {"by": "first", "x": 1}
    assert waited.execution == "in_flight"
    assert waited.value == {"by": "first", "x": 1}
    assert waited.receipt_key == owned.receipt_key
    assert provider.calls == ["first"]
    assert waiter_stats["provider_calls"] == 0

    # Renewals happened: the lease seen at the end of the call was pushed past where the
    # claim put it, and was still live then.
    start_lease = seen["at_start"].lease_expires_at
    end_lease = seen["at_end"].lease_expires_at
    assert seen["at_start"].status is ReceiptStatus.RUNNING
    assert seen["at_end"].status is ReceiptStatus.RUNNING
    assert seen["at_end"].lease_owner_run_id == "r1"
    assert end_lease > start_lease + LEASE_TTL_S
    assert end_lease > seen["end_clock"]

    (stored,) = reader.get_many("acme", [owned.receipt_key])
    assert stored.status is ReceiptStatus.COMPLETED
    assert stored.output == {"by": "first", "x": 1}
    assert stored.attempts == 1
    reader.close()


@pytest.mark.waits
def test_lease_without_heartbeats_is_reclaimed_once_and_late_completion_salvaged(tmp_path: Path) -> None:
    db = str(tmp_path / "receipts.db")
    salvage_path = str(tmp_path / "salvage.jsonl")
    provider = ProviderLog()
    first_started = threading.Event()
    second_started = threading.Event()
    first_settled = threading.Event()

    def slow(inp: Any, ctx: Any) -> Any:
        provider.record("first")
        first_started.set()
        # Runs past its lease: it returns only once the second run has reclaimed the
        # receipt and started its own provider call (or after the long call's time).
        second_started.wait(WAIT_S)
        return {"by": "first", "x": inp["x"]}

    def reclaimer(inp: Any, ctx: Any) -> Any:
        provider.record("second")
        second_started.set()
        # Still running while the first run's late completion arrives.
        first_settled.wait(WAIT_S)
        return {"by": "second", "x": inp["x"]}

    first = DispatchSystem.start(
        tools=[Tool(tool_id="enrich", fn=slow, retry_safe=True)],  # a lost call may run again
        store=SqliteReceiptStore(db),
        run=_run("r1"),
        policy=Policy(lease_ttl_s=LEASE_TTL_S, heartbeats=False, salvage_path=salvage_path),
    )
    second = DispatchSystem.start(
        tools=[Tool(tool_id="enrich", fn=reclaimer, retry_safe=True)],
        store=SqliteReceiptStore(db),
        run=_run("r2"),
        policy=_waiting_policy(salvage_path=str(tmp_path / "second-salvage.jsonl")),
    )
    try:
        late_future = first.proxy().execute("enrich", {"x": 7})
        assert first_started.wait(WAIT_S)
        reclaim_future = second.proxy().execute("enrich", {"x": 7})
        with pytest.raises(LeaseLostError):
            late_future.get(timeout=WAIT_S)
        first_settled.set()
        reclaimed = reclaim_future.get(timeout=WAIT_S)
        first_stats = first.stats()
    finally:
        first_settled.set()
        _shut(first, second)

    assert provider.calls == ["first", "second"]
    assert reclaimed.execution == "live"
    assert reclaimed.value == {"by": "second", "x": 7}
    assert first_stats["lease_lost"] == 1
    assert first_stats["salvaged"] == 1

    reader = SqliteReceiptStore(db)
    (stored,) = reader.get_many("acme", [reclaimed.receipt_key])
    reader.close()
    assert stored.status is ReceiptStatus.COMPLETED
    assert stored.output == {"by": "second", "x": 7}
    assert stored.lease_owner_run_id == "r2"
    assert stored.attempts == 2  # claimed by the first run, reclaimed once by the second

    (entry,) = SalvageLog(salvage_path).entries()
    assert entry.receipt_key == reclaimed.receipt_key
    assert entry.tool_id == "enrich"
    assert entry.output == {"by": "first", "x": 7}
    assert SalvageLog(str(tmp_path / "second-salvage.jsonl")).entries() == []


@pytest.mark.waits
def test_lease_drain_runs_what_it_claimed_before_waiting_on_another_owners_lease(
    make_system: Any, open_store: Any, recorder: Any
) -> None:
    # A run that died (Ctrl-C twice, kill -9) left one receipt leased for LEASE_S. A new run
    # claims it together with fresh keys in one drain: the fresh ones must not wait for it.
    from stores.keys import key_and_input_hash
    from stores.types import ClaimRequest, Owner

    lease_s = 2.0

    def api(input: Any, ctx: Any) -> Any:
        recorder.record("api", input, ctx)
        return {"n": input["n"]}

    tool = Tool(tool_id="api", fn=api)
    key, input_hash = key_and_input_hash(
        org_id="acme", scope="enrich", tool_id="api", input={"n": 0}, version=tool.version
    )
    dead = open_store()
    dead.claim_many(
        "acme", [ClaimRequest(key, "enrich", "api", input_hash)], Owner("dead-run", 1), lease_ttl_s=lease_s
    )

    system = make_system([tool], policy=Policy(batch_grace_s=0.1, receipt_poll_max_s=0.2))
    start = time.monotonic()
    futures = [system.proxy().execute("api", {"n": n}) for n in range(6)]
    fresh = [f.get(timeout=10.0) for f in futures[1:]]
    fresh_done = time.monotonic() - start
    held = futures[0].get(timeout=10.0)
    held_done = time.monotonic() - start

    assert all(r.execution == "live" for r in fresh)
    assert fresh_done < lease_s / 2, f"fresh calls waited {fresh_done:.2f} s behind another owner's lease"
    assert held.execution == "live" and held_done >= lease_s * 0.9  # taken over only once it expired
    assert recorder.count("api") == 6
