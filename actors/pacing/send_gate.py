"""Send gates: the last step before a request leaves, per (org, provider).

The governor decides admission; the gate spaces the requests that actually go out at
the governor's current rate and holds them through a provider's pause or open circuit
(see :class:`SendGate`). Shared by the tool pool's threads (or greenlets) and kept in
step by the governor actor.
"""

from __future__ import annotations

import bisect
import heapq
import math
import threading
import time
from collections.abc import Callable

import attrs

from actors.pacing.held import HeldClock
from actors.runtime.futures import bounded

__all__ = ["HEADROOM", "LATE_S", "WAKE_S", "Retake", "SendGate", "SendGates", "Turn"]

WAKE_S = 0.25
"""Longest slice a sender sleeps at its gate before looking again whether a pause or a
closure (the provider's circuit opened) voided its turn."""

HEADROOM = 1.02
"""The gates of a system space sends at this many times the governor's rate. The gate
is a second pacer in series with the governor's token bucket: at exactly the same rate
it is a queue at full utilisation, where every bunch that arrives (calls granted
together, or held up together on their way) adds a delay that never drains (in slow
start that lag let the rate run 20% past the provider's before its first 429). A
little faster than its input the queue drains; a stated rate, paced at 98% of itself
(:data:`actors.pacing.bucket.PACE_MARGIN`), is then sent at no more than the rate itself."""


LATE_S = 0.02
"""With a shared pacer, a request leaves no later than this many seconds after its grant's
slot (the moment the pacer granted it, plus the gate's spacing for each token granted with
it before it), or asks the pacer again: a request held up past its slot (its process
stalled) would otherwise reach the provider together with the requests other processes
were granted meanwhile, in a bunch no process could see."""

Retake = Callable[[], tuple[int, float]]
"""Asks the shared pacer for one token again: (tokens granted, seconds to wait when none)."""


@attrs.frozen(order=True)
class Turn:
    """A booked turn: when it is, and the gate's next free turn before and after it."""

    at: float
    before: float = attrs.field(order=False)
    after: float = attrs.field(order=False)


