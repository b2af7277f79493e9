"""The last check before a request leaves, made on the worker that sends it.

A tool queue checks a call (the latch, a stop, whether its callers still want it) when
it hands the attempt to the worker pool, but the request does not leave then: the worker
may first wait for its turn at the provider's send gate (pacing, a Retry-After pause)
and build a batch's payload. :class:`Launch` makes the final decision at the moment of
sending, under one lock that the latch's trip, the system's stop and a caller's
withdrawal also take, so each attempt is either sent or refused, never both, and once
the latch has tripped or the stop has begun no request leaves (SEMANTICS.md, "Latch and
salvage" and "Stopping and cancellation").

Each attempt carries a :class:`SendTicket`. Its worker :meth:`Launch.take` s it right
before calling the tool (or the batch operation); its tool queue may
:meth:`Launch.withdraw` it first (every caller cancelled, the lease lost). A sender
waiting at a gate is woken at once by a withdrawal, a trip or a stop.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from actors.errors import CallCancelledError, PersistenceCircuitOpenError
from actors.lifecycle.attempts import Refusal, SendTicket, WithdrawKind

if TYPE_CHECKING:
    from actors.flusher.latch import Latch

__all__ = ["Launch"]


class Launch:
    """The send decisions of one dispatch system (thread- and greenlet-safe).

    Args:
        latch: the system's latch; its trip takes this object's lock (``latch.lock``),
            so no attempt is taken once :meth:`Latch.trip` has returned.
    """

    def __init__(self, latch: Latch) -> None:
        self._latch = latch
        self._lock = latch.lock
        self._stopped: BaseException | None = None
        self._waiting: set[SendTicket] = set()
        latch.on_trip = self._wake_all

    def take(self, ticket: SendTicket | None) -> Refusal | None:
        """On the worker, right before the request: None to send now (the ticket is taken),
        or why not (the ticket was withdrawn, the latch tripped, the system stopped)."""
        with self._lock:
            latch = self._latch
            tripped, stopped = latch.tripped, self._stopped
            own = ticket.refusal if ticket is not None else None
            if own is not None:  # its own refusal (a cancel, a lost lease) is its answer
                return own
            if tripped:
                refusal: Refusal = ("latch", PersistenceCircuitOpenError(f"latch tripped: {latch.reason}"))
            elif stopped is not None:
                refusal = ("stopped", stopped)
            else:
                if ticket is not None:
                    ticket.sent = True
                return None
            if ticket is not None:
                ticket.refusal = refusal
            return refusal

    def refusal(self, ticket: SendTicket | None) -> Refusal | None:
        """Why ``ticket`` would be refused now (withdrawn, tripped, stopped), or None;
        it is not taken either way (a sender that gave up its turn asks this)."""
        with self._lock:
            if ticket is not None and ticket.refusal is not None:
                return ticket.refusal
        if self._latch.tripped or self._stopped is not None:
            return self.take(ticket)  # refused: taking records the refusal, sends nothing
        return None

    def withdraw(self, ticket: SendTicket | None, kind: WithdrawKind, error: BaseException) -> bool:
        """On the tool queue: take back an attempt not sent yet. Returns False when its
        worker took it already (the request is out; it is persisted as usual)."""
        if ticket is None:
            return False
        with self._lock:
            if ticket.sent:
                return False
            if ticket.refusal is None:
                ticket.refusal = (kind, error)
            wake = ticket.wake
        if wake is not None:
            wake.set()
        return True

    def park(self, ticket: SendTicket | None) -> threading.Event | None:
        """Before a wait at the send gate: the event that ends it early (a withdrawal, a
        trip, a stop), already set when the attempt is refused. Pair with :meth:`unpark`."""
        if ticket is None:
            return None
        wake = threading.Event()
        with self._lock:
            ticket.wake = wake
            self._waiting.add(ticket)
            refused = ticket.refusal is not None or self._latch.tripped or self._stopped is not None
        if refused:
            wake.set()
        return wake

    def unpark(self, ticket: SendTicket | None) -> None:
        """The wait at the gate is over."""
        if ticket is None:
            return
        with self._lock:
            self._waiting.discard(ticket)
            ticket.wake = None

    def stop(self) -> None:
        """The system stops: no attempt is taken from now on (each is refused as
        cancelled), and senders waiting at their gates wake at once."""
        with self._lock:
            if self._stopped is None:
                self._stopped = CallCancelledError("the dispatcher stopped before the call started")
        self._wake_all()

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopped is not None

    def _wake_all(self) -> None:
        with self._lock:
            events = [t.wake for t in self._waiting if t.wake is not None]
        for event in events:
            event.set()
