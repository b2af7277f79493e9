"""The governor: budgets, the global concurrency ceiling, per-provider pacing, backpressure.

:class:`Governor` is the plain state machine (messages in, decisions out, time passed
in); :class:`~actors.governor.actor.GovernorActor` feeds it messages and performs the
decisions (resolving reply futures, arming the wake-up timer).

Rules (docs/pacing.md): one provider call (a batch included) takes one slot;
waiting for pacing holds no global slot and never blocks another provider's waiters;
a 429 closes that (org, provider) gate for the Retry-After (plus jitter, so waiters are
not all released at once) and cuts its rate once per congestion event. Rates, pauses and
circuits are a :class:`~actors.pacing.pacers.Pacer`'s (:class:`GovernorPacing`): the
governor's own :class:`~actors.pacing.pacers.LocalPacer`, or one shared by every worker
(:func:`~actors.governor.shared.shared_governor`); the same code paces both.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
import os
import random
import secrets
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

import attrs

from actors.errors import (
    BudgetExceededError,
    CallCancelledError,
    ProviderUnavailableError,
    QuotaExhaustedError,
)
from actors.governor.budgets import ZERO, MoneyBudgets
from actors.pacing.announced import Announcement
from actors.pacing.bucket import MIN_WAKE_S, PACE_MARGIN, ProviderBucket, parse_retry_after
from actors.pacing.pacer_state import growth
from actors.pacing.pacers import LocalPacer, Pacer
from actors.pacing.quotas import limit_key
from actors.pacing.shared_learner import PUBLISH_TOLERANCE, SharedLearner, mirror
from actors.pacing.values import PacerSettings, PacerState, ProviderLimits
from actors.tool import PERIODS_S, Limit, Pacing, Policy

__all__ = [
    "BUDGET_KINDS",
    "BucketKey",
    "Decisions",
    "Governor",
    "GovernorPacing",
    "Granted",
    "suggested_parallelism",
]

BUDGET_KINDS = ("provider_calls", "retries", "receipt_ops")
BucketKey = tuple[str, str]
WAIT_POLL_S = 1.0
"""Longest a worker told to wait asks a shared pacer again: another worker's half-open
probe settling wakes nobody here, and its claim lasts ``probe_lease_s`` (30 s), so without
this a worker could stall that long after the circuit had closed."""
REFUSED = -1
"""What :meth:`GovernorPacing.grantable` answers for a head waiter it refused."""
KEPT_VERSIONS = 64
"""Grants remembered per bucket (time, rate version) to find a 429'd request's version."""
KEPT_WINDOWS = 1024
"""Limits whose longest announced window a governor remembers (then it starts afresh)."""
RATE_WINDOW_S = 1.0
"""An announced requests limit whose window is this or shorter is a rate (requests/s);
a longer one, a quota."""


def suggested_parallelism(pacing: Pacing, ceiling: int) -> int:
    """How wide a tool's calls are launched: from its pacing, floored at 1, capped by ``ceiling``.

    max_concurrency when known, else one second's worth of its rate (or its stated burst,
    which may all go at once, when larger), else the ceiling.
    """
    if pacing.max_concurrency is not None:
        width = pacing.max_concurrency
    elif pacing.rps is not None:
        width = max(math.ceil(pacing.rps), math.ceil(pacing.burst or 0))
    else:
        width = ceiling
    return max(1, min(width, ceiling))


@attrs.define
class _Waiter:
    want: int
    reply: Any
    seq: int = 0
    """Arrival order, across every provider."""
    exempt: bool = False
    """A nested call's request: no global ceiling, no provider max_concurrency."""
    since: float = 0.0
    """When it began waiting (governor clock), for the time waited for pacing."""
    prices: tuple[Decimal, ...] = ()
    """Under a money budget: what each slot wanted is known to cost, in the order its
    requests go (() : not counted in money)."""
    units: tuple[Mapping[str, float], ...] = ()
    """Under limits in units: what each slot wanted is expected to use (unit -> units),
    in the order its requests go (() or shorter: the rest use none)."""
    patience_s: float | None = None
    """Longest wait for a spent quota's window it accepts (its calls' timeout): a longer
    one refuses it at once with QuotaExhaustedError (None: it waits)."""
    quota_since: float | None = None
    """Since when a spent quota holds it (governor clock), else None."""
    taken: int = 0
    """Its requests whose units are taken from the limits and not yet granted or given back."""


class Granted(int):
    """A grant of slots, as the governor resolves a request (an int), with ``quota_s``:
    seconds its requester waited for a spent quota's window (stats' waits, "quota")."""

    quota_s: float = 0.0

    def __new__(cls, n: int, quota_s: float = 0.0) -> Granted:
        made = super().__new__(cls, n)
        made.quota_s = quota_s
        return made


@attrs.define
class Decisions:
    """What the actor must do: resolve grants and refusals, retime send gates, arm a timer."""

    grants: list[tuple[Any, int]] = attrs.field(factory=list)
    refusals: list[tuple[Any, BaseException]] = attrs.field(factory=list)
    wake_at: float | None = None
    gates: dict[BucketKey, tuple[float | None, float | None]] = attrs.field(factory=dict)
    """(org, provider) -> (rate to space sends at, pause them until or None)."""
    closed: dict[BucketKey, float] = attrs.field(factory=dict)
    """(org, provider) -> send nothing before this (its circuit opened)."""
    bursts: dict[BucketKey, float] = attrs.field(factory=dict)
    """(org, provider) -> its stated burst: requests its send gate lets go at once."""
    granted: list[tuple[BucketKey, int, bool]] = attrs.field(factory=list)
    """((org, provider), tokens, probe) a shared pacer granted now: each send through that
    provider's gate uses one while its slot lasts (see :meth:`SendGate.grant
    <actors.pacing.send_gate.SendGate.grant>`)."""