class SendGate:
    """Spaces the requests actually sent to one (org, provider) at its current rate.

    The governor's token bucket decides admission; between a grant and the request
    leaving (marking receipts running, thread hand-offs) delays vary, so admitted calls
    could reach the provider in bunches larger than its burst. A sender calls
    :meth:`wait_turn` right before each request. Two rules, both at ``rps``:

    * booking: each sender books the next slot, ``1 / rps`` after the previous one, and
      sleeps until it (this keeps the senders in order);
    * passing: when it wakes, its send must also conform to the Generic Cell Rate
      Algorithm (ITU-T I.371) over the sends that actually passed, with a tolerance of
      one spacing: a sender woken late (a busy event loop, a GC pause) together with
      others goes at most two back-to-back; the rest wait their spacing again.

    A stated ``burst`` B (the provider lets B requests through at once) is the GCRA
    tolerance of both rules, ``(B - 1) / rps``: B senders go at once, later ones are
    spaced at the rate, and after a quiet spell the allowance is back (one request per
    spacing of quiet, up to B). After a pause the allowance starts empty (the provider's
    429 said its own was spent).

    The governor keeps the rate current (:meth:`set_rate`) and, on a 429,
    :meth:`pause_until` re-books every sender still waiting, so requests granted before
    the 429 do not go out into the pause.

    Thread-safe (one lock; under gevent a patched, cooperative one). Time is
    ``time.monotonic`` seconds unless a clock is given.
    """

    def __init__(self, rps: float | None = None, burst: float | None = None, headroom: float = 1.0) -> None:
        self._lock = threading.Lock()
        self._rps = rps
        self._headroom = headroom
        """Sends are spaced at ``rps x headroom`` (see :data:`HEADROOM`)."""
        self._burst = max(1.0, burst or 1.0)
        self._next = -math.inf
        """Booking's theoretical time of the next slot (GCRA over bookings)."""
        self._tat = -math.inf
        """GCRA's theoretical arrival time of the next send."""
        self.waited_s = 0.0
        """Seconds senders were told to wait for their booked slot (pacing, pauses),
        added up over the senders (two waiting together count twice)."""
        self.held = HeldClock()
        """Wall time during which a sender slept here, or (kept by the governor actor)
        a tool queue waited for a slot of this (org, provider): see :mod:`actors.pacing.held`."""
        self.passed = 0
        """Sends this gate let go while it spaced them (at a rate, or after a pause)."""
        self._epoch = 0
        self._holes: list[Turn] = []
        """Turns given back while later ones were booked, earliest first (:meth:`unbook`)."""
        self._closed_until = -math.inf
        self._paused_until = -math.inf
        self._slots: list[float] = []
        """A heap of the latest send times of the tokens the shared pacer granted this
        process and no send has used yet (:meth:`grant`)."""
        self._granted = False
        """Whether a shared pacer grants this gate's sends (a send then needs a slot)."""
        self.retake: Retake | None = None
        """Asks the shared pacer again for a send whose slot went by (set by :class:`SendGates`)."""
        self.asked_again = 0
        """Sends that found no slot of their grant left and asked the shared pacer again."""

    @property
    def rps(self) -> float | None:
        """The spacing rate, requests per second (None: no spacing)."""
        return self._rps

    @property
    def paced(self) -> bool:
        """Whether a sender may have to wait here (the gate was ever paced, paused or
        closed); an unpaced gate lets every request go at once, without a lock. A read
        racing the first pause lets that request go with those already in flight."""
        return not (self._rps is None and self._epoch == 0)

    @property
    def burst(self) -> float:
        """Requests that may go back to back at the rate (1: every one spaced)."""
        return self._burst

    @property
    def next_turn(self) -> float:
        """The theoretical time of the next turn a sender would book (GCRA over bookings,
        seconds on the gate's clock; -inf: none booked since the gate was last reset): it
        moves on with each booking."""
        return self._next

    def set_rate(self, rps: float | None, now: float | None = None) -> None:
        """Space later bookings at ``rps`` (None: no spacing). With ``now``, the next turn
        and the passing rule's next send, where still to come (after any pause), move as
        the pacer's token bucket does when its rate is set: the time left to them scaled
        by old rate / new (a rate announced at the first answer lets the second request
        go at the new spacing, not at slow start's)."""
        with self._lock:
            old, self._rps = self._rps, rps
            if now is None or not old or not rps or old == rps:
                return
            base = max(now, self._paused_until)
            if self._next > base:
                self._next = base + (self._next - base) * old / rps
            if self._tat > base:
                self._tat = base + (self._tat - base) * old / rps

    def set_burst(self, burst: float | None) -> None:
        """Let ``burst`` requests go at once (None or 1: space every one)."""
        with self._lock:
            self._burst = max(1.0, burst or 1.0)

    def _spacing(self) -> float:
        """Seconds between sends at the rate (0: no spacing)."""
        return 1.0 / (self._rps * self._headroom) if self._rps else 0.0

    def _tolerance(self) -> float:
        """GCRA tolerance of bookings, seconds: ``(burst - 1)`` spacings."""
        return (self._burst - 1.0) * self._spacing()

    def grant(self, n: int, now: float, *, probe: bool = False) -> None:
        """The shared pacer granted this process ``n`` tokens at ``now``: a send may use
        each until its slot, ``now`` plus the gate's spacing for each token before it, plus
        :data:`LATE_S` (a half-open circuit's ``probe`` never lapses: asked again, the
        pacer would hold it behind itself). From the first grant on, every send through
        this gate uses one, or asks the pacer again (:meth:`wait_turn`)."""
        with self._lock:
            self._granted = True
            spacing = self._spacing()
            for i in range(n):
                heapq.heappush(self._slots, math.inf if probe else now + i * spacing + LATE_S)

    def use_slot(self, now: float) -> bool:
        """Use the first token :meth:`grant` gave whose slot has not gone by at ``now``
        (False: none left; tokens whose slots went by are dropped)."""
        with self._lock:
            slots = self._slots
            while slots and slots[0] < now:
                heapq.heappop(slots)  # its time went by: that token is spent, unsent
            if not slots:
                return False
            heapq.heappop(slots)
            return True

    def pause_until(self, until: float, rps: float | None) -> None:
        """No send before ``until``; senders already waiting book again from there."""
        with self._lock:
            self._epoch += 1
            self._holes.clear()
            self._paused_until = until
            self._rps = rps
            spacing = self._spacing()
            # an empty allowance at ``until``: the first sender goes then, the rest spaced
            self._next = until + self._tolerance()
            self._tat = until + max(spacing, self._tolerance())

    def close(self, until: float) -> None:
        """Send nothing before ``until`` (the provider's circuit opened): senders waiting
        now, and any that come before then, give up their turn (:meth:`wait_turn` returns
        False) instead of waiting for it."""
        with self._lock:
            self._epoch += 1
            self._holes.clear()
            self._closed_until = until
            # every booking is void (its sender gives up): none may hold the next sender
            # back; the passing rule still spaces the sends actually made
            self._next = -math.inf

    def blocked(self, now: float) -> tuple[float, bool] | None:
        """Whether a request may leave at ``now``: None, or (until when not, closed).

        ``closed`` is True while the provider's circuit is open. A snapshot read (no
        lock): only the governor actor changes a gate.
        """
        if now < self._closed_until:
            return self._closed_until, True
        if now < self._paused_until:
            return self._paused_until, False
        return None

    def book(self, now: float) -> tuple[float, int, Turn | None]:
        """Book the next send slot: (seconds to wait, booking epoch, the turn booked: what
        :meth:`unbook` gives back). The wait is infinite while the gate is closed (nothing
        is booked then). A turn given back earlier that is still to come is booked first
        (the schedule stays spaced)."""
        with self._lock:
            if now < self._closed_until:
                return math.inf, self._epoch, None
            tolerance = self._tolerance()
            holes = self._holes
            while holes and holes[0].at < now - tolerance:
                holes.pop(0)  # its time went by unused
            if holes:
                reused = holes.pop(0)
                at = max(now, reused.at)
                self.waited_s += at - now
                return at - now, self._epoch, reused
            at = max(now, self._next - tolerance)
            turn: Turn | None = None
            if self._rps is not None:
                before = self._next
                self._next = max(at, self._next) + self._spacing()
                turn = Turn(at, before, self._next)
            self.waited_s += at - now
            return at - now, self._epoch, turn

    def try_pass(self, now: float, epoch: int) -> float | None:
        """Pass a sender whose booking (made in ``epoch``) is due.

        Returns:
            0.0 when it may send now (the send is counted); seconds to wait before trying
            again when sends already went closer than the rate allows (infinity while the
            gate is closed); None when a pause since the booking voided it (book again).
        """
        with self._lock:
            if epoch != self._epoch:
                return None
            if now < self._closed_until:
                return math.inf
            if self._rps is None:
                self.passed += 1
                return 0.0
            spacing = self._spacing()
            tolerance = max(spacing, self._tolerance())
            if now < self._tat - tolerance:
                return self._tat - tolerance - now
            self._tat = max(now, self._tat) + spacing
            self.passed += 1
            return 0.0

    def unbook(self, epoch: int, turn: Turn | None) -> None:
        """Give back a turn booked in ``epoch`` that its sender gave up before it came
        (withdrawn, or its deadline comes first). The last turn booked is taken back (with
        any given-back turns just before it); one with later turns booked behind it is
        kept for the next sender to book (moving the later bookings up would put the next
        sender on a turn another already holds)."""
        if turn is None:
            return
        with self._lock:
            if epoch != self._epoch:
                return  # a pause or a closure voided every booking of that epoch
            if self._next != turn.after:
                bisect.insort(self._holes, turn)
                return
            self._next = turn.before
            while self._holes and self._holes[-1].after == self._next:
                self._next = self._holes.pop().before

    def _granted_slot(self, now: float) -> float:
        """A send that passed the gate at ``now`` uses a granted token whose slot has not
        gone by; without one it asks the shared pacer again. Returns 0.0 (send now) or
        the seconds to wait before trying again (infinity: never)."""
        if self.use_slot(now):
            return 0.0
        retake = self.retake
        if retake is None:
            return 0.0
        self.asked_again += 1
        try:
            granted, wait_s = retake()
        except Exception:  # a pacer answers even while its store is away; if not, send as granted
            return 0.0
        return 0.0 if granted > 0 else max(wait_s, 1e-3)

    def wait_turn(
        self,
        latest: float = math.inf,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        park: Callable[[], threading.Event | None] | None = None,
    ) -> bool:
        """Block until this sender may send.

        Args:
            latest: the last moment (clock seconds) worth sending at; a turn that would
                come later is given up without waiting for it (and its booking given back).
            stop: when set, the wait ends at once (waits on it instead of sleeping).
            park: called once, only if the sender has to wait, for the ``stop`` event of
                that wait (a sender that never waits makes none).

        Returns:
            True when it is this sender's turn; False when the turn would come after
            ``latest``, the gate is closed, or ``stop`` was set (then nothing may be sent).
        """

        def wait(seconds: float, epoch: int) -> bool:
            """Sleep ``seconds`` (False: ``stop`` was set). A long wait is cut into slices
            of :data:`WAKE_S`: a pause or a closure of the gate meanwhile (its epoch moved)
            ends it early, so the sender books again at once (or, closed, gives up)."""
            nonlocal stop, park
            seconds = bounded(seconds)
            if stop is None and park is not None and seconds > 0:
                stop, park = park(), None
            start = clock()
            end = start + seconds
            if seconds > 0:
                self.held.enter(start)
            try:
                while True:
                    left = end - clock()
                    step = min(left, WAKE_S)
                    if stop is not None:
                        if stop.wait(step) if step > 0 else stop.is_set():
                            return False
                    elif step > 0:
                        sleep(step)
                    if left <= WAKE_S or self._epoch != epoch:
                        return True
            finally:
                if seconds > 0:
                    self.held.leave(clock())

        if self._rps is None and self._epoch == 0:
            # never paced, paused or closed (an unpaced local tool): no lock, no booking. A
            # read racing the first pause lets this request go with those already in flight.
            return not (stop is not None and stop.is_set())
        while True:
            now = clock()
            delay, epoch, undo = self.book(now)
            if delay == math.inf:
                return False
            if now + delay > latest or not wait(delay, epoch):
                self.unbook(epoch, undo)  # a turn nobody will use: the next sender takes it
                return False
            while True:
                now = clock()
                extra = self.try_pass(now, epoch)
                if extra is None:
                    break  # a pause voided the booking: book again
                if extra <= 0 and not self._granted:
                    return True
                if extra <= 0:  # passed: it also needs a token of the shared pacer's
                    extra = self._granted_slot(now)
                    while 0 < extra < math.inf and now + extra <= latest and wait(extra, epoch):
                        if self._epoch != epoch:
                            break  # paused meanwhile: book again
                        now = clock()
                        extra = self._granted_slot(now)
                    if extra <= 0:
                        return True
                    if self._epoch != epoch and extra < math.inf and now + extra <= latest:
                        break
                if extra == math.inf or now + extra > latest or not wait(extra, epoch):
                    self.unbook(epoch, undo)
                    return False


