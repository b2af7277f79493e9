"""How long a provider's calls were held back by pacing, as wall time (a plain counter).

Calls of one provider wait for pacing in several places at once: tool queues waiting for
slots at the governor, senders waiting for their turn at the send gate. Adding their
waits up counts the same second once per waiter (two tool queues waiting together for
100 s added up to 200 s in a 101 s run). A :class:`HeldClock` instead runs while at
least one holder is in: the union of the waits, never more than the time it observed.
"""

from __future__ import annotations

import threading

__all__ = ["HeldClock"]


class HeldClock:
    """Seconds during which at least one holder was in (thread-safe).

    Each wait is bracketed by :meth:`enter` and :meth:`leave` with times from one
    monotonic clock (seconds); :meth:`held_s` is the total time the count of holders in
    was above zero, up to ``now``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._since = 0.0
        self._total = 0.0

    def enter(self, now: float) -> None:
        """A holder starts waiting at ``now``."""
        with self._lock:
            if self._inside == 0:
                self._since = now
            self._inside += 1

    def leave(self, now: float) -> None:
        """A holder stops waiting at ``now`` (a leave with nobody in changes nothing)."""
        with self._lock:
            if self._inside == 0:
                return
            self._inside -= 1
            if self._inside == 0:
                self._total += max(0.0, now - self._since)

    def held_s(self, now: float) -> float:
        """Seconds held so far, counting a wait still going on up to ``now``."""
        with self._lock:
            running = max(0.0, now - self._since) if self._inside else 0.0
            return self._total + running
