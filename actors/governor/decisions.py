"""The governor: budgets, the global concurrency ceiling, per-provider pacing, backpressure.

:class:`Governor` is the plain state machine (messages in, decisions out, time passed
in); :class:`~actors.governor.actor.GovernorActor` feeds it messages and performs the
decisions (resolving reply futures, arming the wake-up timer).

Rules (docs/pacing.md): one provider call (a batch included) takes one slot;
waiting for pacing holds no global slot and never blocks another provider's waiters;
a 429 closes that (org, provider) gate for the Retry-After (plus jitter, so waiters are
not all released at once) and cuts its rate (AIMD, see :mod:`actors.pacing.bucket`).
"""

from __future__ import annotations

import abc
import collections
import itertools
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from actors.errors import BudgetExceededError, CallCancelledError, ProviderUnavailableError
from actors.pacing.bucket import ProviderBucket, parse_retry_after
from actors.pacing.circuit import Circuit
from actors.tool import Pacing, Policy

__all__ = [
    "BUDGET_KINDS",
    "BucketKey",
    "Decisions",
    "Governor",
    "GovernorPacing",
    "LocalPacing",
    "suggested_parallelism",
]

BUDGET_KINDS = ("provider_calls", "retries", "receipt_ops")
BucketKey = tuple[str, str]


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
    """(org, provider, tokens, probe) a shared pacer granted now: each send through that
    provider's gate uses one while its slot lasts (see :meth:`SendGate.grant
    <actors.pacing.send_gate.SendGate.grant>`)."""