class Governor:
    """Admission control state machine.

    Args:
        policy: budgets (``max_provider_calls``, ``max_retries``, ``max_receipt_ops``;
            in money ``max_spend``, ``max_spend_by_provider``), the global ceiling
            (``max_concurrency``) and Retry-After bounds.
        pacings: provider name -> Pacing.
        rng: ``rng() -> float in [0, 1)`` for jitter (injectable for tests).
        pacer: a pacer shared with other processes (its owner closes it); None: a
            :class:`~actors.pacing.pacers.LocalPacer` of this governor's own, timed by
            the ``now`` passed to each step.
        fairness_key / fairness_weight: who this governor's takes are for, and its weight,
            among the fairness keys sharing a pacer (see :meth:`Pacer.take
            <actors.pacing.pacers.Pacer.take>`; None: no share, the rate alone).
    """

    def __init__(
        self,
        policy: Policy,
        pacings: dict[str, Pacing],
        rng: Callable[[], float] = random.random,
        pacer: Pacer | None = None,
        fairness_key: str | None = None,
        fairness_weight: float = 1.0,
    ) -> None:
        self.fairness_key = fairness_key
        self.fairness_weight = fairness_weight
        self.policy = policy
        self.pacings = pacings
        self.rng = rng
        self.ceiling = policy.max_concurrency
        self.in_flight = 0
        self.limits = {
            "provider_calls": policy.max_provider_calls,
            "retries": policy.max_retries,
            "receipt_ops": policy.max_receipt_ops,
        }
        self.spent: collections.Counter[str] = collections.Counter()
        self.money = MoneyBudgets(policy)
        """The budgets in money and what is charged against them."""
        self.buckets: dict[BucketKey, ProviderBucket] = {}
        self.waiters: dict[tuple[str, str, bool], collections.deque[_Waiter]] = {}
        """(org, provider, exempt) -> waiters in arrival order."""
        self.stopped = False
        self._arrivals = itertools.count()
        self.now = 0.0
        """The time passed to the last step (seconds): the clock of the governor's own pacer."""
        shared = pacer is not None
        if pacer is None:
            pacer = LocalPacer(clock=lambda: self.now)
        self.pacing = GovernorPacing(self, pacer, shared=shared)
        """Its pacing: rates, pauses and circuits, kept by ``pacing.pacer``."""

    def bucket(self, org_id: str, provider: str) -> ProviderBucket:
        """What this governor keeps of (org, provider) beside its pacer, created from its
        Pacing on first use."""
        key = (org_id, provider)
        found = self.buckets.get(key)
        if found is None:
            pacing = self.pacings.get(provider, Pacing())
            found = ProviderBucket(pacing.rps, pacing.burst, pacing.max_concurrency, pacing.start_rps)
            self.buckets[key] = found
        return found

    def refresh_report(self, now: float) -> None:
        """Bring what the pacing report reads up to date (see :meth:`GovernorPacing.refresh_report`)."""
        self.now = now
        self.pacing.refresh_report(now)

    def unpaced(self, key: BucketKey) -> bool:
        """No rate applies to ``key`` now (its bucket counts concurrency alone)."""
        return self.pacing.unpaced(key)

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
        unspent: Decimal = ZERO,
        unsent_units: Mapping[str, float] | None = None,
        usage: Sequence[tuple[float, Mapping[str, float]]] = (),
        announced: Sequence[tuple[float, Sequence[Announcement]]] = (),
    ) -> Decisions:
        """Return ``count`` slots; ``successes`` of them feed the rate's growth (AIMD, or the
        unknown limit's learner, with ``sent_at``: when their requests went out, on
        ``now``'s clock, where known); ``unavailable`` ones (and ``answered``: any answer
        from the provider, successes included; default ``successes``) drive the
        provider's circuit. When it opens, every waiter of (org, provider) is refused with
        ProviderUnavailableError. ``unspent``: money charged for the provider's calls and
        not spent (never sent, or an estimate above the real cost; negative: a cost above
        its estimate), given back to its money budgets.

        Under limits in units: ``unsent_units`` (granted, never sent; ``"requests"``: how
        many) go back, and each answered request's ``usage`` (granted at, real less
        estimated units) corrects them. ``announced``: (sent at, what its answer
        announced) per request, for the pacing's ``announced`` hook (without one, a quota's
        count sets it: :meth:`GovernorPacing.announce_quotas`)."""
        self.now = now
        self.money.give_back(provider, unspent)
        key = (org_id, provider)
        self.pacing.correct_units(key, unsent_units or {}, usage, now)
        hook = getattr(self.pacing, "announced", None)
        heard = Decisions()
        for sent, announcements in announced:
            if hook is not None:  # the pacing's own reading of what the provider announced
                heard = _merged(heard, hook(key, announcements, sent, now))
            else:
                self.pacing.announce_quotas(key, announcements, sent, now)
        out = self.pacing.release(
            org_id, provider, count, successes, now, unavailable, answered, exempt, refunds, sent_at
        )
        return _merged(heard, out) if announced else out

    def backpressure(
        self,
        org_id: str,
        provider: str,
        retry_after: Any,
        now: float,
        wall: float,
        sent_at: float | None = None,
    ) -> Decisions:
        """Pause (org, provider) for the parsed Retry-After and cut its rate (once per
        congestion event; ``sent_at``, when the 429'd request was sent, tells events apart)."""
        self.now = now
        return self.pacing.backpressure(org_id, provider, retry_after, now, wall, sent_at)

    def announced(
        self,
        org_id: str,
        provider: str,
        announcements: Sequence[Announcement],
        sent_at: float | None,
        now: float,
    ) -> Decisions:
        """Limits the provider announced in its answer to a request sent at ``sent_at``
        (see :meth:`GovernorPacing.announced`)."""
        self.now = now
        return self.pacing.announced((org_id, provider), announcements, sent_at, now)

    def charge(self, kind: str, amount: int) -> None:
        """Charge a budget.

        Raises:
            BudgetExceededError: the budget would be exceeded (nothing is charged).
        """
        limit = self.limits[kind]
        if limit is not None and self.spent[kind] + amount > limit:
            raise BudgetExceededError(f"{kind} budget of {limit} is spent")
        self.spent[kind] += amount

    def refund(self, kind: str, amount: int) -> None:
        """Give back ``amount`` of a charge that bought nothing (a retry charged, then
        never sent: the call stopped, was cancelled or timed out in its back-off, or its
        attempt sent no request). Never below nothing spent."""
        self.spent[kind] = max(0, self.spent[kind] - amount)

    def acquire(
        self, org_id: str, provider: str, want: int, reply: Any, now: float, exempt: bool = False,
        immediate: bool = False, prices: Sequence[Decimal] = (),
        units: Sequence[Mapping[str, float]] = (), patience_s: float | None = None,
    ) -> Decisions:  # fmt: skip
        """Queue a request for up to ``want`` slots and grant what can be granted.

        ``units``: under a provider's limits in units (``Pacing.limits``), what each of
        the ``want`` requests is expected to use (unit -> units), in the order they go;
        they are taken from every limit before the rate's tokens. ``patience_s``: when a
        spent quota would hold the request longer than this (its calls' timeout), it is
        refused at once with QuotaExhaustedError naming the limit and its reset.

        ``prices``: under a money budget, what each of the ``want`` requests is known to
        cost, in the order they go (the budget's currency): a grant of ``n`` charges the
        first ``n``, and only as many are granted as fit in what is left of the budgets;
        when not even the first fits, the request is refused with BudgetExceededError.

        ``exempt`` (a nested call, made by a running tool that waits for it): the slot is
        not counted against the global ceiling nor the provider's max_concurrency, since
        the waiting parent's slot is lent to it; the provider's rate still applies.
        ``immediate`` (slots asked before a claim): granted now or not at all (0: no
        room now), and only for an unpaced provider whose circuit is closed with nobody
        waiting, and with no ``provider_calls`` budget (else -1: ask the usual way), so a
        claim is never held back by pacing, no rate token is spent on a call the claim may
        answer from its receipt, and no budget charge held for such a call refuses a call
        that needs it (nor with a money budget over the provider).
        """
        self.now = now
        out = self._queue(
            org_id, provider, want, reply, now, exempt, immediate, tuple(prices), tuple(units), patience_s
        )
        self.pacing.acquired((org_id, provider), now, out)
        return out

    def _queue(
        self, org_id: str, provider: str, want: int, reply: Any, now: float, exempt: bool, immediate: bool,
        prices: tuple[Decimal, ...], units: tuple[Mapping[str, float], ...] = (),
        patience_s: float | None = None,
    ) -> Decisions:  # fmt: skip
        """:meth:`acquire` before its pacing hears of it."""
        if self.stopped:
            return Decisions(refusals=[(reply, CallCancelledError("the dispatcher is stopping"))])
        key = (org_id, provider)
        new = key not in self.buckets
        bucket = self.bucket(org_id, provider)
        circuit = bucket.circuit(now)
        if circuit == "open":  # refused at once, even with no slot free to ask the pacer for
            return Decisions(refusals=[(reply, self.unavailable_error(key))])
        wkey = (org_id, provider, exempt)
        budgeted = self.limits["provider_calls"] is not None or self.money.applies(provider)
        budgeted = budgeted or self.pacing.has_quotas(provider)
        if immediate and (circuit != "closed" or self.waiters.get(wkey) or not self.unpaced(key) or budgeted):
            out = Decisions(grants=[(reply, -1)])
        else:
            waiter = _Waiter(
                max(1, want), reply, next(self._arrivals), exempt, now, prices, units, patience_s
            )
            self.waiters.setdefault(wkey, collections.deque()).append(waiter)
            out = self.wake(now)
            if immediate and waiter in self.waiters[wkey]:  # not granted now: 0
                self.waiters[wkey].remove(waiter)
                out.grants.append((reply, 0))
        if new:
            out.gates[key] = (bucket.rate, None)
            if bucket.burst is not None:
                out.bursts[key] = bucket.burst
        return out

    def wake(self, now: float) -> Decisions:
        """Grant every waiter that can be granted at ``now``; say when to look again.

        Waiters are granted oldest first across providers, skipping a provider whose
        bucket cannot grant yet, so a busy provider's stream of waiters never starves
        another provider's waiters at the global ceiling. A grant is charged to the
        ``provider_calls`` budget before it is taken (a refused charge refuses that waiter
        alone, and lets go of a half-open circuit's probe granted to it), and to the money
        budgets (a waiter whose first request's price does not fit is refused at once,
        before it takes a rate token).
        """
        self.now = now
        out = Decisions()
        blocked: set[tuple[str, str, bool]] = set()
        while True:
            heads = [(q[0].seq, wkey) for wkey, q in self.waiters.items() if q and wkey not in blocked]
            if not heads:
                break
            wkey = min(heads)[1]
            key = (wkey[0], wkey[1])
            queue, bucket = self.waiters[wkey], self.buckets[key]
            head = queue[0]
            room = self._budget_room(head.want)
            if head.prices:
                fit = self.money.room(key[1], head.prices)
                if fit < 1:
                    queue.popleft()
                    out.refusals.append((head.reply, self.money.refusal(key[1], head.prices[0])))
                    continue
                room = min(room, fit)
            n = self.pacing.grantable(wkey, room, bucket, now, out, head)
            if n == REFUSED:  # a spent quota outlasts its patience (refused in ``out``)
                queue.popleft()
                continue
            if n is None:  # the provider's circuit is open: every waiter of it is refused
                out.refusals.extend((w.reply, self.unavailable_error(key)) for w in queue)
                queue.clear()
                continue
            if n < 1:
                blocked.add(wkey)
                continue
            waiter = queue.popleft()
            try:
                n = self._charge_calls(n)
            except BudgetExceededError as exc:
                out.refusals.append((waiter.reply, exc))
                self.pacing.unsent_probe(key)
                self.pacing.untake_units(key, waiter, 0)
                continue
            self.pacing.untake_units(key, waiter, n)
            if waiter.prices:
                self.money.charge(key[1], waiter.prices[:n])
            bucket.admission_wait_s += max(0.0, now - waiter.since)
            self.pacing.take(wkey, bucket, n, now)
            if wkey[2]:
                bucket.nested_out += n
            quota_s = 0.0 if waiter.quota_since is None else now - waiter.quota_since
            out.grants.append((waiter.reply, Granted(n, quota_s) if quota_s > 0 else n))
        return out

    def return_slots(self, bucket: ProviderBucket, count: int, exempt: bool, refunds: int) -> None:
        """Give back ``count`` slots (an exempt grant took none) and ``refunds`` unsent charges."""
        if not exempt:
            bucket.in_flight = max(0, bucket.in_flight - count)
            self.in_flight = max(0, self.in_flight - count)
        else:
            bucket.nested_out = max(0, bucket.nested_out - count)
        if refunds:  # granted but never sent (stop, latch, a pause, its deadline): not spent
            self.spent["provider_calls"] = max(0, self.spent["provider_calls"] - refunds)

    def probe_out(self, key: BucketKey, exempt: bool) -> bool:
        """Whether a slot of the half-open probe's kind (``exempt``: a nested call's) is
        still out for ``key``: the probe may be among them (a release with no verdict ends
        the probe only once none is)."""
        bucket = self.buckets[key]
        return (bucket.nested_out if exempt else bucket.in_flight) > 0

    def refuse_waiters(self, key: BucketKey) -> list[tuple[Any, BaseException]]:
        """Take every waiter of ``key`` (nested ones too) off its queue, refused: unavailable."""
        refusals: list[tuple[Any, BaseException]] = []
        for nested in (False, True):
            queue = self.waiters.get((key[0], key[1], nested), collections.deque())
            refusals += [(queue.popleft().reply, self.unavailable_error(key)) for _ in range(len(queue))]
        return refusals

    def pause_s(self, retry_after: Any, wall: float) -> float:
        """A Retry-After (any form) as seconds within the policy's bounds (see parse_retry_after)."""
        policy = self.policy
        return parse_retry_after(
            retry_after,
            wall,
            default_s=policy.retry_after_default_s,
            max_s=policy.retry_after_max_s,
            min_s=policy.retry_after_min_s,
        )

    def unavailable_error(self, key: BucketKey) -> ProviderUnavailableError:
        return ProviderUnavailableError(
            f"provider {key[1]!r} is unavailable: its recent calls all failed (connection errors, "
            "5xx or timeouts), so its calls are refused for a while; then one probe call goes"
        )

    def _budget_room(self, want: int) -> int:
        """``want``, no more than the ``provider_calls`` budget has left (at least one: a
        spent budget refuses the waiter once a slot is there for it)."""
        limit = self.limits["provider_calls"]
        if limit is None:
            return want
        return max(1, min(want, limit - self.spent["provider_calls"]))

    def _charge_calls(self, n: int) -> int:
        limit = self.limits["provider_calls"]
        if limit is not None:
            n = min(n, limit - self.spent["provider_calls"])
            if n < 1:
                raise BudgetExceededError(f"provider_calls budget of {limit} is spent")
        self.spent["provider_calls"] += n
        return n

    def stop(self) -> Decisions:
        """Refuse every waiter with CallCancelledError; later requests are refused too."""
        self.stopped = True
        out = Decisions()
        for queue in self.waiters.values():
            while queue:
                out.refusals.append((queue.popleft().reply, CallCancelledError("the dispatcher is stopping")))
        return out


