"""A lease held by a process that no longer exists on this host is taken over at once.

Real processes and a real signal: a child claims receipts in a SQLite file under a
one-hour lease and is SIGKILLed; the next claim takes them over without waiting for the
TTL, with the same execution generation (so the same provider idempotency key). A live
child's leases are never taken.
"""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path
from typing import Any

from stores import ClaimDisposition, ClaimRequest, Owner, ReceiptStatus, SqliteReceiptStore

ORG = "org-a"
KEYS = [hashlib.sha256(f"lease-owner-{i}".encode()).hexdigest() for i in range(3)]
LEASE_TTL_S = 3600.0

_HOLDER = """
import json, sys
from stores import ClaimRequest, LeaseRef, Owner, SqliteReceiptStore
path, keys = (json.loads(arg) for arg in sys.argv[1:])
store = SqliteReceiptStore(path)
owner = Owner("run-child")
wanted = [ClaimRequest(k, "play", "tool", k) for k in keys]
claims = store.claim_many("org-a", wanted, owner, lease_ttl_s=3600.0)
store.mark_running_many("org-a", [LeaseRef(c.receipt.key, c.receipt.lease_id) for c in claims[:1]], owner)
print(json.dumps([c.disposition.value for c in claims]), flush=True)
sys.stdin.readline()  # hold the leases until told (or killed)
"""


def requests(retry_safe: bool = True) -> list[ClaimRequest]:
    return [ClaimRequest(k, "play", "tool", k, retry_safe=retry_safe) for k in KEYS]


def test_lease_of_sigkilled_process_is_taken_over_at_once(tmp_path: Path, children: Any) -> None:
    path = tmp_path / "receipts.db"
    SqliteReceiptStore(path).close()
    child = children.start(_HOLDER, [str(path), KEYS])
    assert children.receive(child) == ["claimed"] * len(KEYS)
    with SqliteReceiptStore(path) as store:
        held = store.get_many(ORG, KEYS)
        assert all(r is not None and r.lease_owner_pid == child.pid for r in held)
        assert [
            c.disposition for c in store.claim_many(ORG, requests(), Owner("run-next"), lease_ttl_s=60.0)
        ] == [ClaimDisposition.RUNNING] * len(KEYS)  # alive: never taken
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        taken = store.claim_many(ORG, requests(), Owner("run-next"), lease_ttl_s=60.0)
    assert [c.disposition for c in taken] == [ClaimDisposition.CLAIMED] * len(KEYS)
    for before, claim in zip(held, taken, strict=True):
        assert before is not None
        assert claim.receipt.generation == before.generation == 1  # same provider idempotency key
        assert claim.receipt.lease_owner_pid == os.getpid()


def test_running_lease_of_sigkilled_process_is_uncertain_when_not_retry_safe(
    tmp_path: Path, children
) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "receipts.db"
    SqliteReceiptStore(path).close()
    child = children.start(_HOLDER, [str(path), KEYS])
    assert children.receive(child) == ["claimed"] * len(KEYS)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    with SqliteReceiptStore(path) as store:
        answers = store.claim_many(ORG, requests(retry_safe=False), Owner("run-next"), lease_ttl_s=60.0)
        # The first key was marked running (its request may have gone out); the others only queued.
        assert [c.disposition for c in answers] == [
            ClaimDisposition.UNCERTAIN,
            ClaimDisposition.CLAIMED,
            ClaimDisposition.CLAIMED,
        ]
        assert store.get_many(ORG, KEYS[:1])[0].status is ReceiptStatus.UNCERTAIN  # type: ignore[union-attr]
