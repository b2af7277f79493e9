"""State-machine tests of the leases held back from the heartbeat (actors.heartbeat.deferred_beats)."""

from __future__ import annotations

from actors.heartbeat.deferred_beats import MAX_DEFER_S, DeferredBeats
from stores.types import LeaseRef


def _leases(*keys: str) -> list[LeaseRef]:
    return [LeaseRef(key, f"lease-{key}") for key in keys]


def test_deferred_beats_a_lease_let_go_of_in_time_never_reaches_the_heartbeat() -> None:
    beats = DeferredBeats(interval_s=20.0)
    assert beats.add(_leases("a", "b")) is True  # arm the timer
    assert beats.add(_leases("c")) is False  # already armed
    assert beats.drop(["a", "c"]) == []  # held back: nothing to unregister
    assert beats.due() == _leases("b")  # the timer registers what is still held
    assert beats.drop(["b"]) == ["b"]  # registered: the heartbeat must unregister it
    assert beats.due() == []


def test_deferred_beats_the_timer_is_armed_again_for_leases_after_it_fired() -> None:
    beats = DeferredBeats(interval_s=20.0)
    assert beats.add(_leases("a")) is True
    assert beats.due() == _leases("a")
    assert beats.add(_leases("b")) is True


def test_deferred_beats_delay_stays_well_inside_the_renewal_interval() -> None:
    assert DeferredBeats(interval_s=20.0).delay_s == MAX_DEFER_S
    assert DeferredBeats(interval_s=0.4).delay_s == 0.1  # a quarter interval
    assert DeferredBeats(interval_s=20.0, defer=False).delay_s == 0.0  # gevent: at once
