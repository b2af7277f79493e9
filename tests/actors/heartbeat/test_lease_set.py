"""State-machine tests of the heartbeat lease set, driven by a fake clock."""

from __future__ import annotations

import threading

import pytest

from actors.heartbeat.actor import LeaseSet, Renewal
from actors.messages import RegisterLeases
from stores.types import LeaseRef, Owner

OWNER = Owner("run-1", 1)
TTL_S = 3.0
INTERVAL_S = 1.0  # a third of the TTL


def _reg(token: int, keys: list[str], *, deadline: float = 1_000.0) -> RegisterLeases:
    return RegisterLeases(
        token=token,
        org_id="acme",
        owner=OWNER,
        leases=tuple(LeaseRef(k, f"lease-{k}") for k in keys),
        lease_ttl_s=TTL_S,
        deadline=deadline,
        lost=threading.Event(),
    )


def _leases() -> LeaseSet:
    return LeaseSet(lambda ttl: ttl / 3.0)


def test_lease_set_renews_every_interval() -> None:
    leases = _leases()
    leases.register(_reg(1, ["a", "b"]), now=100.0)
    assert leases.due(100.0) == []
    assert leases.due(100.0 + INTERVAL_S - 0.01) == []
    (renewal,) = leases.due(101.0)
    assert renewal == Renewal(1, "acme", OWNER, (LeaseRef("a", "lease-a"), LeaseRef("b", "lease-b")), TTL_S)
    assert leases.due(101.5) == []  # renewed: next one is an interval later
    assert [r.token for r in leases.due(102.0)] == [1]
    assert [r.token for r in leases.due(103.0)] == [1]


def test_lease_set_interval_comes_from_the_lease_ttl() -> None:
    leases = LeaseSet(lambda ttl: ttl / 4.0)
    reg = RegisterLeases(
        token=7, org_id="acme", owner=OWNER, leases=(LeaseRef("a", "l"),),
        lease_ttl_s=8.0, deadline=1_000.0, lost=threading.Event(),
    )  # fmt: skip
    leases.register(reg, now=0.0)
    assert leases.next_tick(0.0) == 2.0
    assert leases.due(1.9) == []
    assert [r.lease_ttl_s for r in leases.due(2.0)] == [8.0]


def test_lease_set_late_tick_renews_once_and_reschedules_from_now() -> None:
    leases = _leases()
    leases.register(_reg(1, ["a"]), now=0.0)
    assert len(leases.due(5.5)) == 1  # ticks were late (a busy host): one renewal
    assert leases.due(5.9) == []
    assert leases.next_tick(5.9) == pytest.approx(6.5)


def test_lease_set_drops_a_registration_past_its_deadline() -> None:
    leases = _leases()
    leases.register(_reg(1, ["a"], deadline=2.5), now=0.0)
    assert len(leases.due(1.0)) == 1
    assert len(leases.due(2.0)) == 1
    assert leases.due(2.5) == []  # past the hard deadline: no renewal
    assert leases.entries == {}
    assert leases.next_tick(2.5) is None
    assert leases.due(3.0) == []


def test_lease_set_refused_keys_are_dropped_and_registration_returned() -> None:
    leases = _leases()
    reg = _reg(1, ["a", "b"])
    leases.register(reg, now=0.0)
    leases.due(1.0)
    found = leases.refused(1, {"a"})
    assert found is reg
    assert not reg.lost.is_set()  # setting it (and telling the owner) is the actor's effect
    (renewal,) = leases.due(2.0)
    assert renewal.leases == (LeaseRef("b", "lease-b"),)  # "a" is not renewed again
    assert leases.lost_keys == ["a"]


def test_lease_set_refusing_every_lease_drops_the_registration() -> None:
    leases = _leases()
    reg = _reg(1, ["a", "b"])
    leases.register(reg, now=0.0)
    assert leases.refused(1, {"a", "b"}) is reg
    assert leases.entries == {}
    assert leases.due(10.0) == []
    assert sorted(leases.lost_keys) == ["a", "b"]


def test_lease_set_refused_with_no_keys_or_unknown_token_is_nothing() -> None:
    leases = _leases()
    leases.register(_reg(1, ["a"]), now=0.0)
    assert leases.refused(1, set()) is None
    assert leases.refused(99, {"a"}) is None
    assert leases.lost_keys == []
    assert len(leases.due(1.0)) == 1


def test_lease_set_unregister_stops_renewals() -> None:
    leases = _leases()
    leases.register(_reg(1, ["a"]), now=0.0)
    leases.register(_reg(2, ["b"]), now=0.0)
    leases.unregister(1)
    leases.unregister(1)  # idempotent
    assert [r.token for r in leases.due(1.0)] == [2]
    leases.unregister(2)
    assert leases.next_tick(1.0) is None


def test_lease_set_next_tick_is_min_of_next_due_and_deadline() -> None:
    leases = _leases()
    assert leases.next_tick(0.0) is None
    leases.register(_reg(1, ["a"]), now=0.0)  # due at 1.0
    leases.register(_reg(2, ["b"], deadline=0.4), now=0.0)  # deadline first
    assert leases.next_tick(0.0) == pytest.approx(0.4)
    leases.due(0.4)  # drops registration 2
    assert leases.next_tick(0.4) == pytest.approx(1.0)
    leases.register(_reg(3, ["c"]), now=0.6)  # due at 1.6
    assert leases.next_tick(0.6) == pytest.approx(1.0)
    leases.due(1.0)
    assert leases.next_tick(1.0) == pytest.approx(1.6)


def test_lease_set_registrations_tick_independently() -> None:
    leases = _leases()
    leases.register(_reg(1, ["a"]), now=0.0)
    leases.register(_reg(2, ["b"]), now=0.5)
    seen = []
    for step in range(1, 9):
        now = step * 0.5
        seen += [(now, r.token) for r in leases.due(now)]
    assert seen == [(1.0, 1), (1.5, 2), (2.0, 1), (2.5, 2), (3.0, 1), (3.5, 2), (4.0, 1)]


def test_lease_set_unregister_keys_removes_them_from_every_registration() -> None:
    leases = _leases()
    leases.register(_reg(1, ["a", "b"]), now=0.0)
    leases.register(_reg(2, ["c"]), now=0.0)
    leases.unregister(-1, ("a", "c"))
    (renewal,) = leases.due(1.0)
    assert renewal.leases == (LeaseRef("b", "lease-b"),)
    assert set(leases.entries) == {1}


def test_lease_set_failed_renewal_is_retried_well_before_the_lease_lapses() -> None:
    leases = _leases()
    leases.register(_reg(1, ["a"]), now=0.0)
    assert len(leases.due(1.0)) == 1  # renewal due at 1.0; say it raised
    leases.retry_soon(1, now=1.0)
    assert leases.next_tick(1.0) == pytest.approx(1.0 + INTERVAL_S / 4)
    assert len(leases.due(1.0 + INTERVAL_S / 4)) == 1
