"""One estimate of an unknown limit for every worker sharing a pacer (a plain state machine).

A provider whose limit is unknown is learnt by :class:`~actors.pacing.learner.LimitLearner`
(slow start, then a plateau just under the limit estimated from the responses the
provider *accepted*, probed rarely). When several worker processes pace that provider
through one shared pacer (:mod:`actors.governor.shared`), one worker at a time runs the
learner, for all of them:

* **The role is a lease** in the pacer (:meth:`~actors.pacing.pacers.Pacer.learn`: ``SET
  NX PX``, renewed by each ``learn`` of its holder, ``learner_lease_s``). Every worker
  asks for it on each ``learn``; when the holder dies or goes quiet the lease lapses and
  the next worker that learns takes it over, adopting the published state (rate, phase,
  limit estimate, cuts) as its learner's start (:func:`adopt`). A lease, not an
  election, as in Gray and Cheriton, "Leases" (SOSP 1989): a holder that is gone costs
  at most one lease period.
* **Its inputs are everyone's.** Each worker adds its accepted responses to a shared
  count (``learn``, one round trip per release, as the old AIMD growth was); the holder
  feeds the count's growth since its last look to the learner. Congestion events are
  the pacer's: a ``pause`` with the version the 429'd request was granted under cuts
  once per event, from any worker (RFC 6582's one reduction per window); the pacer
  keeps when the last event happened and the count at that moment, so the holder feeds
  the learner what was accepted before it, then the event, then the rest.
* **Its output is the shared rate**, published with ``learn`` (without a version bump,
  so a 429 for a request granted before a publication is still a new event) together
  with the limit estimate, phase and cuts, which every worker's pacing report shows.
  Between a 429 and the holder's next look, the pacer's own cut (half in slow start,
  else 0.8) holds: at most one release of the holder later, the learner's rate replaces
  it.

Times are seconds on the caller's clock (the pacer's replies are relative to the call).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from actors.pacing.learner import LimitLearner
from actors.pacing.values import Learnt

__all__ = ["LOOK_S", "PUBLISH_TOLERANCE", "SharedLearner", "adopt", "mirror"]

PUBLISH_TOLERANCE = 0.005
"""The learner's rate is published when it differs from the shared rate by more than
this share of itself (or its phase, estimate or cuts changed)."""
LOOK_S = 0.1
"""The lease holder looks at the shared counts at least this often while it asks for
grants, not only when its own calls end: a holder that lost the race for tokens for
seconds (four workers waking for one token each time) once fed slow start 25 answers
at once, and the rate jumped 32-fold past what the provider had seen."""


def adopt(got: Learnt, now: float) -> LimitLearner:
    """A learner starting from the published state in ``got`` (a new lease holder): the
    rate, phase, estimate and cuts; the plateau held (or the probe run) from ``now``,
    measuring from the end of the shared pause."""
    learner = LimitLearner(rate=got.rate_rps)
    if got.rate_rps is None:
        return learner
    phase = "slow_start" if got.slow_start or got.limit_rps is None else got.phase
    learner.phase = phase if phase != "unpaced" else "slow_start"
    learner.limit_rps, learner.cuts = got.limit_rps, got.cuts
    learner.phase_since = now
    learner.measure_from = now + max(0.0, got.pause_in_s)
    if got.events:
        learner.last_cut_at = now - got.event_ago_s
    if got.limit_rps is not None:
        learner.cut_from_rps = min(got.rate_rps, got.limit_rps)
    learner.held_rps = got.rate_rps
    return learner


def mirror(learner: LimitLearner, got: Learnt) -> None:
    """Show the published estimate in ``learner`` (a follower's, read by the pacing
    report only): rate, phase, limit estimate, cuts."""
    learner.rate, learner.limit_rps, learner.cuts = got.rate_rps, got.limit_rps, got.cuts
    learner.phase = "slow_start" if got.slow_start and got.rate_rps is not None else got.phase


@attrs.define
class SharedLearner:
    """The learner role of one (org, provider) in one worker (see the module doc).

    Attributes:
        learner: the learner, while this worker holds the lease (else None).
        seen_accepted / seen_events: the shared counts as this worker's learner last saw them.
    """

    learner: LimitLearner | None = None
    seen_accepted: int = 0
    seen_events: int = 0
    looked_at: float = -math.inf
    tolerance: float = PUBLISH_TOLERANCE
    """The learner's rate is published when it differs from the pacer's by more than this
    share of itself (0 for a pacer of this process alone, where publishing costs no round
    trip: the pacer then paces at the learner's rate exactly)."""

    def due(self, now: float) -> bool:
        """Whether this worker holds the lease and has not looked for :data:`LOOK_S`."""
        return self.learner is not None and now >= self.looked_at + LOOK_S

    def step(
        self, got: Learnt, now: float, own: int = 0, sent_at: Sequence[float] = ()
    ) -> tuple[float, bool, float | None, str, int] | None:
        """Feed a ``learn`` reply to the learner (when ``got.leader``); what to publish,
        as :meth:`~actors.pacing.pacers.Pacer.learn`'s ``publish``, or None.

        ``own``: the responses this worker's ``learn`` added (a learner adopted now starts
        with them); ``sent_at``: when those requests were sent (``now``'s clock, where
        known); the others count as sent when answered."""
        self.looked_at = now
        if not got.leader or got.degraded:
            self.learner = None  # a local fallback's counts are not everyone's: adopt again later
            return None
        learner = self.learner
        if learner is None:
            self.learner = learner = adopt(got, now)
            self.seen_accepted, self.seen_events = got.accepted - own, got.events
        if got.events > self.seen_events:
            at = now - got.event_ago_s
            before = got.event_accepted - self.seen_accepted
            if before > 0:
                learner.on_accepted(before, at, got.in_use)
            self.seen_accepted = max(self.seen_accepted, got.event_accepted)
            resume_at = now + got.pause_in_s
            if learner.rate is None:  # an unpaced provider's first 429: slow start from the pacer's rate
                learner.start_slow(got.rate_rps or 0.0, at)
                learner.last_cut_at, learner.measure_from = at, resume_at
            else:  # the pacer already judged it a new event: sent after the last cut
                learner.on_congestion(at, resume_at, sent_at=at)
            self.seen_events = got.events
        fresh = got.accepted - self.seen_accepted
        if fresh > 0:
            times = list(sent_at)[:fresh]
            for sent in times:
                learner.on_accepted(1, now, got.in_use, sent)
            if fresh > len(times):
                learner.on_accepted(fresh - len(times), now, got.in_use)
            self.seen_accepted = got.accepted
        if learner.rate is None:
            return None
        same = (
            got.rate_rps is not None
            and abs(got.rate_rps - learner.rate) <= self.tolerance * learner.rate
            and got.limit_rps == learner.limit_rps
            and got.phase == learner.phase
            and got.cuts == learner.cuts
            and got.slow_start == (learner.phase == "slow_start")
        )
        if same:
            return None
        return (learner.rate, learner.phase == "slow_start", learner.limit_rps, learner.phase, learner.cuts)