class Governor:
    """Admission control state machine.

    Args:
        policy: budgets (``max_provider_calls``, ``max_retries``, ``max_receipt_ops``),
            the global ceiling (``max_concurrency``) and Retry-After bounds.
        pacings: provider name -> Pacing.
        rng: ``rng() -> float in [0, 1)`` for jitter (injectable for tests).
        pacing: how rates, pauses and circuits are kept (default :class:`LocalPacing`;
            :class:`~actors.governor.shared.SharedPacing` for a shared pacer).
    """

    def __init__(
        self,
        policy: Policy,
        pacings: dict[str, Pacing],
        rng: Callable[[], float] = random.random,
        pacing: GovernorPacing | None = None,
    ) -> None:
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
        self.buckets: dict[BucketKey, ProviderBucket] = {}
        self.circuits: dict[BucketKey, Circuit] = {}
        self.waiters: dict[tuple[str, str, bool], collections.deque[_Waiter]] = {}
        """(org, provider, exempt) -> waiters in arrival order."""
        self.stopped = False
        self._arrivals = itertools.count()
        self.pacing: GovernorPacing = pacing if pacing is not None else LocalPacing()
        """Who paces: this process's buckets (:class:`LocalPacing`) or a shared pacer."""
        self.pacing.attach(self)

    def bucket(self, org_id: str, provider: str) -> ProviderBucket:
        """The pacing state of (org, provider), created from its Pacing on first use."""
        key = (org_id, provider)
        found = self.buckets.get(key)
        if found is None:
            pacing = self.pacings.get(provider, Pacing())
            found = ProviderBucket(pacing.rps, pacing.burst, pacing.max_concurrency, pacing.start_rps)
            self.buckets[key] = found
            policy = self.policy
            self.circuits[key] = Circuit(
                policy.circuit_failures, policy.circuit_open_s, policy.circuit_open_max_s
            )
        return found

    def refresh_report(self, now: float) -> None:
        """Bring what the pacing report reads up to date (see :meth:`GovernorPacing.refresh_report`)."""
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
    ) -> Decisions:
        """Return ``count`` slots; ``successes`` of them feed the rate's growth (AIMD, or the
        unknown limit's learner, with ``sent_at``: when their requests went out, on
        ``now``'s clock, where known); ``unavailable`` ones (and ``answered``: any answer
        from the provider, successes included; default ``successes``) drive the
        provider's circuit. When it opens, every waiter of (org, provider) is refused with
        ProviderUnavailableError."""
        return self.pacing.release(
            org_id, provider, count, successes, now, unavailable, answered, exempt, refunds, sent_at
        )

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
        return self.pacing.backpressure(org_id, provider, retry_after, now, wall, sent_at)

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
        immediate: bool = False,
    ) -> Decisions:  # fmt: skip
        """Queue a request for up to ``want`` slots and grant what can be granted.

        ``exempt`` (a nested call, made by a running tool that waits for it): the slot is
        not counted against the global ceiling nor the provider's max_concurrency, since
        the waiting parent's slot is lent to it; the provider's rate still applies.
        ``immediate`` (slots asked before a claim): granted now or not at all (0: no
        room now), and only for an unpaced provider whose circuit is closed with nobody
        waiting, and with no ``provider_calls`` budget (else -1: ask the usual way), so a
        claim is never held back by pacing, no rate token is spent on a call the claim may
        answer from its receipt, and no budget charge held for such a call refuses a call
        that needs it.
        """
        out = self._queue(org_id, provider, want, reply, now, exempt, immediate)
        self.pacing.acquired((org_id, provider), now, out)
        return out

    def _queue(
        self, org_id: str, provider: str, want: int, reply: Any, now: float, exempt: bool, immediate: bool
    ) -> Decisions:
        """:meth:`acquire` before its pacing hears of it."""
        if self.stopped:
            return Decisions(refusals=[(reply, CallCancelledError("the dispatcher is stopping"))])
        key = (org_id, provider)
        new = key not in self.buckets
        bucket = self.bucket(org_id, provider)
        verdict = self.circuits[key].admits(now)
        if verdict == "refuse":
            return Decisions(refusals=[(reply, self.unavailable_error(key))])
        wkey = (org_id, provider, exempt)
        budgeted = self.limits["provider_calls"] is not None
        if immediate and (verdict != "go" or self.waiters.get(wkey) or not self.unpaced(key) or budgeted):
            out = Decisions(grants=[(reply, -1)])
        else:
            waiter = _Waiter(max(1, want), reply, next(self._arrivals), exempt, now)
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
        alone); a half-open circuit's probe is marked sent only once its charge went through.
        """
        out = Decisions()
        blocked: set[tuple[str, str, bool]] = set()
        while True:
            heads = [(q[0].seq, wkey) for wkey, q in self.waiters.items() if q and wkey not in blocked]
            if not heads:
                break
            wkey = min(heads)[1]
            key = (wkey[0], wkey[1])
            queue, bucket = self.waiters[wkey], self.buckets[key]
            n = self.pacing.grantable(wkey, queue[0].want, bucket, now, out)
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
                continue
            bucket.admission_wait_s += max(0.0, now - waiter.since)
            self.pacing.take(wkey, bucket, n, now)
            if wkey[2]:
                bucket.nested_out += n
            out.grants.append((waiter.reply, n))
        out.wake_at = self.pacing.next_wake(now, out)
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


class GovernorPacing(abc.ABC):
    """How a :class:`Governor` paces: the rate, Retry-After pauses and circuit of each
    (org, provider). The governor keeps budgets, ceilings and waiters, and asks its pacing
    at each of these steps; every method runs on the governor's thread.

    The governor calls :meth:`attach` once, from its constructor.
    """

    gov: Governor

    def attach(self, governor: Governor) -> None:
        """Pace for ``governor`` (its buckets, circuits and waiters)."""
        self.gov = governor

    @abc.abstractmethod
    def unpaced(self, key: BucketKey) -> bool:
        """No rate applies to ``key`` now (slots may be granted before a claim)."""

    def refresh_report(self, now: float) -> None:  # noqa: B027 - a hook: only a shared pacer needs it
        """Bring what the pacing report reads up to date."""

    def acquired(self, key: BucketKey, now: float, out: Decisions) -> None:  # noqa: B027 - a hook
        """After a request for slots of ``key`` was answered (queued, granted or refused)."""

    @abc.abstractmethod
    def grantable(
        self, wkey: tuple[str, str, bool], want: int, bucket: ProviderBucket, now: float, out: Decisions
    ) -> int | None:
        """Slots the head waiter of ``wkey`` may have now (0: wait), or None: refuse them all."""

    @abc.abstractmethod
    def take(self, wkey: tuple[str, str, bool], bucket: ProviderBucket, n: int, now: float) -> None:
        """Take ``n`` granted (and charged) slots."""

    @abc.abstractmethod
    def next_wake(self, now: float, out: Decisions) -> float | None:
        """When a waiter left waiting may be granted, or None."""

    @abc.abstractmethod
    def backpressure(
        self, org_id: str, provider: str, retry_after: Any, now: float, wall: float, sent_at: float | None
    ) -> Decisions:
        """A 429: pause (org, provider) and cut its rate once per congestion event."""

    @abc.abstractmethod
    def release(
        self, org_id: str, provider: str, count: int, successes: int, now: float, unavailable: int,
        answered: int | None, exempt: bool, refunds: int, sent_at: Sequence[float],
    ) -> Decisions:  # fmt: skip
        """Slots given back with their outcomes (see :meth:`Governor.release`)."""


class LocalPacing(GovernorPacing):
    """Pacing by this process alone: the governor's :class:`~actors.pacing.bucket.ProviderBucket`
    and :class:`~actors.pacing.circuit.Circuit` of each (org, provider)."""

    def unpaced(self, key: BucketKey) -> bool:
        """No rate applies to ``key`` now (its bucket counts concurrency alone)."""
        return self.gov.buckets[key].rate is None

    def grantable(
        self, wkey: tuple[str, str, bool], want: int, bucket: ProviderBucket, now: float, out: Decisions
    ) -> int | None:
        """Slots the head waiter of ``wkey`` may have now (0: wait), or None: refuse them all."""
        verdict = self.gov.circuits[(wkey[0], wkey[1])].admits(now)
        if verdict == "refuse":  # opened while these waited (defensive: release refuses them)
            return None
        if verdict == "wait" and not wkey[2]:
            # a half-open circuit's probe is out; a nested call is not held by it, since
            # its parent, waiting on it, may be that probe (which would then never settle)
            return 0
        if verdict == "probe":
            want = 1
        if wkey[2]:  # exempt: the provider's rate only
            return min(want, _rate_room(bucket, now))
        return min(want, bucket.available(now), self.gov.ceiling - self.gov.in_flight)

    def take(self, wkey: tuple[str, str, bool], bucket: ProviderBucket, n: int, now: float) -> None:
        """Take ``n`` granted (and charged) slots from the bucket and the ceiling."""
        circuit = self.gov.circuits[(wkey[0], wkey[1])]
        if circuit.admits(now) == "probe":
            circuit.probe_sent(wkey[2])
        if wkey[2]:
            if bucket.rate is not None:
                bucket.tokens -= n
        else:
            bucket.take(n, now)
            self.gov.in_flight += n

    def next_wake(self, now: float, out: Decisions) -> float | None:
        """When a waiter left waiting may be granted (the earliest bucket refill), or None."""
        wake_at: float | None = None
        for wkey, queue in self.gov.waiters.items():
            if queue:
                ready = self.gov.buckets[(wkey[0], wkey[1])].ready_at(now, concurrency=not wkey[2])
                if ready is not None and ready > now:
                    wake_at = ready if wake_at is None else min(wake_at, ready)
        return wake_at

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
        pause = self.gov.pause_s(retry_after, wall)
        jitter = self.gov.rng() * min(1.0, 0.1 * pause)
        bucket = self.gov.bucket(org_id, provider)
        bucket.on_backpressure(pause, jitter, now, sent_at=sent_at, retry_after=retry_after)
        out = self.gov.wake(now)
        out.gates[(org_id, provider)] = (bucket.rate, bucket.gate_until)
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
        """Return ``count`` slots; ``successes`` of them feed AIMD's additive increase (or
        the unknown limit's learner, with ``sent_at``: when their requests went out, on
        ``now``'s clock, where known); ``unavailable`` ones (and ``answered``: any answer
        from the provider, successes included; default ``successes``) drive the
        provider's circuit. When it opens, every waiter of (org, provider) is refused with
        ProviderUnavailableError."""
        key = (org_id, provider)
        bucket = self.gov.bucket(org_id, provider)
        self.gov.return_slots(bucket, count, exempt, refunds)
        rate = bucket.rate
        for i in range(successes):
            bucket.on_success(now, sent_at[i] if i < len(sent_at) else None)
        circuit = self.gov.circuits[key]
        answered_n = successes if answered is None else answered
        opened = False  # a release with no verdict may be another call's, the probe still out
        if (
            answered_n
            or unavailable
            or not (circuit.probing and self.gov.probe_out(key, circuit.probe_exempt))
        ):
            opened = circuit.record(answered_n, unavailable, now)
        refusals = self.gov.refuse_waiters(key) if opened else []
        out = self.gov.wake(now)
        out.refusals.extend(refusals)
        if opened:
            out.closed[key] = circuit.open_until
        if bucket.rate != rate:
            out.gates[(org_id, provider)] = (bucket.rate, None)
        return out


def _rate_room(bucket: ProviderBucket, now: float) -> int:
    """Grants the bucket's rate allows at ``now``, its max_concurrency aside (nested calls)."""
    if now < bucket.gate_until:
        return 0
    bucket.refill(now)
    if bucket.rate is None:
        return 1 << 30
    return math.floor(bucket.tokens + 1e-9)
