"""The governor's pacing done by a :class:`~actors.pacing.pacers.Pacer` (shared through Redis).

:class:`SharedPacing` is the :class:`~actors.governor.decisions.GovernorPacing` of a
governor made by :func:`shared_governor`: its rate, Retry-After pauses and circuit live in
the pacer, so every worker process pointed at the same pacer paces one provider together. What stays
in this process: budgets, the global ceiling (``Policy.max_concurrency``) and each
provider's ``max_concurrency`` (both are per process), the send gates, and the counters of
the pacing report.

Mapping of the governor's steps onto the pacer:

* ``wake``: the local circuit, ``bucket.available`` and ``bucket.take`` are replaced by
  ``pacer.take(org, provider, n, partial=True)``; the tokens granted go to the send
  gate (``Decisions.granted``): a request leaves within its slot or asks the pacer
  again; ``refuse`` refuses the waiters and
  closes the send gate; nothing granted blocks the waiters until ``now + wait_s`` (and a
  ``paused`` verdict pauses this process's send gate, so senders respect another worker's
  pause); a grant is charged and its rate version remembered.
* ``backpressure``: ``pacer.pause`` with ``cut_version`` = the version of the last grant
  made at or before the 429'd request was sent (several 429s of one congestion event, from
  any worker, cut once).
* ``release``: for a stated rate ``pacer.grow`` (AIMD additive increase, summed over the
  successes, back to the stated rate after a cut); for an unknown limit ``pacer.learn``
  (the successes join every worker's count; the worker holding the learner lease runs
  the :class:`~actors.pacing.learner.LimitLearner` of them all and publishes its rate: see
  :mod:`actors.pacing.shared_learner`); then ``pacer.record`` (the circuit); when it opens,
  waiters are refused and the gate closed. While the pacer is away (its local fallback
  answers), an unknown limit grows by AIMD on this worker's share, as a stated one.

Every method runs on the governor actor's thread; each pacer call is one round trip.
"""

from __future__ import annotations

import bisect
import os
import random
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from actors.governor.decisions import BucketKey, Decisions, Governor, GovernorPacing
from actors.pacing.bucket import (
    AIMD_INCREASE_FRACTION,
    AIMD_MIN_RPS,
    MIN_WAKE_S,
    SLOW_START_DOUBLING_S,
    ProviderBucket,
)
from actors.pacing.pacers import Pacer
from actors.pacing.shared_learner import SharedLearner, mirror
from actors.pacing.values import PacerSettings, ProviderLimits
from actors.tool import Pacing, Policy

WAIT_POLL_S = 1.0
"""Longest a worker told to wait asks the shared pacer again: another worker's half-open
probe settling wakes nobody here, and its claim lasts ``probe_lease_s`` (30 s), so without
this a worker could stall that long after the circuit had closed."""

__all__ = ["SharedPacing", "shared_governor"]

KEPT_VERSIONS = 64
"""Grants remembered per bucket (time, rate version) to find a 429'd request's version."""