class SendGates:
    """(org, provider) -> :class:`SendGate`, created on first use (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gates: dict[tuple[str, str], SendGate] = {}
        self._retake: Callable[[str, str], tuple[int, float]] | None = None

    def get(self, org_id: str, provider: str) -> SendGate:
        """The gate of (org, provider)."""
        key = (org_id, provider)
        gate = self._gates.get(key)
        if gate is None:
            with self._lock:
                gate = self._gates.get(key)
                if gate is None:
                    gate = self._gates[key] = SendGate(headroom=HEADROOM)
                    gate.retake = self._bind(org_id, provider)
        return gate

    def share(self, retake: Callable[[str, str], tuple[int, float]]) -> None:
        """Sends are granted by a shared pacer: ``retake(org, provider)`` asks it for one
        token again (tokens granted, seconds to wait when none); see :meth:`SendGate.grant`."""
        with self._lock:
            self._retake = retake
            for (org_id, provider), gate in self._gates.items():
                gate.retake = self._bind(org_id, provider)

    def _bind(self, org_id: str, provider: str) -> Retake | None:
        retake = self._retake
        if retake is None:
            return None
        return lambda: retake(org_id, provider)

    def waited_s(self) -> dict[tuple[str, str], float]:
        """(org, provider) -> seconds its senders were told to wait (see SendGate.waited_s)."""
        with self._lock:
            return {key: gate.waited_s for key, gate in self._gates.items()}

    def held_s(self, now: float) -> dict[tuple[str, str], float]:
        """(org, provider) -> seconds its calls were held back up to ``now`` (see SendGate.held)."""
        with self._lock:
            return {key: gate.held.held_s(now) for key, gate in self._gates.items()}
