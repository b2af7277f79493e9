"""A stated burst: the send gate lets that many requests go at once, then paces
(GCRA with a tolerance of ``burst - 1`` spacings; fake clock, no threads)."""

from __future__ import annotations

import pytest

from actors.governor.decisions import Governor
from actors.pacing.send_gate import SendGate
from actors.tool import Pacing, Policy


def test_send_gate_burst_lets_that_many_go_at_once_then_spaces() -> None:
    gate = SendGate(10.0, burst=5)
    waits = [gate.book(0.0)[0] for _ in range(7)]
    assert waits[:5] == [0.0] * 5
    assert waits[5:] == pytest.approx([0.1, 0.2])


def test_send_gate_burst_passes_that_many_back_to_back() -> None:
    gate = SendGate(10.0, burst=5)
    bookings = [gate.book(0.0) for _ in range(6)]
    passes = [gate.try_pass(0.0, epoch) for _, epoch, _ in bookings[:5]]
    assert passes == [0.0] * 5
    assert gate.try_pass(0.0, bookings[5][1]) == pytest.approx(0.1)  # the sixth waits a spacing


def test_send_gate_burst_allowance_comes_back_one_per_spacing_of_quiet() -> None:
    gate = SendGate(10.0, burst=4)
    for _ in range(4):
        gate.try_pass(0.0, gate.book(0.0)[1])
    # 0.2 s quiet: two spacings of allowance back, not the whole burst
    waits = [gate.book(0.2)[0] for _ in range(4)]
    assert waits[:2] == [0.0, 0.0]
    assert waits[2] > 0.0
    # long quiet: the whole burst again, never more
    assert [gate.book(10.0)[0] for _ in range(5)][:4] == [0.0] * 4
    assert gate.book(10.0)[0] > 0.0


def test_send_gate_allowance_starts_empty_after_a_pause() -> None:
    gate = SendGate(10.0, burst=5)
    gate.pause_until(2.0, 10.0)
    waits = [gate.book(0.0)[0] for _ in range(3)]
    assert waits == pytest.approx([2.0, 2.1, 2.2])
    bookings = [gate.book(3.0) for _ in range(2)]
    assert gate.try_pass(3.0, bookings[0][1]) == 0.0


def test_send_gate_set_burst_changes_the_tolerance() -> None:
    gate = SendGate(10.0)
    assert [gate.book(0.0)[0] for _ in range(2)] == pytest.approx([0.0, 0.1])
    gate.set_burst(3)
    assert gate.burst == 3
    assert gate.book(5.0)[0] == 0.0
    assert gate.book(5.0)[0] == 0.0
    assert gate.book(5.0)[0] == 0.0
    assert gate.book(5.0)[0] == pytest.approx(0.1)


def test_send_gate_counts_the_time_senders_were_told_to_wait() -> None:
    gate = SendGate(10.0)
    for _ in range(3):
        gate.book(0.0)
    assert gate.waited_s == pytest.approx(0.0 + 0.1 + 0.2)


def test_governor_grants_a_stated_burst_at_once_and_hands_it_to_the_send_gate() -> None:
    governor = Governor(Policy(), {"p": Pacing(rps=100 / 60, burst=50)})
    out = governor.acquire("org", "p", 50, "reply", now=0.0)
    assert out.grants == [("reply", 50)]
    assert out.bursts == {("org", "p"): 50}
    later = governor.acquire("org", "p", 1, "next", now=0.0)
    assert later.grants == [] and later.bursts == {}  # spent: the 51st waits for the rate
