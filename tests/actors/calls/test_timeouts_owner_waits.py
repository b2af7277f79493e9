"""A call whose receipt another owner holds waits for it (never stealing a live lease), but
no longer than its own ``timeout_s``: counted from the start of the wait, or from when the
call joined it, as a call attached to an execution in this process. Callers are answered
``ReceiptWaitTimeoutError`` one by one; the wait goes on for the patient ones, and a wait
left with no caller stops polling and takes nothing over. Another owner's lease is made
with the store on the same real SQLite file, both runtimes.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from actors import Policy, ReceiptWaitTimeoutError, Tool
from stores.keys import key_and_input_hash
from stores.types import ClaimRequest, Owner, ReceiptStatus

LEASE_S = 1.5
WAIT_S = 15.0
POLICY = Policy(batch_grace_s=0.02, receipt_poll_initial_s=0.01, receipt_poll_max_s=0.05,
                receipt_wait_max_attempts=10_000)  # fmt: skip


def _held(open_store: Any, tool: Tool, input: Any) -> str:
    """Another run's live lease on ``input``'s receipt (this process: never judged gone)."""
    key, input_hash = key_and_input_hash(
        org_id="acme", scope="enrich", tool_id=tool.tool_id, input=input, version=tool.version
    )
    other = open_store()
    other.claim_many(
        "acme",
        [ClaimRequest(key, "enrich", tool.tool_id, input_hash)],
        Owner("other-run", 1),
        lease_ttl_s=LEASE_S,
    )
    return key


def _tool(recorder: Any) -> Tool:
    def api(input: Any, ctx: Any) -> Any:
        recorder.record("api", input, ctx)
        return {"n": input["n"]}

    return Tool(tool_id="api", fn=api)


def _waiting_system(make_system: Any, open_store: Any, recorder: Any, n: int) -> tuple[Any, str]:
    """A system whose tool's input ``{"n": n}`` is held by another run's live lease."""
    tool = _tool(recorder)
    key = _held(open_store, tool, {"n": n})
    return make_system([tool], policy=POLICY, scope="enrich", org_id="acme"), key


@pytest.mark.waits
def test_a_caller_waiting_on_another_owner_times_out_at_its_own_timeout(
    make_system: Any, open_store: Any, recorder: Any, read_receipts: Any
) -> None:
    system, key = _waiting_system(make_system, open_store, recorder, 1)
    start = time.monotonic()
    with pytest.raises(ReceiptWaitTimeoutError, match=r"timeout_s \(0\.3 s\)"):
        system.proxy().execute("api", {"n": 1}, timeout_s=0.3).get(timeout=WAIT_S)
    waited = time.monotonic() - start
    assert waited < LEASE_S * 0.6, f"the caller waited {waited:.2f} s on a 0.3 s timeout"
    time.sleep(LEASE_S + 0.3)  # the lease lapses: a wait left with no caller took nothing over
    assert recorder.count("api") == 0
    (receipt,) = read_receipts([key], org_id="acme")
    assert receipt is not None and receipt.status is ReceiptStatus.QUEUED
    assert system.stats()["waiting_on_owner"] == 0


@pytest.mark.waits
def test_patient_callers_wait_on_while_impatient_ones_and_late_joiners_time_out(
    make_system: Any, open_store: Any, recorder: Any
) -> None:
    system, _ = _waiting_system(make_system, open_store, recorder, 2)
    proxy = system.proxy()
    patient = proxy.execute("api", {"n": 2}, timeout_s=30)
    impatient = proxy.execute("api", {"n": 2}, timeout_s=0.2)
    with pytest.raises(ReceiptWaitTimeoutError):
        impatient.get(timeout=WAIT_S)
    time.sleep(0.3)
    start = time.monotonic()
    joiner = proxy.execute("api", {"n": 2}, timeout_s=0.3)
    with pytest.raises(ReceiptWaitTimeoutError):
        joiner.get(timeout=WAIT_S)
    waited = time.monotonic() - start
    assert 0.2 < waited < 0.8, f"the joiner waited {waited:.2f} s on a 0.3 s timeout"
    result = patient.get(timeout=WAIT_S)  # the lease lapsed: taken over once, for the patient one
    assert (result.value, result.execution) == ({"n": 2}, "live")
    assert recorder.count("api") == 1


@pytest.mark.waits
def test_a_timeout_while_a_reclaim_is_out_is_kept_and_nothing_is_paid(
    make_system: Any, open_store: Any, recorder: Any, db_path: Any
) -> None:
    """The caller's timer fires while the wait's periodic reclaim is out (a slow store:
    another writer holds the file). It is answered then; the reclaim, which wins the
    lapsed lease, finds no caller and sends nothing (before: the timer was lost and the
    call was sent, and paid, for a caller that had given up)."""
    import sqlite3

    system, _ = _waiting_system(make_system, open_store, recorder, 3)
    start = time.monotonic()
    future = system.proxy().execute("api", {"n": 3}, timeout_s=0.4)
    time.sleep(0.15)
    lock = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    lock.execute("BEGIN IMMEDIATE")  # the next reclaim waits for the file
    try:
        with pytest.raises(ReceiptWaitTimeoutError):
            future.get(timeout=WAIT_S)
        waited = time.monotonic() - start
        assert waited < 1.0, f"the caller waited {waited:.2f} s on a 0.4 s timeout"
        time.sleep(LEASE_S - waited + 0.2)  # the foreign lease lapses meanwhile
    finally:
        lock.execute("COMMIT")
        lock.close()
    time.sleep(0.5)
    assert recorder.count("api") == 0
    assert system.stats()["waiting_on_owner"] == 0


@pytest.mark.waits
def test_the_waiting_gauge_counts_the_callers_still_waiting(
    make_system: Any, open_store: Any, recorder: Any
) -> None:
    system, _ = _waiting_system(make_system, open_store, recorder, 4)
    proxy = system.proxy()
    patient = proxy.execute("api", {"n": 4}, timeout_s=30)
    short = [proxy.execute("api", {"n": 4}, timeout_s=0.2) for _ in range(3)]
    for future in short:
        with pytest.raises(ReceiptWaitTimeoutError):
            future.get(timeout=WAIT_S)
    time.sleep(0.05)
    assert system.stats()["waiting_on_owner"] == 1
    joiners = [proxy.execute("api", {"n": 4}, timeout_s=30) for _ in range(2)]
    time.sleep(0.1)
    assert system.stats()["waiting_on_owner"] == 3
    assert all(f.get(timeout=WAIT_S).value == {"n": 4} for f in [patient, *joiners])
    assert system.stats()["waiting_on_owner"] == 0
    assert recorder.count("api") == 1
