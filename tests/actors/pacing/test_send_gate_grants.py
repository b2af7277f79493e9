"""A send gate whose sends a shared pacer grants (``SendGate.grant``): a request leaves
within its grant's slot, or asks the pacer again. Fake clock and sleep."""

from __future__ import annotations

import math

import pytest

from actors.pacing.send_gate import LATE_S, SendGate, SendGates

from .test_bucket import FakeTime


class Pacer:
    """The shared pacer's answers to a send asking again: one grant per ``every`` seconds."""

    def __init__(self, fake: FakeTime, every: float) -> None:
        self.fake, self.every = fake, every
        self.asked: list[float] = []
        self.next_at = -math.inf

    def retake(self) -> tuple[int, float]:
        now = self.fake.now
        self.asked.append(now)
        if now >= self.next_at:
            self.next_at = now + self.every
            return 1, 0.0
        return 0, self.next_at - now


def _gate(fake: FakeTime, every: float = 0.01) -> tuple[SendGate, Pacer]:
    gate = SendGate(100.0)
    pacer = Pacer(fake, every)
    gate.retake = pacer.retake
    return gate, pacer


def test_a_send_within_its_grants_slot_goes_without_asking_again() -> None:
    fake = FakeTime(10.0)
    gate, pacer = _gate(fake)
    gate.grant(1, 10.0)
    fake.now = 10.0 + LATE_S / 2
    assert gate.wait_turn(clock=fake.clock, sleep=fake.sleep) is True
    assert pacer.asked == []


def test_a_send_late_past_its_grants_slot_asks_the_pacer_again_and_waits_for_its_answer() -> None:
    fake = FakeTime(10.0)
    gate, pacer = _gate(fake, every=0.3)
    pacer.next_at = 10.5  # the others took the tokens until then
    gate.grant(1, 10.0)
    fake.now = 10.22  # its process stalled after the grant
    assert gate.wait_turn(clock=fake.clock, sleep=fake.sleep) is True
    assert pacer.asked == [pytest.approx(10.22), pytest.approx(10.5)]
    assert fake.now == pytest.approx(10.5)  # left when the pacer granted it again
    assert gate.asked_again == 2


def test_tokens_granted_together_have_slots_a_spacing_apart() -> None:
    fake = FakeTime(0.0)
    gate, pacer = _gate(fake)
    gate.grant(3, 0.0)
    spacing = 1 / gate.rps  # type: ignore[operator]
    fake.now = 2 * spacing + LATE_S - 1e-6  # the third token's slot still lasts
    assert gate.use_slot(fake.now) is True
    assert gate.use_slot(fake.now) is False  # the first two went by unused
    assert pacer.asked == []


def test_a_send_with_no_slot_left_and_no_time_for_the_pacers_next_token_is_not_sent() -> None:
    fake = FakeTime(10.0)
    gate, pacer = _gate(fake, every=5.0)
    pacer.next_at = 12.0
    gate.grant(1, 9.0)
    assert gate.wait_turn(latest=11.0, clock=fake.clock, sleep=fake.sleep) is False
    assert fake.slept == []  # gave up without waiting
    assert gate.book(10.0)[0] == 0.0  # its turn was given back


def test_a_half_open_probe_never_lapses() -> None:
    fake = FakeTime(10.0)
    gate, pacer = _gate(fake)
    gate.grant(1, 0.0, probe=True)
    assert gate.wait_turn(clock=fake.clock, sleep=fake.sleep) is True
    assert pacer.asked == []


def test_a_gate_no_shared_pacer_granted_sends_without_slots() -> None:
    fake = FakeTime(10.0)
    gate, pacer = _gate(fake)
    assert gate.wait_turn(clock=fake.clock, sleep=fake.sleep) is True
    assert pacer.asked == []


def test_send_gates_shared_ask_their_own_bucket_again() -> None:
    gates = SendGates()
    before = gates.get("acme", "a")
    asked: list[tuple[str, str]] = []
    gates.share(lambda org, provider: (asked.append((org, provider)), (1, 0.0))[1])
    after = gates.get("acme", "b")
    assert before.retake is not None and after.retake is not None
    assert before.retake() == (1, 0.0) and after.retake() == (1, 0.0)
    assert asked == [("acme", "a"), ("acme", "b")]
