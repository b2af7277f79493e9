"""The last check before a request (``actors.worker.launch.Launch``), as a plain class.

Its point is that two threads never both win: a worker taking a ticket and a tool queue
withdrawing it, or a worker taking one while the latch trips. Under the GIL the window
between reading a ticket and marking it sent is a few bytecodes, too short to hit by
chance, so these tests hold it open: a ticket whose ``refusal`` read waits until the
other side has had its go (bounded, so the version with a lock does not deadlock).
Without the lock the other side slips into the window and both win; the tests fail.
They run on threads, and under gevent on greenlets (the wait yields to the other one).
"""

from __future__ import annotations

import threading
from typing import Any

from actors.errors import CallCancelledError, PersistenceCircuitOpenError
from actors.flusher.latch import Latch
from actors.lifecycle.attempts import SendTicket
from actors.worker.launch import Launch

HOLD_S = 0.3
"""How long a held read waits for the other side (then it goes on)."""


class HeldTicket(SendTicket):
    """A ticket whose first ``refusal`` read (inside ``take``) waits for ``proceed`` after
    reading, so ``take`` goes on with what it read before the other side acted."""

    __slots__ = ("inside", "proceed", "reads")

    def __init__(self) -> None:
        super().__init__()
        self.inside = threading.Event()
        self.proceed = threading.Event()
        self.reads = 0

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if name == "refusal" and object.__getattribute__(self, "reads") == 0:
            object.__setattr__(self, "reads", 1)
            object.__getattribute__(self, "inside").set()
            object.__getattribute__(self, "proceed").wait(HOLD_S)  # the value read is now old
        return value


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    return thread, out


def test_launch_a_take_and_a_withdraw_never_both_win() -> None:
    launch = Launch(Latch())
    ticket = HeldTicket()
    taker, took = _in_thread(lambda: launch.take(ticket))
    assert ticket.inside.wait(5.0)
    withdrew = launch.withdraw(ticket, "cancelled", CallCancelledError("gone"))
    ticket.proceed.set()
    taker.join(5.0)
    sent = took == [None]
    assert sent != withdrew, f"sent: {sent}, withdrawn: {withdrew}"
    assert ticket.sent is sent


def test_launch_once_the_trip_returned_no_ticket_is_taken() -> None:
    latch = Latch()
    launch = Launch(latch)
    ticket = HeldTicket()
    taker, took = _in_thread(lambda: launch.take(ticket))
    assert ticket.inside.wait(5.0)
    latch.trip("writes failed")  # a take already deciding finishes first, or is refused
    sent_at_trip = ticket.sent
    ticket.proceed.set()
    taker.join(5.0)
    assert (took == [None]) is sent_at_trip, "a ticket was taken after the latch had tripped"
    later = SendTicket()
    refusal = launch.take(later)
    assert refusal is not None and refusal[0] == "latch" and not later.sent
    assert isinstance(refusal[1], PersistenceCircuitOpenError)


def test_launch_once_stop_returned_no_ticket_is_taken() -> None:
    launch = Launch(Latch())
    ticket = HeldTicket()
    taker, took = _in_thread(lambda: launch.take(ticket))
    assert ticket.inside.wait(5.0)
    launch.stop()
    sent_at_stop = ticket.sent
    ticket.proceed.set()
    taker.join(5.0)
    assert (took == [None]) is sent_at_stop, "a ticket was taken after the stop"
    refusal = launch.take(SendTicket())
    assert refusal is not None and refusal[0] == "stopped"
    assert isinstance(refusal[1], CallCancelledError)


def test_launch_a_sender_waiting_at_its_gate_is_woken_by_each_refusal() -> None:
    latch = Latch()
    launch = Launch(latch)
    tickets = [SendTicket() for _ in range(3)]
    wakes = [launch.park(t) for t in tickets]
    assert wakes[0] is not None and not any(w.is_set() for w in wakes if w is not None)
    launch.withdraw(tickets[0], "cancelled", CallCancelledError("gone"))
    assert [w.is_set() for w in wakes if w is not None] == [True, False, False]  # that one alone
    launch.unpark(tickets[0])
    latch.trip("writes failed")
    assert all(w.is_set() for w in wakes if w is not None)
    assert launch.take(tickets[0]) == tickets[0].refusal  # its own refusal stays its answer
    # a sender that parks once refused does not wait at all
    late = launch.park(SendTicket())
    assert late is not None and late.is_set()


def test_launch_withdraw_after_the_take_is_refused_and_keeps_the_send() -> None:
    launch = Launch(Latch())
    ticket = SendTicket()
    assert launch.take(ticket) is None
    assert launch.withdraw(ticket, "cancelled", CallCancelledError("gone")) is False
    assert ticket.sent and ticket.refusal is None
    assert launch.take(None) is None  # attempts without a ticket (tests, reconcile) just go
