"""What persistence shares: the latch (the persistence circuit breaker), the completion
ladder's back-off, and what happened to each completion (:class:`FlushOutcome`,
:func:`fence_outcomes`). Owned and used by :mod:`actors.flusher.actor` (and by a
tool queue actor's own first write of its outputs, :mod:`actors.queue.ports`); re-exported
there."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

import attrs

from stores.types import RefusalReason

__all__ = ["FlushOutcome", "Latch", "OutcomeKind", "fence_outcomes", "ladder_backoff"]


OutcomeKind = Literal["persisted", "completed_by_other", "lease_lost", "salvaged", "refused"]


@attrs.frozen
class FlushOutcome:
    """What happened to one member's completion.

    ``persisted``: stored. ``completed_by_other``: someone else's output is stored
    (``output`` holds it). ``lease_lost``: our lease was taken; output salvaged.
    ``salvaged``: could not be stored; kept in the salvage file. ``refused``: the store
    refused this member alone (``error`` says why: too large, not JSON).
    """

    kind: OutcomeKind
    output: Any = None
    error: str = ""
    reason: str = ""
    """For ``refused``: the store's RefusalReason value (``output_too_large``, ...)."""


class Latch:
    """The persistence circuit breaker of one dispatcher, owned by the completion flusher.

    Only the flusher actor trips it (its own give-up, or a :class:`TripLatch` message
    from a lifecycle whose failure write failed); other threads read it as a snapshot
    (``tripped``, then ``reason``). The trip takes ``lock``, which the last check before
    each request also takes (:class:`actors.worker.launch.Launch`): once :meth:`trip` has
    returned, no provider call starts. Once tripped it stays tripped. Calls refused
    because of it are counted in the system's stats (``refused_by_latch``).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        """Held while tripping, and by each send's last check."""
        self.reason = ""
        self.tripped = False
        self.on_trip: Callable[[], None] | None = None
        """Called once, after the trip, outside the lock (wakes senders waiting at gates)."""

    def trip(self, reason: str) -> None:
        """Open the circuit (idempotent; the first reason is kept). Flusher thread only."""
        with self.lock:
            if self.tripped:
                return
            self.reason = reason
            self.tripped = True
        if self.on_trip is not None:
            self.on_trip()


def ladder_backoff(
    failures: int,
    ladder: Sequence[float],
    now: float,
    deadline: float | None,
    headroom_s: float,
    tripped: bool,
) -> float | None:
    """Seconds to wait before the next write attempt, or None to give up.

    Args:
        failures: failed attempts so far (>= 1).
        ladder: the back-offs, seconds.
        now / deadline: monotonic seconds; deadline None means no run deadline.
        headroom_s: give up when the deadline leaves less than back-off + this.
        tripped: the latch is already tripped (give up at once).
    """
    if tripped or failures > len(ladder):
        return None
    backoff = ladder[failures - 1]
    if deadline is not None and deadline - now < backoff + headroom_s:
        return None
    return backoff


def fence_outcomes(report: Any, keys: Sequence[str]) -> list[tuple[FlushOutcome, bool]]:
    """What the FenceReport of a ``complete_many`` says of each of ``keys`` (same order):
    its outcome, and whether its output must be salvaged before its callers hear back
    (our lease was lost, or the receipt is gone)."""
    out: list[tuple[FlushOutcome, bool]] = []
    for key in keys:
        refusal = report.refused.get(key)
        if refusal is None:
            out.append((FlushOutcome("persisted"), False))
        elif refusal.reason is RefusalReason.COMPLETED_BY_OTHER and refusal.receipt is not None:
            out.append((FlushOutcome("completed_by_other", refusal.receipt.output), False))
        elif refusal.reason in (RefusalReason.LEASE_LOST, RefusalReason.MISSING):
            out.append((FlushOutcome("lease_lost", error=refusal.message), True))
        else:
            out.append((FlushOutcome("refused", error=refusal.message, reason=refusal.reason.value), False))
    return out
