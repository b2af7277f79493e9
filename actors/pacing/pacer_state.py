"""The pacing state of one (org, provider) in Python: the rules of the Redis script.

:class:`BucketState` is the Redis script (``actors/pacing/pacer.lua``) line for line: GCRA
take (ITU-T I.371), shared pause with a once-per-event cut (TCP NewReno's rule, RFC 6582),
AIMD growth while the rate is in use (RFC 7661), the circuit with one half-open probe, the
learner lease and the counts an unknown limit is learnt from. It is the engine of
:class:`actors.pacing.pacers.LocalPacer` (and of a
:class:`~actors.pacing.redis_pacer.RedisPacer` whose Redis is away); the conformance test
(``tests/actors/pacing/shared/test_pacer_rules_conformance.py``) holds the script to it.

Typed operations in (:data:`~actors.pacing.values.PacerOp`), typed replies out, time passed
in as float seconds; no strings.

**Fair shares.** A take may name a fairness key (a run, a customer) and its weight
(:attr:`~actors.pacing.values.Take.key`). Beside the bucket's GCRA each key has its own,
at its *share* of the rate: its weight over its own plus the weights of the other keys
that took within ``fair_window_s`` and were granted fewer tokens than they asked (they
want more); its burst is scaled alike (at least 1). While such keys exist, a key's take
must conform to both GCRAs (its wait is the later of the two); with none, it may use the
whole rate and owes its own GCRA at most its share's burst, so it yields at once to a
key that comes to want more. Keys that all want more get their weighted shares exactly
(the bucket's GCRA keeps their sum within the rate); a key wanting less than its share
leaves the rest to the others (weighted max-min fairness, as a weighted fair queue
serves its flows, Demers, Keshav and Shenker, SIGCOMM 1989); an idle key drops out
after the window.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from actors.pacing.bucket import (
    AIMD_CAREFUL_FROM,
    AIMD_INCREASE_FRACTION,
    AIMD_MAX_STEP_PER_CALL,
    AIMD_MIN_RPS,
    SLOW_START_DOUBLING_S,
)
from actors.pacing.values import (
    PHASES,
    CircuitRecorded,
    Grant,
    Grow,
    Grown,
    Learn,
    Learnt,
    PacerOp,
    PacerSettings,
    PacerState,
    Pause,
    Paused,
    ProviderLimits,
    ReadState,
    Record,
    Rejoin,
    SetRate,
    Take,
)

__all__ = ["BucketState", "Contender", "growth"]


def growth(rate: float, reference: float | None, slow_start: bool, successes: int) -> Grow:
    """The growth ``successes`` successful calls earn a rate of ``rate`` requests/s.

    In slow start the rate doubles every :data:`~actors.pacing.bucket.SLOW_START_DOUBLING_S`
    worth of them (RFC 5681's slow start in rate form); else each adds
    :data:`~actors.pacing.bucket.AIMD_INCREASE_FRACTION` of ``reference`` (the rate before
    the last cut; None: ``rate``) per second at this rate (AIMD), but near the reference at
    most :data:`~actors.pacing.bucket.AIMD_MAX_STEP_PER_CALL` of the rate (CUBIC's shape,
    RFC 9438). The :class:`Grow` applies only while the rate is in use (RFC 7661).
    """
    if slow_start:
        return Grow(mul=2.0 ** (successes / (max(rate, AIMD_MIN_RPS) * SLOW_START_DOUBLING_S)))
    ref = reference or rate
    step = AIMD_INCREASE_FRACTION * ref / max(rate, AIMD_MIN_RPS)
    if AIMD_CAREFUL_FROM * ref <= rate <= ref / AIMD_CAREFUL_FROM:
        step = min(step, AIMD_MAX_STEP_PER_CALL * rate)
    return Grow(add_rps=successes * step)


@attrs.define
class Contender:
    """One fairness key of a bucket (:attr:`~actors.pacing.values.Take.key`); the fields are
    the script's (``pacer.lua``'s ``KEYS[4]``)."""

    tat: float = 0.0
    """The key's own GCRA time: where its grants stand at its share of the rate."""
    seen: float = 0.0
    """Its last take (granted or not)."""
    weight: float = 1.0
    """Its weight, as its last take said."""
    wants: int = 0
    """1: its last take was granted fewer tokens than it asked (it has work waiting)."""


