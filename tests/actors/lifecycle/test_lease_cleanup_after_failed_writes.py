"""Leases a failed store write left held (:mod:`actors.lifecycle.cleanup`): a failed
release retried on its ladder, a claim that raised read back and its orphans released.

State-machine tests: the harness of ``conftest.py`` (fake clock, recording effects),
each ending with :meth:`Driver.assert_nothing_held`."""

from __future__ import annotations

from actors.errors import (
    ProviderUnavailableError,
    StoreError,
)
from actors.lifecycle.calls import Call
from actors.messages import (
    CleanupDue,
    ReceiptsRead,
)
from stores.types import (
    LeaseRef,
    Owner,
    Receipt,
    ReceiptStatus,
)

from .conftest import (
    Driver,
)

# -- leases a failed store write left held (actors/lifecycle/cleanup.py) ----------------------------

ME = Owner("r1", 1, "host-a", 4242, 1.0)


def _held_by(
    d: Driver, key: str, lease: str, owner: Owner = ME, status: ReceiptStatus = ReceiptStatus.QUEUED
) -> Receipt:
    return d.receipt(
        key, status, lease_id=lease, lease_owner_run_id=owner.run_id, lease_owner_attempt=owner.run_attempt,
        lease_owner_host=owner.host, lease_owner_pid=owner.pid, lease_owner_started_at=owner.started_at,
    )  # fmt: skip


def _cleanup_timer(d: Driver) -> tuple[float, CleanupDue]:
    (found,) = [(delay, m) for delay, m in d.fx.timers if isinstance(m, CleanupDue)]
    d.fx.timers.remove(found)
    return found


def _fire_cleanup(d: Driver) -> float:
    delay, message = _cleanup_timer(d)
    d.tick(delay)
    d.life.handle(message, d.now)
    d.pump()
    return delay


def _refused_at_send(d: Driver) -> tuple[Call, LeaseRef]:
    """A call claimed, then refused at send (its provider's circuit is open): released."""
    (call,) = d.drain("a")
    d.answer_claim()
    d.fx.blocked = (d.now + 5.0, True)
    d.grant()
    d.mark()
    return call, d.claimed_leases["a"]


def test_lifecycle_a_failed_release_answers_at_once_and_is_retried_until_it_lands() -> None:
    d = Driver(owner=ME)
    d.release_errors = [StoreError("database is locked"), StoreError("database is locked")]
    call, lease = _refused_at_send(d)
    assert isinstance(d.outcome(call), ProviderUnavailableError)  # nobody waits on the cleanup
    assert d.fx.released == [lease]
    assert [_fire_cleanup(d), _fire_cleanup(d)] == [1.0, 3.0]  # the ladder: 1 s, then 3 s
    assert d.fx.released == [lease] * 3  # the third release landed: no more timers
    assert not [m for _, m in d.fx.timers if isinstance(m, CleanupDue)]
    assert d.fx.counts["lease_cleanup_failed"] == 0
    d.assert_nothing_held()


def test_lifecycle_a_release_that_keeps_failing_is_given_up_after_the_ladder() -> None:
    d = Driver(owner=ME)
    d.release_errors = [StoreError("disk I/O error")] * 10
    _refused_at_send(d)
    assert [_fire_cleanup(d) for _ in range(3)] == [1.0, 3.0, 9.0]
    assert not [m for _, m in d.fx.timers if isinstance(m, CleanupDue)]
    assert d.fx.counts["lease_cleanup_failed"] == 1  # the lease then lapses at its TTL
    assert len(d.fx.released) == 4


def test_lifecycle_a_claim_that_raised_reads_back_and_releases_what_it_left_us() -> None:
    d = Driver(owner=ME)
    calls = d.drain("a", "b", "c", "d")
    d.fail_claim(StoreError("connection lost after COMMIT"))
    assert all(isinstance(d.outcome(c), StoreError) for c in calls)  # answered at once
    assert sorted(d.fx.reads[max(d.fx.reads)]) == ["a", "b", "c", "d"]
    other_run = Owner("r2", 1, "host-a", 4242, 1.0)
    other_process = Owner("r1", 1, "host-a", 999, 1.0)  # a worker started with our run id
    d.read(
        a=_held_by(d, "a", "L-a"),
        b=_held_by(d, "b", "L-b", other_run),
        c=_held_by(d, "c", "L-c", other_process),
        d=d.receipt("d", ReceiptStatus.COMPLETED, output={"v": 1}),
    )
    assert d.fx.released == [LeaseRef("a", "L-a")]  # only ours, from this process
    assert d.fx.counts["orphan_leases_released"] == 1
    d.assert_nothing_held()


def test_lifecycle_a_read_back_never_releases_a_lease_a_live_group_holds() -> None:
    d = Driver(owner=ME)
    d.drain("a")
    d.fail_claim(StoreError("connection lost after COMMIT"))
    orphan_read = max(d.fx.reads)
    d.drain("a")  # the caller asks again before the read-back is answered: claimed anew
    d.answer_claim()
    fresh = d.claimed_leases["a"]
    d.life.handle(
        ReceiptsRead(batch=orphan_read, value=[_held_by(d, "a", fresh.lease_id)], error=None), d.now
    )
    d.pump()
    assert d.fx.released == []


def test_lifecycle_a_read_back_that_fails_is_retried() -> None:
    d = Driver(owner=ME)
    d.drain("a")
    d.fail_claim(StoreError("connection lost after COMMIT"))
    d.life.handle(ReceiptsRead(batch=max(d.fx.reads), value=None, error=StoreError("still down")), d.now)
    d.pump()
    assert _fire_cleanup(d) == 1.0
    d.read(a=_held_by(d, "a", "L-a", status=ReceiptStatus.RUNNING))
    assert d.fx.released == [LeaseRef("a", "L-a")]


def test_lifecycle_without_an_owner_a_failed_claim_reads_nothing_back() -> None:
    d = Driver()
    d.drain("a")
    d.fail_claim(StoreError("connection lost after COMMIT"))
    assert d.fx.reads == {}
