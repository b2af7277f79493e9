"""The governor actor: runs :class:`~actors.governor.decisions.Governor` and performs its decisions.

It resolves grant and refusal replies, keeps the send gates' rates, pauses and closures
in step with the governor's buckets, and arms one wake-up timer. With a shared pacer it
runs a :func:`~actors.governor.shared.shared_governor` instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pykka

from actors.errors import BudgetExceededError, CallCancelledError
from actors.governor.decisions import Decisions, Governor
from actors.governor.shared import shared_governor
from actors.messages import (
    AcquireSlots,
    BackpressureReported,
    ChargeBudget,
    GovernorWake,
    RefundBudget,
    ReleaseSlots,
)
from actors.pacing.bucket import pacing_report
from actors.pacing.send_gate import SendGates
from actors.runtime.actor import Timers, guarded
from actors.runtime.futures import fail
from actors.runtime.inbox import answer_left, left_in
from actors.tool import Pacing, Policy

__all__ = ["GovernorActor"]


class GovernorActor(pykka.ThreadingActor):
    """Runs the :class:`Governor`; all its methods run on this actor's thread.

    ``gates`` are the send gates the tool pool waits at before each request; the
    actor keeps their rate and pauses in step with the buckets (its clock must be
    ``time.monotonic``, the gates' clock, when gates are shared). With ``pacer`` (an
    :class:`~actors.pacing.pacers.Pacer`, closed by its owner), rates, pauses and circuits
    are those of the pacer (:func:`~actors.governor.shared.shared_governor`). ``fairness``:
    the (key, weight) its takes carry (the run's fair share of a shared pacer).
    """

    use_daemon_thread = True  # as InboxActor's: stopped at exit by actors.runtime.at_exit

    def __init__(
        self,
        policy: Policy,
        pacings: dict[str, Pacing],
        timers: Timers,
        gates: SendGates | None = None,
        clock: Callable[[], float] = time.monotonic,
        pacer: Any = None,
        fairness: tuple[str | None, float] = (None, 1.0),
    ) -> None:
        super().__init__()
        key, weight = fairness
        self.governor = (
            Governor(policy, pacings, fairness_key=key, fairness_weight=weight)
            if pacer is None
            else shared_governor(policy, pacings, pacer, fairness_key=key, fairness_weight=weight)
        )
        self.timers = timers
        self.gates = gates if gates is not None else SendGates()
        if pacer is not None:  # a send whose grant's slot went by asks the pacer again
            self.gates.share(lambda org_id, provider: _take_one(pacer, org_id, provider, key, weight))
        self.clock = clock
        self._armed: float | None = None
        self._holding: set[tuple[str, str]] = set()
        """(org, provider) whose calls wait for a slot now: each holds its gate's
        :class:`~actors.pacing.held.HeldClock` while it has waiters."""

    @guarded
    def on_receive(self, message: Any) -> Any:
        now = self.clock()
        if isinstance(message, AcquireSlots):
            gov = self.governor
            self._perform(
                gov.acquire(
                    message.org_id,
                    message.provider,
                    message.want,
                    message.reply,
                    now,
                    message.exempt,
                    message.immediate,
                    message.prices,
                    message.units,
                    message.patience_s,
                )
            )
        elif isinstance(message, ReleaseSlots):
            gov = self.governor
            self._perform(
                gov.release(
                    message.org_id, message.provider, message.count, message.successes, now,
                    unavailable=message.unavailable, answered=message.answered, exempt=message.exempt,
                    refunds=message.refunds, sent_at=message.sent_at, unspent=message.unspent,
                    unsent_units=message.unsent_units, usage=message.usage, announced=message.announced,
                )
            )  # fmt: skip
        elif isinstance(message, BackpressureReported):
            gov = self.governor
            self._perform(
                gov.backpressure(
                    message.org_id, message.provider, message.retry_after, now, time.time(), message.sent_at
                )
            )
        elif isinstance(message, GovernorWake):
            self._armed = None
            self._perform(self.governor.wake(now))
        elif isinstance(message, ChargeBudget):
            try:
                self.governor.charge(message.kind, message.amount)
                message.reply.set(True)
            except BudgetExceededError as exc:
                fail(message.reply, exc)
        elif isinstance(message, RefundBudget):
            self.governor.refund(message.kind, message.amount)
        self._note_held(now)
        return None

    def _note_held(self, now: float) -> None:
        """Hold the held clock of each (org, provider) while its calls wait for slots."""
        waiting = {(w[0], w[1]) for w, queue in self.governor.waiters.items() if queue}
        if waiting == self._holding:
            return
        for org_id, provider in waiting - self._holding:
            self.gates.get(org_id, provider).held.enter(now)
        for org_id, provider in self._holding - waiting:
            self.gates.get(org_id, provider).held.leave(now)
        self._holding = waiting

    def _perform(self, decisions: Decisions) -> None:
        for (org_id, provider), burst in decisions.bursts.items():
            self.gates.get(org_id, provider).set_burst(burst)
        for (org_id, provider), (rate, until) in decisions.gates.items():
            gate = self.gates.get(org_id, provider)
            if until is None:
                gate.set_rate(rate, self.clock())
            else:
                gate.pause_until(until, rate)
        for (org_id, provider), until in decisions.closed.items():
            self.gates.get(org_id, provider).close(until)
        if decisions.granted:
            now = self.clock()
            for (org_id, provider), n, probe in decisions.granted:
                self.gates.get(org_id, provider).grant(n, now, probe=probe)
        for reply, n in decisions.grants:
            reply.set(n)
        for reply, exc in decisions.refusals:
            fail(reply, exc)
        if decisions.wake_at is not None and (self._armed is None or decisions.wake_at < self._armed):
            self._armed = decisions.wake_at
            ref = self.actor_ref
            self.timers.call_later(decisions.wake_at - self.clock(), lambda: ref.tell(GovernorWake()))

    def on_stop(self) -> None:
        """Requests left unread are refused (their requesters wait on each), never dropped."""
        answer_left(left_in(self.actor_inbox), CallCancelledError("the dispatcher is stopping"))

    def stop_waiters(self) -> None:
        """Refuse all waiters (called through the proxy at system stop)."""
        self._perform(self.governor.stop())
        self._note_held(self.clock())

    def pacing_report(self) -> dict[str, dict[str, Any]]:
        """Per (org, provider) pacing: rate and how it was learnt, limit estimate, pauses,
        429s, circuit state, time waited (see :func:`actors.pacing.bucket.pacing_report`)."""
        gov = self.governor
        gov.refresh_report(self.clock())
        now = self.clock()
        return pacing_report(gov.buckets, now, self.gates.waited_s(), self.gates.held_s(now))


def _take_one(pacer: Any, org_id: str, provider: str, key: str | None, weight: float) -> tuple[int, float]:
    """One token of ``pacer`` for a send asking again (on the sender's thread: a pacer's
    calls may come from any thread), for fairness ``key``: (granted, seconds to wait when none)."""
    grant = pacer.take(org_id, provider, 1, partial=True, key=key, weight=weight)
    return grant.granted, grant.wait_s