@attrs.define
class BucketState:
    """State of one (org, provider); the fields are the script's (``pacer.lua``'s header)."""

    tat: float = 0.0
    rate: float = 0.0
    ref: float = 0.0
    ver: int = 0
    ss: int = 0
    used: float = -1.0
    """Grants, decayed (-1: none yet; the first starts it at the rate itself, in use)."""
    used_at: float = 0.0
    pause: float = 0.0
    c_fail: int = 0
    c_open: float = 0.0
    c_period: float = 0.0
    c_probe: float = 0.0
    acc: float = 0.0
    ev: int = 0
    ev_at: float = 0.0
    ev_acc: float = 0.0
    lim: float = 0.0
    ph: int = 0
    cuts: int = 0
    aw_n: int = 0
    aw_share: float = 0.0
    aw_at: float = 0.0
    aw_until: float = 0.0
    phase: float | None = None
    """A local share of a shared rate (not in the script): grants keep to the grid of
    ``phase + j / rate`` (seconds), so that the workers' shares, started ``1 / (workers x
    rate)`` apart, stay out of phase (a take late for its point uses that point)."""
    shares: dict[str, Contender] = attrs.field(factory=dict)
    """Fairness key -> its :class:`Contender` (the script's ``KEYS[4]``); a key idle past
    ``fair_window_s`` with nothing owed is forgotten at the next keyed take."""
    holder: str = ""
    """The learner lease (the script's ``KEYS[3]``): its holder, until ``lease_until``."""
    lease_until: float = 0.0
    fresh: bool = True
    _burst_arg: float = -1.0
    _use_window: float = 0.5

    def handle(self, op: PacerOp, now: float, limits: ProviderLimits, settings: PacerSettings) -> PacerState:
        """Apply ``op`` at ``now`` (seconds) to this bucket, started from ``limits``.

        Returns:
            The reply of ``op``'s kind: :class:`Grant` for :class:`Take`, :class:`Paused`
            for :class:`Pause`, :class:`Grown` for :class:`Grow`, :class:`CircuitRecorded`
            for :class:`Record`, :class:`Learnt` for :class:`Learn`, else :class:`PacerState`.

        Raises:
            TypeError: ``op`` is not a pacer operation.
        """
        self._burst_arg = -1.0 if limits.burst is None else float(limits.burst)
        self._use_window = settings.use_window_s
        if self.fresh:
            self.rate = self.ref = 0.0 if limits.rate_rps is None else float(limits.rate_rps)
            self.ss, self.used_at, self.fresh = int(limits.slow_start), now, False
        if isinstance(op, Take):
            return self._take(now, op, settings)
        if isinstance(op, Pause):
            cut = -1 if op.cut_version is None else op.cut_version
            return self._pause(now, max(0.0, op.pause_s), cut, settings)
        if isinstance(op, Grow):
            max_rps = 0.0 if limits.max_rps is None else limits.max_rps
            return self._grow(now, op.add_rps, op.mul, max_rps, settings.in_use_fraction)
        if isinstance(op, SetRate):
            old, self.rate = self.rate, 0.0 if op.rate_rps is None else float(op.rate_rps)
            self.ref, self.ss, self.ver = self.rate, int(op.slow_start), self.ver + 1
            self._rescale(old, now)
            return self._state()
        if isinstance(op, Record):
            return self._record(now, op.answered, op.unavailable, settings)
        if isinstance(op, Learn):
            return self._learn(now, op, settings)
        if isinstance(op, Rejoin):
            return self._rejoin(now, op, settings)
        if isinstance(op, ReadState):
            return self._state()
        raise TypeError(f"not a pacer operation: {op!r}")

    def _state(self) -> PacerState:
        return PacerState(**self._fields())

    def _fields(self) -> dict[str, Any]:
        return {
            "rate_rps": self.rate if self.rate > 0 else None,
            "reference_rps": self.ref if self.ref > 0 else None,
            "version": self.ver,
            "slow_start": self.ss == 1,
        }

    def _rescale(self, old: float, now: float) -> None:
        if old > 0 and self.rate > 0 and self.tat > now:
            self.tat = now + (self.tat - now) * old / self.rate

    def _burst(self) -> float:
        b = self._burst_arg if self._burst_arg >= 0 else 1 + self.rate / 100
        return max(b, 1.0)

    def _used_rps(self, now: float) -> float:
        if self.used < 0:
            return 0.0
        return self.used * math.exp(-max(0.0, now - self.used_at) / self._use_window) / self._use_window

    def _grant(self, now: float, granted: int, wait_s: float, verdict: str) -> Grant:
        owed = self.tat - now if self.rate > 0 and self.tat > now else 0.0
        return Grant(**self._fields(), granted=granted, wait_s=wait_s, verdict=verdict, owed_s=owed)

    def _take(self, now: float, op: Take, settings: PacerSettings) -> Grant:
        n, partial, verdict = op.n, op.partial, "go"
        if self.c_open > 0:
            if now < self.c_open:
                return self._grant(now, 0, self.c_open - now, "refuse")
            if self.c_probe <= now:
                verdict, n, partial = "probe", 1, True
            elif not op.nested:  # a nested call's parent, waiting on it, may be the probe out
                return self._grant(now, 0, self.c_probe - now, "wait")
        if now < self.pause:
            return self._grant(now, 0, self.pause - now, "paused")
        k, wait = n, 0.0
        if self.rate > 0:
            # workers presumed still pacing locally keep their shares of the rate (rejoin)
            keep = 1.0
            if self.aw_until > now and self.aw_n > 0:
                keep = max(0.05, 1 - self.aw_n * self.aw_share)
            period, b = 1 / (self.rate * keep), max(1.0, self._burst() * keep)
            tat = max(self.tat, now)
            if self.phase is not None and self.tat < now:  # back onto its grid
                tat = now - (now - self.phase) % period
            # the time owed first, with 1 µs of slack (epoch seconds: see the script)
            avail = math.floor((b * period - (tat - now) + 1e-6) / period)
            if self.phase is not None:
                avail = min(avail, math.floor(b + 1e-9))
            # a fairness key keeps to its weighted share while other keys want more
            me, share = None, 1.0
            if op.key is not None:
                me, share = self._contend(now, op.key, op.weight, settings.fair_window_s)
            kperiod, kb = period / share, max(1.0, b * share)
            if not partial:
                kb = max(kb, float(n))  # an all-or-none take larger than its share's burst
            ktat = now if me is None else max(me.tat, now)
            if share < 1:
                avail = min(avail, math.floor((kb * kperiod - (ktat - now) + 1e-6) / kperiod))
            if partial:
                k = min(n, avail)
            elif avail < n:
                k = 0
            if k < 1:
                need = 1 if partial else n
                if me is not None:
                    me.wants = 1
                if need > b:
                    return self._grant(now, 0, math.inf, "wait")
                wait = max(tat + need * period - b * period - now, 1e-6)
                if share < 1:
                    wait = max(wait, ktat + need * kperiod - kb * kperiod - now)
                return self._grant(now, 0, wait, "wait")
            self.tat = tat + k * period
            wait = max(0.0, self.tat + period - b * period - now)
            if me is not None:
                # a key borrowing idle shares owes at most its share's burst
                me.tat, me.wants = min(ktat + k * kperiod, now + kb * kperiod), 1 if k < n else 0
                if share < 1:
                    wait = max(wait, me.tat + kperiod - kb * kperiod - now)
        if self.used < 0:
            # the first grant: no history is no evidence of an idle provider (RFC 7661's
            # rule is for a sender with nothing to send); an average starting at zero
            # would hold slow start back for a time constant (~0.3 s of its ramp)
            self.used, self.used_at = self.rate * self._use_window, now
        decay = math.exp(-max(0.0, now - self.used_at) / self._use_window)
        self.used, self.used_at = self.used * decay + k, now
        if verdict == "probe":
            self.c_probe = now + settings.probe_lease_s
        return self._grant(now, k, wait, verdict)

    def _contend(self, now: float, key: str, weight: float, window_s: float) -> tuple[Contender, float]:
        """Note ``key``'s take at ``now``; its share of the rate: ``weight`` over itself plus
        the weights of the other keys that took within ``window_s`` and want more (1: none
        does, so it may use what they leave). Keys idle past the window, owing nothing, are
        forgotten (an idle key's share is lent)."""
        since = now - window_s
        names = sorted(self.shares)
        for name in names:
            c = self.shares[name]
            if name != key and c.seen < since and c.tat <= now:
                del self.shares[name]
        me = self.shares.get(key)
        if me is None:
            me = self.shares[key] = Contender()
        me.seen, me.weight = now, weight
        others = 0.0
        for name in names:
            other = self.shares.get(name)
            if other is not None and name != key and other.wants == 1 and other.seen >= since:
                others += other.weight
        return me, weight / (weight + others)

    def _rejoin(self, now: float, op: Rejoin, settings: PacerSettings) -> PacerState:
        rate = 0.0 if op.rate_rps is None else float(op.rate_rps)
        if rate > 0 and (self.rate <= 0 or rate < self.rate):
            old = self.rate
            self.rate, self.ss, self.ver = rate, 0, self.ver + 1
            self._rescale(old, now)
        if self.rate > 0 and op.spent > 0:
            self.tat = max(self.tat, now) + op.spent / self.rate
        if op.pause_s > 0:
            self.pause = max(self.pause, now + op.pause_s)
            if self.rate > 0:
                self.tat = max(self.tat, self.pause + self._burst() / self.rate)
        if self.aw_at > 0 and now - op.since_s <= self.aw_at:
            if self.aw_until > now and self.aw_n > 0:
                self.aw_n -= 1
        elif op.away > 0:
            self.aw_n, self.aw_share, self.aw_at = op.away, op.share, now
            self.aw_until = now + settings.away_s
        return self._state()

    def _pause(self, now: float, pause_s: float, cut_ver: int, settings: PacerSettings) -> Paused:
        cut, old = False, self.rate
        if cut_ver >= 0 and cut_ver == self.ver:
            cut, self.ver = True, self.ver + 1
            self.ev, self.ev_at, self.ev_acc = self.ev + 1, now, self.acc
            if self.rate <= 0:
                used = self._used_rps(now) * settings.slow_start_decrease
                self.rate, self.ss = max(settings.unpaced_start_rps, used), 1
            else:
                d = settings.slow_start_decrease if self.ss == 1 else settings.decrease
                self.ss, self.ref = 0, self.rate
                self.rate = max(settings.min_rps, self.rate * d)
        self._rescale(old, now)
        self.pause = max(self.pause, now + pause_s)
        if self.rate > 0:
            self.tat = max(self.tat, self.pause + self._burst() / self.rate)
        return Paused(**self._fields(), cut=cut, pause_s=self.pause - now)

    def _grow(self, now: float, add: float, mul: float, max_rps: float, in_use: float) -> Grown:
        grown = False
        if self.rate > 0 and self._used_rps(now) >= in_use * self.rate:
            rate = self.rate * mul + add
            if max_rps > 0:
                rate = min(rate, max_rps)
            grown, old = rate != self.rate, self.rate
            self.rate = rate
            self._rescale(old, now)
        return Grown(**self._fields(), grown=grown)

    def _learn(self, now: float, op: Learn, settings: PacerSettings) -> Learnt:
        # the lease in whole milliseconds, as the script's PX
        lease_s = math.ceil(settings.learner_lease_s * 1000) / 1000
        self.acc += op.accepted
        leader = False
        holder = op.holder
        if holder and (not self.holder or now >= self.lease_until or self.holder == holder):
            self.holder, self.lease_until, leader = holder, now + lease_s, True
        if leader and op.publish is not None and op.publish[0] >= 0:
            rate, slow, limit, phase, cuts = op.publish
            old, self.rate, self.ss = self.rate, float(rate), int(slow)
            self.lim, self.ph, self.cuts = 0.0 if limit is None else float(limit), PHASES.index(phase), cuts
            if self.lim > 0:
                self.ref = self.lim
            self._rescale(old, now)
        busy = self.rate > 0 and self._used_rps(now) >= settings.in_use_fraction * self.rate
        return Learnt(
            **self._fields(),
            leader=leader,
            accepted=round(self.acc),
            events=self.ev,
            event_ago_s=now - self.ev_at,
            event_accepted=round(self.ev_acc),
            pause_in_s=self.pause - now,
            in_use=busy,
            limit_rps=self.lim if self.lim > 0 else None,
            phase=PHASES[min(len(PHASES) - 1, max(0, self.ph))],
            cuts=self.cuts,
        )

    def _record(
        self, now: float, answered: int, unavailable: int, settings: PacerSettings
    ) -> CircuitRecorded:
        opened = False
        threshold = settings.circuit_failures or 0
        if answered > 0:
            self.c_fail, self.c_open, self.c_period, self.c_probe = 0, 0.0, 0.0, 0.0
        elif unavailable <= 0:
            self.c_probe = 0.0
        else:
            self.c_fail += unavailable
            if self.c_open > 0 and now >= self.c_open:
                period = max(settings.circuit_open_s, 2 * self.c_period)
                self.c_period, opened = min(settings.circuit_open_max_s, period), True
            elif self.c_open == 0 and threshold > 0 and self.c_fail >= threshold:
                self.c_period, opened = settings.circuit_open_s, True
            if opened:
                self.c_open, self.c_probe = now + self.c_period, 0.0
        return CircuitRecorded(**self._fields(), opened=opened, open_s=max(0.0, self.c_open - now))