class SharedPacing(GovernorPacing):
    """A governor's pacing done by ``pacer`` (see the module docstring).

    Args:
        pacer: the pacer (the caller closes it).
        policy: the governor's policy: its circuit settings, when the pacer's were not chosen.
        pacings: provider name -> Pacing; a provider the pacer has no limits for gets
            :meth:`ProviderLimits.from_pacing` of its Pacing.
    """

    def __init__(self, pacer: Pacer, policy: Policy, pacings: dict[str, Pacing]) -> None:
        self.pacer = pacer
        for name, pacing in pacings.items():
            pacer.limits.setdefault(name, ProviderLimits.from_pacing(pacing))
        if pacer.settings == PacerSettings():  # not chosen by its maker: the policy's circuit
            pacer.settings = PacerSettings.from_policy(policy)
        self.grants_at: dict[BucketKey, list[tuple[float, int]]] = {}
        """(org, provider) -> (grant time, rate version), oldest first."""
        self._version = 0
        """The rate version of the grant :meth:`grantable` last made."""
        self.shared: dict[BucketKey, tuple[float | None, float | None, bool]] = {}
        """(org, provider) -> (rate, reference rate, slow start) as the pacer last said."""
        self.roles: dict[BucketKey, SharedLearner] = {}
        """(org, provider) of an unknown limit -> this worker's learner role."""
        self.holder = f"{os.getpid()}:{secrets.token_hex(4)}"
        """This governor's name for the learner lease."""
        self.probing: dict[BucketKey, bool] = {}
        """(org, provider) whose half-open probe this worker was granted and has not yet
        reported -> whether a nested call has it: a probe given back unsent releases the
        shared claim at once (else every worker would wait out the probe lease)."""

    def acquired(self, key: BucketKey, now: float, out: Decisions) -> None:
        """A first request during another worker's pause starts this process's send gate
        paused too."""
        bucket = self.gov.buckets.get(key)
        if bucket is not None and bucket.gate_until > now:
            out.gates[key] = (bucket.rate, bucket.gate_until)

    def unpaced(self, key: BucketKey) -> bool:
        """Never: the shared pacer decides each grant (one round trip)."""
        return False

    def grantable(
        self, wkey: tuple[str, str, bool], want: int, bucket: ProviderBucket, now: float, out: Decisions
    ) -> int | None:
        """What the pacer grants (one round trip); None when its circuit is open."""
        key = (wkey[0], wkey[1])
        if not wkey[2]:  # per-process ceilings; nested calls borrow their parent's slot
            free = self.gov.ceiling - self.gov.in_flight
            if bucket.max_concurrency is not None:
                free = min(free, bucket.max_concurrency - bucket.in_flight)
            want = min(want, free)
        if want < 1:
            return 0  # only a release can help
        role = self.roles.get(key)
        if role is not None and role.due(now):  # the learner looks while it waits, too
            self._learn(key, bucket, 0, now, out)
        grant = self.pacer.take(key[0], key[1], want, partial=True)
        self._saw(key, grant.rate_rps, grant.reference_rps, grant.slow_start, out)
        if grant.verdict == "refuse":
            out.closed[key] = now + grant.wait_s
            return None
        if grant.granted < 1:
            wait = max(grant.wait_s, MIN_WAKE_S)
            if grant.verdict == "wait":  # (a probe out may be another worker's: its verdict
                wait = min(wait, WAIT_POLL_S)  # wakes nobody here; ask again soon, not at its lease's end)
            again = now + wait
            out.wake_at = again if out.wake_at is None else min(out.wake_at, again)
            if grant.verdict == "paused":  # another worker's 429: hold this process's senders too
                bucket.gate_until = max(bucket.gate_until, again)
                out.gates[key] = (grant.rate_rps, bucket.gate_until)
            return 0
        self._version = grant.version
        if grant.verdict == "probe":
            self.probing[key] = wkey[2]
        out.granted.append((key, grant.granted, grant.verdict == "probe"))
        return grant.granted

    def take(self, wkey: tuple[str, str, bool], bucket: ProviderBucket, n: int, now: float) -> None:
        """Count the grant against this process's ceilings; remember its rate version."""
        if not wkey[2]:
            bucket.in_flight += n
            self.gov.in_flight += n
        seen = self.grants_at.setdefault((wkey[0], wkey[1]), [])
        seen.append((now, self._version))
        del seen[:-KEPT_VERSIONS]

    def next_wake(self, now: float, out: Decisions) -> float | None:
        """The earliest time the pacer said to ask again (gathered by :meth:`grantable`)."""
        return out.wake_at

    def backpressure(
        self,
        org_id: str,
        provider: str,
        retry_after: Any,
        now: float,
        wall: float,
        sent_at: float | None = None,
    ) -> Decisions:
        """Pause (org, provider) for every worker and cut the shared rate once per event."""
        key = (org_id, provider)
        if _is_date(retry_after):  # read against the clock the workers share, not this host's
            wall = self.pacer.wall_time(wall)
        pause = self.gov.pause_s(retry_after, wall)
        pause += self.gov.rng() * min(1.0, 0.1 * pause)
        bucket = self.gov.bucket(org_id, provider)
        seen = self.grants_at.get(key, [])
        at = len(seen) if sent_at is None else bisect.bisect_right(seen, (sent_at, 1 << 62))
        cut_version = seen[at - 1][1] if at else None
        paused = self.pacer.pause(org_id, provider, pause, cut_version=cut_version)
        bucket.backpressure_events += 1
        if paused.cut:  # this worker's 429 began a congestion event (the report's per-run cuts)
            bucket.cuts += 1
        bucket.pauses.append((now, paused.pause_s, None if retry_after is None else str(retry_after)))
        del bucket.pauses[:-16]
        bucket.gate_until = max(bucket.gate_until, now + paused.pause_s)
        out = self.gov.wake(now)
        self._saw(key, paused.rate_rps, paused.reference_rps, paused.slow_start, out)
        role = self.roles.get(key)
        if paused.cut and role is not None and role.learner is not None:  # the learner is here: cut now
            self._learn(key, bucket, 0, now, out)
        out.gates[key] = (bucket.rate, bucket.gate_until)
        return out

    def release(
        self,
        org_id: str,
        provider: str,
        count: int,
        successes: int,
        now: float,
        unavailable: int = 0,
        answered: int | None = None,
        exempt: bool = False,
        refunds: int = 0,
        sent_at: Sequence[float] = (),
    ) -> Decisions:
        """Return slots; grow the shared rate by ``successes``; feed the shared circuit.
        (``sent_at`` is not used: the shared learner counts every worker's answers.)"""
        key = (org_id, provider)
        bucket = self.gov.bucket(org_id, provider)
        self.gov.return_slots(bucket, count, exempt, refunds)
        out = Decisions()
        if bucket.learner is None or not self._learn(key, bucket, successes, now, out):
            self._grow(key, bucket, successes, out)
        answered_n = successes if answered is None else answered
        refusals = []
        # the probe's slot came back with no verdict (not sent, or an outcome that says
        # nothing of the provider, such as a nested call's error passed on): let go of it,
        # so the next call probes at once (else every worker waited out its 30 s claim)
        # (only once no slot of the probe's kind is out: the slot back may be another call's,
        # granted before the circuit opened, and the probe still out)
        unsent_probe = key in self.probing and not self.gov.probe_out(key, self.probing[key])
        if answered_n or unavailable or unsent_probe:
            self.probing.pop(key, None)  # reported (record(0, 0): the probe claim is let go)
            recorded = self.pacer.record(org_id, provider, answered=answered_n, unavailable=unavailable)
            if recorded.opened:
                refusals = self.gov.refuse_waiters(key)
                out.closed[key] = now + recorded.open_s
        woken = self.gov.wake(now)
        woken.refusals.extend(refusals)
        woken.closed.update(out.closed)
        woken.gates = {**out.gates, **woken.gates}
        return woken

    def _grow(self, key: BucketKey, bucket: ProviderBucket, successes: int, out: Decisions) -> None:
        """AIMD growth of the shared rate (slow start's doubling while in it)."""
        org_id, provider = key
        rate, ref, slow = self.shared.get(key, (bucket.rate, None, bucket.slow_start))
        limits = self.pacer.limits.get(provider) or ProviderLimits()
        capped = limits.max_rps is not None and rate is not None and rate >= limits.max_rps
        if successes and rate is not None and not capped:
            if slow:
                grown = self.pacer.grow(
                    org_id,
                    provider,
                    mul=2.0 ** (successes / (max(rate, AIMD_MIN_RPS) * SLOW_START_DOUBLING_S)),
                )
            else:
                step = AIMD_INCREASE_FRACTION * (ref or rate) / max(rate, AIMD_MIN_RPS)
                grown = self.pacer.grow(org_id, provider, add_rps=successes * step)
            self._saw(key, grown.rate_rps, grown.reference_rps, grown.slow_start, out)

    def _learn(
        self, key: BucketKey, bucket: ProviderBucket, successes: int, now: float, out: Decisions
    ) -> bool:
        """Count ``successes`` for the shared learner; learn and publish when this worker
        holds its lease (two round trips when the rate changes, else one). False when the
        pacer is away (the caller grows the local share instead)."""
        org_id, provider = key
        role = self.roles.setdefault(key, SharedLearner())
        got = self.pacer.learn(org_id, provider, successes, self.holder)
        if got.degraded:
            role.step(got, now)  # drops the role: the counts are this worker's alone
            return False
        self._saw(key, got.rate_rps, got.reference_rps, got.slow_start, out)
        publish = role.step(got, now)
        if publish is not None:
            got = self.pacer.learn(org_id, provider, 0, self.holder, publish)
            self._saw(key, got.rate_rps, got.reference_rps, got.slow_start, out)
        if role.learner is not None:
            bucket.learner = role.learner  # the report shows the learner itself
        elif bucket.learner is not None:
            mirror(bucket.learner, got)  # (a learner this worker held and lost is no longer fed)
        return True

    def refresh_report(self, now: float) -> None:
        """Before a pacing report: each unknown limit's published estimate (one read each)."""
        for key, role in self.roles.items():
            bucket = self.gov.buckets.get(key)
            if bucket is None or bucket.learner is None or role.learner is not None:
                continue
            got = self.pacer.learn(key[0], key[1], 0, "")
            if not got.degraded:
                mirror(bucket.learner, got)

    def _saw(self, key: BucketKey, rate: float | None, ref: float | None, slow: bool, out: Decisions) -> None:
        """Keep the pacer's rate; retime this process's send gate when it changed."""
        before = self.shared.get(key)
        self.shared[key] = (rate, ref, slow)
        bucket = self.gov.buckets.get(key)
        if bucket is not None:
            bucket.rate, bucket.slow_start = rate, slow
        if before is None or before[0] != rate:
            out.gates.setdefault(key, (rate, None))


def shared_governor(
    policy: Policy,
    pacings: dict[str, Pacing],
    pacer: Pacer,
    rng: Callable[[], float] = random.random,
) -> Governor:
    """A :class:`~actors.governor.decisions.Governor` whose pacing is a :class:`SharedPacing`
    over ``pacer`` (its state: ``governor.pacing``).

    Args:
        policy: as :class:`~actors.governor.decisions.Governor`.
        pacings: provider name -> Pacing; a provider the pacer has no limits for gets
            :meth:`ProviderLimits.from_pacing` of its Pacing.
        pacer: the pacer (the caller closes it).
        rng: jitter source.
    """
    return Governor(policy, pacings, rng, SharedPacing(pacer, policy, pacings))


def _is_date(retry_after: Any) -> bool:
    """A Retry-After given as a date (an HTTP-date text or a datetime), not seconds."""
    if retry_after is None or isinstance(retry_after, (int, float)):
        return False
    try:
        float(str(retry_after).strip())
    except ValueError:
        return True
    return False
