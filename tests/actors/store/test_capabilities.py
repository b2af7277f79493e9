"""A store of another make that declares no capabilities works with the defaults.

A third-party store subclasses ``ReceiptStore`` and implements its abstract methods only
(here by handing each to a real SQLite store, with ``claim_many`` as written before claims
into running). The dispatch system then runs one call at a time, commits nothing together,
never passes ``running`` to ``claim_many`` and keeps the salvage log in the working
directory's default place.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from actors import RunInfo, Tool
from actors.system import DispatchSystem
from stores import (
    Claim,
    ClaimMode,
    ClaimRequest,
    Completion,
    Failure,
    FenceReport,
    LeaseRef,
    Owner,
    Receipt,
    ReceiptStatus,
    ReceiptStore,
    ResolveAction,
    SqliteReceiptStore,
    StoreCapabilities,
)

from ..conftest import WAIT_S

ORG = "org-c"
ME = Owner("run-c", 1)


class Delegating(ReceiptStore):
    """The abstract methods only, each handed to ``inner``; no capabilities declared."""

    def __init__(self, inner: SqliteReceiptStore) -> None:
        self.inner = inner

    def claim_many(  # type: ignore[override]  # as written before claims into running
        self, org_id: str, requests: Sequence[ClaimRequest], owner: Owner, *, lease_ttl_s: float,
        mode: ClaimMode = ClaimMode.NORMAL, stale_after_s: float | None = None,
    ) -> list[Claim]:  # fmt: skip
        return self.inner.claim_many(
            org_id, requests, owner, lease_ttl_s=lease_ttl_s, mode=mode, stale_after_s=stale_after_s
        )

    def mark_running_many(
        self, org_id: str, leases: Sequence[LeaseRef], owner: Owner, *, lease_ttl_s: float | None = None
    ) -> FenceReport:
        return self.inner.mark_running_many(org_id, leases, owner, lease_ttl_s=lease_ttl_s)

    def renew_leases(
        self, org_id: str, leases: Sequence[LeaseRef], owner: Owner, *, lease_ttl_s: float
    ) -> FenceReport:
        return self.inner.renew_leases(org_id, leases, owner, lease_ttl_s=lease_ttl_s)

    def complete_many(self, org_id: str, completions: Sequence[Completion], owner: Owner) -> FenceReport:
        return self.inner.complete_many(org_id, completions, owner)

    def fail_many(self, org_id: str, failures: Sequence[Failure], owner: Owner) -> FenceReport:
        return self.inner.fail_many(org_id, failures, owner)

    def mark_uncertain_many(self, org_id: str, failures: Sequence[Failure], owner: Owner) -> FenceReport:
        return self.inner.mark_uncertain_many(org_id, failures, owner)

    def release(self, org_id: str, leases: Sequence[LeaseRef], owner: Owner) -> FenceReport:
        return self.inner.release(org_id, leases, owner)

    def resolve(
        self, org_id: str, key: str, action: ResolveAction, *, output: object = None, note: str = ""
    ) -> Receipt | None:
        return self.inner.resolve(org_id, key, action, output=output, note=note)

    def purge_epoch(self) -> int:
        return self.inner.purge_epoch()

    def get_many(self, org_id: str, keys: Sequence[str]) -> list[Receipt | None]:
        return self.inner.get_many(org_id, keys)

    def purge(
        self,
        *,
        older_than_s: float = 0.0,
        statuses: Iterable[ReceiptStatus] | None = None,
        org_id: str | None = None,
    ) -> int:
        return self.inner.purge(older_than_s=older_than_s, statuses=statuses, org_id=org_id)


def test_store_capabilities_defaults_on_a_store_that_declares_none(open_store: Any) -> None:
    store = Delegating(open_store())
    assert store.capabilities == StoreCapabilities()
    assert store.capabilities.parallel_calls == 1 and not store.capabilities.group_commit
    assert not store.capabilities.claims_into_running and store.capabilities.file_path is None


def test_store_capabilities_sqlite_and_its_file(open_store: Any, db_path: Path) -> None:
    store = open_store()
    assert store.capabilities == StoreCapabilities(
        group_commit=True,
        claims_into_running=True,
        batch_records=True,
        bounded_waits=True,
        file_path=str(db_path),
    )
    with SqliteReceiptStore(":memory:") as memory:
        assert memory.capabilities.file_path is None


def test_store_capabilities_a_store_without_them_runs_calls(open_store: Any, make_system: Any) -> None:
    """Straight-into-running admission is used, yet ``running`` never reaches the store:
    its claims are marked running before the call is sent."""
    store = Delegating(open_store())
    seen: list[ReceiptStatus | None] = []

    def fn(i: Any, c: Any) -> Any:
        (receipt,) = store.get_many(ORG, [c.receipt_keys[0]])
        seen.append(receipt.status if receipt else None)
        return {"n": i["n"]}

    system: DispatchSystem = make_system([Tool(tool_id="t", fn=fn)], store=store, org_id=ORG)
    assert system.proxy().execute("t", {"n": 1}).get(timeout=WAIT_S).value == {"n": 1}
    assert system.proxy().execute("t", {"n": 1}).get(timeout=WAIT_S).execution == "cached"
    assert seen == [ReceiptStatus.RUNNING]


def test_store_capabilities_write_together_default_runs_each_alone(open_store: Any) -> None:
    store = Delegating(open_store())
    (claim,) = store.claim_many(ORG, [ClaimRequest("k1", "s", "t", "h")], ME, lease_ttl_s=60.0)
    lease = LeaseRef("k1", claim.receipt.lease_id or "")
    outcomes = store.write_together(
        [
            ("mark_running_many", (ORG, [lease], ME), {"lease_ttl_s": 60.0}),
            ("release", (ORG, [LeaseRef("k1", "not-the-lease")], ME), {}),
            ("release", (ORG, None, ME), {}),
        ]
    )
    assert outcomes[0][0].applied == ("k1",) and outcomes[0][1] is None
    assert outcomes[1][0].applied == () and "k1" in outcomes[1][0].refused
    assert outcomes[2][0] is None and outcomes[2][1] is not None  # its own error
    with pytest.raises(ValueError, match="claim_many"):
        store.write_together([("claim_many", (ORG, [], ME), {"lease_ttl_s": 1.0})])
    (receipt,) = store.get_many(ORG, ["k1"])
    assert receipt is not None and receipt.status is ReceiptStatus.RUNNING


def test_a_store_that_is_not_a_receipt_store_is_refused_at_start(db_path: Any) -> None:
    """A duck-typed store has no declared capabilities: start says so, before any actor."""

    class Duck:
        def __init__(self, inner: SqliteReceiptStore) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    inner = SqliteReceiptStore(db_path)
    try:
        with pytest.raises(TypeError, match=r"store must be a stores\.ReceiptStore"):
            DispatchSystem.start(
                tools=[Tool(tool_id="t", fn=lambda i, c: i)],
                store=Duck(inner),
                run=RunInfo(run_id="r", org_id="o", scope="s"),
            )  # type: ignore[arg-type]
    finally:
        inner.close()