class GovernorPacing:
    """How a :class:`Governor` paces: through a :class:`~actors.pacing.pacers.Pacer`, whose
    :class:`~actors.pacing.pacer_state.BucketState` (or the Redis script held to it) keeps
    the rate, Retry-After pauses and circuit of each (org, provider). Every method runs on
    the governor's thread; each pacer call is one round trip when the pacer is shared.

    The governor keeps budgets, the global ceiling and each provider's ``max_concurrency``
    (both per process), the waiters, and the counters of the pacing report
    (:class:`~actors.pacing.bucket.ProviderBucket`). Mapping of its steps onto the pacer:

    * ``wake``: ``pacer.take(org, provider, n, partial=True)`` for the head waiter of each
      provider, with the governor's fairness key and weight; nothing granted blocks its
      waiters until ``now + wait_s`` (a ``paused`` verdict pauses this process's send
      gate, so senders respect another worker's pause); ``refuse`` refuses them and closes
      the send gate; a grant is charged and its rate version remembered. With a shared
      pacer the tokens granted go to the send gate (``Decisions.granted``): a request
      leaves within its slot or asks the pacer again.
    * ``backpressure``: ``pacer.pause`` with ``cut_version`` = the version of the last
      grant made at or before the 429'd request was sent (several 429s of one congestion
      event, from any worker, cut once: RFC 6582).
    * ``announced``: the limits a provider's answer announced
      (:class:`~actors.pacing.announced.Announcement`): a requests limit whose window is a
      second or less (after inference) is ``pacer.set_rate`` at
      :data:`~actors.pacing.bucket.PACE_MARGIN` of it, as a stated rate (the learner
      stops; every worker sharing the pacer follows); any other limit goes to the quota
      state (``pacer.announce``), added to its limits (``pacer.unit_limits``) when none
      counts it (:meth:`GovernorPacing.add_announced_limit`).
    * ``release``: for a stated rate ``pacer.grow`` by :func:`~actors.pacing.pacer_state.growth`
      (slow start, or AIMD's additive increase); for an unknown limit ``pacer.learn`` (the
      successes join every worker's count; the worker holding the learner lease runs the
      :class:`~actors.pacing.learner.LimitLearner` of them all and publishes its rate: see
      :mod:`actors.pacing.shared_learner`; a governor pacing alone always holds it); then
      ``pacer.record`` (the circuit); when it opens, waiters are refused and the gate
      closed. While a shared pacer is away (its local fallback answers), an unknown limit
      grows by AIMD on this worker's share, as a stated one.

    Args:
        governor: the governor paced for.
        pacer: the pacer (its owner closes it).
        shared: whether other processes pace through ``pacer`` too (a governor pacing
            alone grants slots before a claim for an unpaced provider, and its send gates
            space sends by the rate alone).
    """

    def __init__(self, governor: Governor, pacer: Pacer, shared: bool) -> None:
        self.gov = governor
        self.pacer = pacer
        self.shared = shared
        for name, pacing in governor.pacings.items():
            pacer.limits.setdefault(name, ProviderLimits.from_pacing(pacing))
            if pacing.unit_limits:  # systems sharing a pacer: every one's limits hold (each once)
                have = pacer.unit_limits.get(name, ())
                keys = {limit_key(lim) for lim in have}
                more = tuple(lim for lim in pacing.unit_limits if limit_key(lim) not in keys)
                announced = pacer.announced_limits.get(name, ())
                stated = tuple(lim for lim in have if lim not in announced)
                pacer.unit_limits[name] = (*stated, *more, *announced)
        if pacer.settings == PacerSettings():  # not chosen by its maker: the policy's circuit
            pacer.settings = PacerSettings.from_policy(governor.policy)
        self.grants_at: dict[BucketKey, list[tuple[float, int]]] = {}
        """(org, provider) -> (grant time, rate version), oldest first."""
        self.granted_version = 0
        """The rate version of the grant :meth:`grantable` last made."""
        self.seen: dict[BucketKey, tuple[float | None, float | None, bool, int]] = {}
        """(org, provider) -> (rate, reference rate, slow start, version) as the pacer last said."""
        self.roles: dict[BucketKey, SharedLearner] = {}
        """(org, provider) of an unknown limit -> this governor's learner role."""
        self.holder = f"{os.getpid()}:{secrets.token_hex(4)}"
        """This governor's name for the learner lease."""
        self.caps: dict[BucketKey, float] = {}
        """(org, provider) whose rate its provider announces -> the rate it is paced at:
        growth after a cut never passes it."""
        self.windows: dict[tuple[str, str, str, str, float], float] = {}
        """(org, provider, unit, policy name, limit) -> the longest window announced or
        inferred for that limit (one answer in a window's last second looks per-second)."""
        self.short_until: dict[tuple[str, str, str, str, float], float] = {}
        """Same keys -> when the window a requests limit's first inferred (not stated)
        window of a second or less ended (governor clock): an answer at or after it still
        inferring one confirms the rate."""
        self.rate_from: dict[BucketKey, tuple[str, str, str, str, float]] = {}
        """(org, provider) paced at an announced rate -> the limit (keys as above) it is."""
        self.probing: dict[BucketKey, bool] = {}
        """(org, provider) whose half-open probe this governor was granted and has not yet
        reported -> whether a nested call has it: a probe given back unsent releases the
        claim at once (else every worker would wait out the probe lease)."""

    def acquired(self, key: BucketKey, now: float, out: Decisions) -> None:
        """After a request for slots of ``key`` was answered: a first request during another
        worker's pause starts this process's send gate paused too."""
        bucket = self.gov.buckets.get(key)
        if self.shared and bucket is not None and bucket.gate_until > now:
            out.gates[key] = (bucket.rate, bucket.gate_until)

    def unpaced(self, key: BucketKey) -> bool:
        """No rate applies to ``key`` now (slots may be granted before a claim); never with a
        shared pacer, which decides each grant (one round trip)."""
        return not self.shared and self.pacer.state(key[0], key[1]).rate_rps is None

    def grantable(
        self, wkey: tuple[str, str, bool], want: int, bucket: ProviderBucket, now: float, out: Decisions,
        waiter: _Waiter | None = None,
    ) -> int | None:  # fmt: skip
        """Slots the head waiter of ``wkey`` may have now (0: wait), or None: the circuit is
        open, refuse them all; :data:`REFUSED`: the head waiter was refused (in ``out``).

        Under limits in units, the head's requests take their units from every limit first
        (as many requests as fit), then the rate's tokens; the units of requests the rate
        does not grant go back (:meth:`untake_units` gives back the rest after charges)."""
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
        if waiter is not None and self.has_quotas(key[1]):
            want = self._take_units(key, want, waiter, now, out)
            if want < 1:
                return want
        fair, weight = self.gov.fairness_key, self.gov.fairness_weight
        grant = self.pacer.take(key[0], key[1], want, partial=True, nested=wkey[2], key=fair, weight=weight)
        if waiter is not None and waiter.taken > grant.granted:
            self.untake_units(key, waiter, grant.granted)
        self._saw(key, grant, out)
        if grant.verdict == "refuse":
            bucket.circuit_until = now + grant.wait_s
            out.closed[key] = now + grant.wait_s
            return None
        if grant.granted < 1:
            wait = max(grant.wait_s, MIN_WAKE_S)
            if grant.verdict == "wait" and self.shared:  # (a probe out may be another worker's:
                wait = min(wait, WAIT_POLL_S)  # its verdict wakes nobody here; ask again soon)
            again = now + wait
            out.wake_at = again if out.wake_at is None else min(out.wake_at, again)
            if grant.verdict == "paused" and self.shared:  # another worker's 429: hold ours too
                bucket.gate_until = max(bucket.gate_until, again)
                out.gates[key] = (grant.rate_rps, bucket.gate_until)
            return 0
        self.granted_version = grant.version
        if grant.verdict == "probe":
            self.probing[key] = wkey[2]
        if self.shared:
            out.granted.append((key, grant.granted, grant.verdict == "probe"))
        return grant.granted

    def has_quotas(self, provider: str) -> bool:
        """Whether ``provider`` has limits kept by the quota state (``Pacing.unit_limits``)."""
        return bool(self.pacer.unit_limits.get(provider))

    def _take_units(self, key: BucketKey, want: int, waiter: _Waiter, now: float, out: Decisions) -> int:
        """Take the units of up to ``want`` of ``waiter``'s requests from every limit: how
        many fit (0: wait for the next to fit; :data:`REFUSED`: refused, that wait being
        longer than its patience)."""
        requests = [waiter.units[i] if i < len(waiter.units) else {} for i in range(want)]
        got = self.pacer.take_units(key[0], key[1], requests)
        waiter.taken = got.granted
        if got.granted:
            return got.granted
        limits = self.pacer.unit_limits[key[1]]
        limit = limits[got.limit] if 0 <= got.limit < len(limits) else None
        quota = limit is not None and not limit.is_rate
        if quota and waiter.quota_since is None:
            waiter.quota_since = now
        never = math.isinf(got.wait_s)  # one request needs more than the whole quota
        patience = math.inf if waiter.patience_s is None else waiter.patience_s
        if quota and limit is not None and (never or got.wait_s > patience):
            reset = got.reset_s if math.isfinite(got.reset_s) else got.wait_s
            if never:
                why = f"one call needs more than its whole quota of {limit.name}"
            else:
                why = (
                    f"its quota of {limit.name} is spent; it has room again in {reset:.1f} s, "
                    f"after this call's timeout ({patience:g} s)"
                )
            error = QuotaExhaustedError(
                f"provider {key[1]!r}: {why}: refused, not sent, its receipt left pending",
                limit=limit.name,
                reset_s=reset,
            )
            out.refusals.append((waiter.reply, error))
            return REFUSED
        again = now + max(got.wait_s if math.isfinite(got.wait_s) else WAIT_POLL_S, MIN_WAKE_S)
        if self.shared:
            again = min(again, now + WAIT_POLL_S * 5)  # other workers give units back too
        out.wake_at = again if out.wake_at is None else min(out.wake_at, again)
        return 0

    def announce_quotas(
        self, key: BucketKey, announcements: Sequence[Announcement], sent_at: float, now: float
    ) -> None:
        """Set each quota whose count an answer announced (remaining and reset: see
        :meth:`~actors.pacing.pacers.Pacer.announce`); a limit announced that no limit of
        the quota state counts is added to it first (:meth:`add_announced_limit`). A
        requests limit over a second or less is the pacing's ``announced`` hook's (a rate)."""
        quotas = [
            a for a in announcements
            if isinstance(a, Announcement) and a.unit != "concurrent-requests"
            and not (a.unit == "requests" and a.window_s is not None and a.window_s <= RATE_WINDOW_S)
        ]  # fmt: skip
        for found in quotas:  # every limit first, then the counts
            self.add_announced_limit(key[1], found)
        if not self.has_quotas(key[1]):
            return
        for found in quotas:
            if found.window_s is None or found.window_s > RATE_WINDOW_S:
                self.pacer.announce(key[0], key[1], found, sent_ago_s=max(0.0, now - sent_at))

    def add_announced_limit(self, provider: str, found: Announcement) -> None:
        """Add a limit ``found`` states (its amount and window) to ``provider``'s quota
        state (``pacer.unit_limits``) when no limit there counts it (one of its unit whose
        window is within 1% of it); one added before for that (unit, window) with another
        amount is replaced. The limits stated in ``Pacing.limits`` come first, in their
        order, then the announced ones sorted by (unit, window), so every worker sharing a
        pacer that heard the same limits keeps the same list (the quota state keeps each
        limit's count under its own identity: a change loses no count). A limit stating no
        amount or window, or one that is not a number > 0, is ignored."""
        amount, window = found.limit, found.window_s
        if amount is None or window is None:
            return
        if not (math.isfinite(amount) and amount > 0 and math.isfinite(window) and window > 0):
            return
        now_limits = self.pacer.unit_limits.get(provider, ())
        added = list(self.pacer.announced_limits.get(provider, ()))
        stated = tuple(lim for lim in now_limits if lim not in added)

        def same(lim: Limit) -> bool:
            return lim.unit == found.unit and abs(lim.window_s - window) <= 0.01 * window

        if any(same(lim) for lim in stated):
            return
        per = next((name for name, w in PERIODS_S.items() if w == window), float(window))
        limit = Limit(float(amount), per, found.unit)  # (named: "200 requests/minute")
        if limit in added:
            return
        added = [lim for lim in added if not same(lim)] + [limit]
        added.sort(key=lambda lim: (lim.unit, lim.window_s))
        self.pacer.announced_limits[provider] = tuple(added)
        self.pacer.unit_limits[provider] = (*stated, *added)

    def untake_units(self, key: BucketKey, waiter: _Waiter, granted: int) -> None:
        """Give back the units of ``waiter``'s requests taken and not granted (those from
        ``granted`` on)."""
        if waiter.taken <= granted:
            return
        back: dict[str, float] = {"requests": float(waiter.taken - granted)}
        for i in range(granted, waiter.taken):
            for unit, amount in (waiter.units[i] if i < len(waiter.units) else {}).items():
                back[unit] = back.get(unit, 0.0) + amount
        waiter.taken = granted
        self.pacer.give_back_units(key[0], key[1], back)

    def correct_units(
        self, key: BucketKey, unsent: Mapping[str, float], usage: Sequence[tuple[float, Mapping[str, float]]],
        now: float,
    ) -> None:  # fmt: skip
        """Give back ``unsent`` units (granted, never sent; ``"requests"``: how many) and
        correct each answered request's (granted at, real less estimated units)."""
        if not self.has_quotas(key[1]):
            return
        if unsent:
            self.pacer.give_back_units(key[0], key[1], unsent)
        for granted_at, delta in usage:
            if any(delta.values()):
                self.pacer.correct_units(key[0], key[1], delta, age_s=max(0.0, now - granted_at))

    def take(self, wkey: tuple[str, str, bool], bucket: ProviderBucket, n: int, now: float) -> None:
        """Count ``n`` granted (and charged) slots against this process's ceilings; remember
        their rate version."""
        if not wkey[2]:
            bucket.in_flight += n
            self.gov.in_flight += n
        seen = self.grants_at.setdefault((wkey[0], wkey[1]), [])
        seen.append((now, self.granted_version))
        del seen[:-KEPT_VERSIONS]

    def unsent_probe(self, key: BucketKey) -> None:
        """The half-open probe just granted for ``key`` (if it was) will not be sent: let go
        of its claim, so the next call probes."""
        if self.probing.pop(key, None) is not None:
            self.pacer.record(key[0], key[1], answered=0, unavailable=0)

    def backpressure(
        self, org_id: str, provider: str, retry_after: Any, now: float, wall: float, sent_at: float | None
    ) -> Decisions:
        """A 429: pause (org, provider) for every worker and cut its rate once per event."""
        key = (org_id, provider)
        if _is_date(retry_after):  # read against the clock the workers share, not this host's
            wall = self.pacer.wall_time(wall)
        pause = self.gov.pause_s(retry_after, wall)
        pause += self.gov.rng() * min(1.0, 0.1 * pause)  # jitter: waiters are not all released at once
        bucket = self.gov.bucket(org_id, provider)
        seen = self.grants_at.get(key, [])
        at = len(seen) if sent_at is None else bisect.bisect_right(seen, (sent_at, 1 << 62))
        if at:
            cut_version: int | None = seen[at - 1][1]
        else:  # before every grant kept; or none granted yet: the version last heard of
            cut_version = None if seen else self.seen.get(key, (None, None, False, 0))[3]
        paused = self.pacer.pause(org_id, provider, pause, cut_version=cut_version)
        if paused.cut:  # this process's 429 began a congestion event (the report's per-run cuts)
            bucket.cuts += 1
        bucket.paused(now, paused.pause_s, retry_after)
        out = self.gov.wake(now)
        self._saw(key, paused, out)
        role = self.roles.get(key)
        if paused.cut and role is not None and role.learner is not None:  # the learner is here: cut now
            self._learn(key, bucket, 0, now, out)
        out.gates[key] = (bucket.rate, bucket.gate_until)
        return out

    def release(
        self, org_id: str, provider: str, count: int, successes: int, now: float, unavailable: int,
        answered: int | None, exempt: bool, refunds: int, sent_at: Sequence[float],
    ) -> Decisions:  # fmt: skip
        """Slots given back with their outcomes (see :meth:`Governor.release`)."""
        key = (org_id, provider)
        bucket = self.gov.bucket(org_id, provider)
        self.gov.return_slots(bucket, count, exempt, refunds)
        out = Decisions()
        if bucket.learner is None or not self._learn(key, bucket, successes, now, out, sent_at):
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
            if answered_n:
                bucket.circuit_until = None
            if recorded.opened:
                bucket.circuit_opened += 1
                bucket.circuit_until = now + recorded.open_s
                refusals = self.gov.refuse_waiters(key)
                out.closed[key] = now + recorded.open_s
        woken = self.gov.wake(now)
        woken.refusals.extend(refusals)
        woken.closed.update(out.closed)
        woken.gates = {**out.gates, **woken.gates}
        return woken

    def _grow(self, key: BucketKey, bucket: ProviderBucket, successes: int, out: Decisions) -> None:
        """Grow the rate by ``successes`` (:func:`~actors.pacing.pacer_state.growth`), never
        past an announced rate."""
        rate, ref, slow, _ = self.seen.get(key, (bucket.rate, None, bucket.slow_start, 0))
        limits = self.pacer.limits_of(key[1])
        cap = self.caps.get(key, limits.max_rps)
        capped = cap is not None and rate is not None and rate >= cap
        if successes and rate is not None and not capped:
            grow = growth(rate, ref, slow, successes)
            add = grow.add_rps
            if key in self.caps:  # (the pacer caps a stated rate itself)
                add = min(add, self.caps[key] - rate * grow.mul)
            self._saw(key, self.pacer.grow(key[0], key[1], add_rps=add, mul=grow.mul), out)

    def announced(
        self, key: BucketKey, announcements: Sequence[Announcement], sent_at: float | None, now: float
    ) -> Decisions:
        """Limits (org, provider)'s answer to a request sent at ``sent_at`` (governor
        clock; None: unknown) announced, taken in at ``now``.

        A requests limit whose window is :data:`RATE_WINDOW_S` or shorter (the longest
        window seen for it; a window inferred from a reset, not stated, only once an answer
        after the first one's window ended infers it again: see
        :mod:`actors.pacing.announced`) is the provider's rate, ``limit / window``
        requests/s (the strictest such limit of the answer: one rate per answer): paced at
        :data:`~actors.pacing.bucket.PACE_MARGIN` of it (never above a stated ``rps``)
        from now on, as a stated rate: no slow start, no learner (for every worker, through
        a shared pacer's ``set_rate``); set again when it changes or when the pacer's rate
        is above it (another worker's learner published), and grown back to it after a
        cut. Any other limit (a longer window, tokens or another unit) goes to the quota
        state, with its remaining count and reset (:meth:`announce_quotas`, units granted
        since ``sent_at`` taken from it), added to its limits first when no limit there
        counts it (:meth:`add_announced_limit`: a quota announced counts though
        ``Pacing.limits`` does not state it); when the limit paced as a rate shows a longer
        window, that rate is withdrawn: the provider is paced as its
        :class:`~actors.tool.Pacing` starts (stated, or learnt afresh). A provider that
        never announces is learnt as before;
        one that stops keeps its last announced rate. An announcement stating no usable
        limit is ignored.
        """
        bucket = self.gov.bucket(*key)
        out = Decisions()
        quotas: list[Announcement] = []
        rates: list[tuple[float, tuple[str, str, str, str, float]]] = []
        withdrawn = False
        for a in announcements:
            if not isinstance(a, Announcement) or a.unit == "concurrent-requests":
                continue
            window = a.window_s
            if a.unit == "requests" and window is not None and a.limit is not None:
                seen = (key[0], key[1], a.unit, a.name, a.limit)
                if seen not in self.windows and len(self.windows) >= KEPT_WINDOWS:
                    self.windows.clear()  # (a provider whose limits keep changing)
                    self.short_until.clear()
                window = self.windows[seen] = max(window, self.windows.get(seen, 0.0))
                if window <= RATE_WINDOW_S:
                    if a.limit > 0 and self._short_window_trusted(seen, a, now):
                        rates.append((a.limit / window, seen))
                    continue  # (a second's window not yet confirmed: neither rate nor quota)
                withdrawn = withdrawn or self.rate_from.get(key) == seen
            if window is not None and window != a.window_s:
                a = attrs.evolve(a, window_s=window)  # (the longest window seen for it)
            quotas.append(a)  # a quota's count, or a limit the quota state does not count yet
        if quotas:
            self.announce_quotas(key, quotas, now if sent_at is None else sent_at, now)
        if rates:  # one rate per answer: the strictest of its limits
            rate_rps, seen = min(rates)
            self.rate_from[key] = seen
            self._set_announced_rate(key, bucket, rate_rps, out)
        elif withdrawn:
            self._withdraw_announced_rate(key, bucket, out)
        woken = self.gov.wake(now)
        woken.gates = {**out.gates, **woken.gates}
        return woken

    def _short_window_trusted(
        self, seen: tuple[str, str, str, str, float], a: Announcement, now: float
    ) -> bool:
        """Whether a requests limit's window of a second or less is the provider's: stated,
        or inferred again by an answer that came after the window the first inference saw
        had ended (a minute's window answered in its last second shows a long reset next)."""
        if a.window_stated:
            return True
        until = self.short_until.get(seen)
        if until is None:
            self.short_until[seen] = now + max(a.reset_s or 0.0, RATE_WINDOW_S)
            return False
        return now >= until

    def _withdraw_announced_rate(self, key: BucketKey, bucket: ProviderBucket, out: Decisions) -> None:
        """The limit ``key`` was paced at as a rate has a longer window: pace it as its
        :class:`~actors.tool.Pacing` starts (stated, or learnt afresh) again."""
        self.caps.pop(key, None)
        self.rate_from.pop(key, None)
        pacing = self.gov.pacings.get(key[1], Pacing())
        fresh = ProviderBucket(pacing.rps, pacing.burst, pacing.max_concurrency, pacing.start_rps)
        bucket.announced = False
        bucket.ceiling_rps, bucket.learner = fresh.ceiling_rps, fresh.learner
        limits = ProviderLimits.from_pacing(pacing)
        self._saw(
            key, self.pacer.set_rate(key[0], key[1], limits.rate_rps, slow_start=limits.slow_start), out
        )

    def _set_announced_rate(
        self, key: BucketKey, bucket: ProviderBucket, limit_rps: float, out: Decisions
    ) -> None:
        """Pace ``key`` at :data:`~actors.pacing.bucket.PACE_MARGIN` of an announced rate."""
        target = limit_rps * PACE_MARGIN
        stated = self.gov.pacings.get(key[1])
        if stated is not None and stated.rps is not None:
            target = min(target, stated.rps * PACE_MARGIN)
        rate, _, slow, _ = self.seen.get(key, (bucket.rate, None, bucket.slow_start, 0))
        stale = rate is None or slow or rate > target * (1 + 1e-9)
        if self.caps.get(key) != target or stale:
            self.caps[key] = target
            self._saw(key, self.pacer.set_rate(key[0], key[1], target), out)
        self.roles.pop(key, None)  # no learning: the provider said
        bucket.learner = None
        bucket.announced = True
        bucket.ceiling_rps = limit_rps

    def _learn(
        self,
        key: BucketKey,
        bucket: ProviderBucket,
        successes: int,
        now: float,
        out: Decisions,
        sent_at: Sequence[float] = (),
    ) -> bool:
        """Count ``successes`` (their requests sent at ``sent_at``) for the learner; learn and
        publish when this governor holds its lease (two round trips when the rate changes,
        else one). False when the pacer is away (the caller grows the local share instead)."""
        org_id, provider = key
        role = self.roles.get(key)
        if role is None:
            role = self.roles[key] = SharedLearner(tolerance=PUBLISH_TOLERANCE if self.shared else 0.0)
        got = self.pacer.learn(org_id, provider, successes, self.holder)
        if got.degraded:
            role.step(got, now)  # drops the role: the counts are this worker's alone
            return False
        self._saw(key, got, out)
        publish = role.step(got, now, successes, sent_at)
        if publish is not None:
            got = self.pacer.learn(org_id, provider, 0, self.holder, publish)
            self._saw(key, got, out)
        if role.learner is not None:
            bucket.learner = role.learner  # the report shows the learner itself
        elif bucket.learner is not None:
            mirror(bucket.learner, got)  # (a learner this worker held and lost is no longer fed)
        return True

    def refresh_report(self, now: float) -> None:
        """Before a pacing report: each unknown limit's published estimate, where another
        worker holds the learner (one read each)."""
        for key, role in self.roles.items():
            bucket = self.gov.buckets.get(key)
            if bucket is None or bucket.learner is None or role.learner is not None:
                continue
            got = self.pacer.learn(key[0], key[1], 0, "")
            if not got.degraded:
                mirror(bucket.learner, got)

    def _saw(self, key: BucketKey, reply: PacerState, out: Decisions) -> None:
        """Keep the pacer's rate; retime this process's send gate when it changed."""
        before = self.seen.get(key)
        rate = reply.rate_rps
        self.seen[key] = (rate, reply.reference_rps, reply.slow_start, reply.version)
        bucket = self.gov.buckets.get(key)
        if bucket is not None:
            bucket.rate, bucket.slow_start = rate, reply.slow_start
        if before is None or before[0] != rate:
            out.gates.setdefault(key, (rate, None))


def _merged(first: Decisions, second: Decisions) -> Decisions:
    """What both say, ``second`` winning where they retime the same gate."""
    first.grants += second.grants
    first.refusals += second.refusals
    first.granted += second.granted
    first.gates.update(second.gates)
    first.closed.update(second.closed)
    first.bursts.update(second.bursts)
    if second.wake_at is not None:
        first.wake_at = second.wake_at if first.wake_at is None else min(first.wake_at, second.wake_at)
    return first


def _is_date(retry_after: Any) -> bool:
    """A Retry-After given as a date (an HTTP-date text or a datetime), not seconds."""
    if retry_after is None or isinstance(retry_after, (int, float)):
        return False
    try:
        float(str(retry_after).strip())
    except ValueError:
        return True
    return False
