"""The state of a provider's limits beyond its request rate: rates and quotas in units.

:class:`QuotaState` keeps, per (org, provider), one entry per :class:`~actors.tool.Limit`
the quota state holds (``Pacing.unit_limits``), in their order:

* a **rate** (a window of a second or less): GCRA (ITU-T I.371, the "virtual scheduling"
  form) over units: a theoretical arrival time ``tat`` moves ``units / rate`` later per
  take; a take fits while ``max(tat, now) + units / rate - now <= max(burst, units) / rate``
  (a request larger than the burst goes when the bucket is full);
* a **quota** (a longer window ``w``): units counted in :data:`SUB_BUCKETS` sub-buckets of
  ``d = w / SUB_BUCKETS`` each; a take at ``now`` fits when the sub-buckets from
  ``floor(now / d) - span`` to ``floor(now / d)`` hold no more than ``amount`` with it,
  ``span`` being the window's sub-buckets and those of :data:`SLACK_S` (at least one).
  Those cover every window of length ``w + SLACK_S`` ending now, so no window of length
  ``w`` ever holds more than ``amount``, even with up to a second between a grant and the
  provider counting the request (a provider counting fixed windows is held too); the
  cost, sustained: about ``amount`` per ``w + 1.5 s`` (a minute's quota: 97.5 % of it).
  While a provider's announcement of that quota is live (until its reset), the room is
  the smaller of its own count's and the announced remaining count (the stated limit is
  the user's own cap: an announcement only lowers it).

Each limit's state is kept under its own identity (:func:`limit_key`), not its place in
a list: callers stating different lists of limits share the limits they have in common.

Operations (:data:`QuotaOp`) come in, replies go out (:class:`UnitsTaken`,
:class:`QuotaRead`), as :class:`~actors.pacing.pacer_state.BucketState`'s; time is passed
in, and every time in an op or a reply is relative (seconds ago / from now), so a
pacer's clock never mixes with its caller's. The Redis script ``quotas.lua`` applies the
same rules (a conformance test holds them to the same replies).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs

from actors.tool import Limit

__all__ = [
    "ANNOUNCED_WINDOW_TOLERANCE",
    "SLACK_S",
    "SUB_BUCKETS",
    "Announce",
    "Correct",
    "GiveBack",
    "QuotaOp",
    "QuotaRead",
    "QuotaState",
    "TakeUnits",
    "UnitsTaken",
    "announced_limit",
    "limit_key",
    "request_units",
    "span",
]

SUB_BUCKETS = 60
"""Sub-buckets a quota's window is counted in."""
SLACK_S = 1.0
"""Seconds counted past the window (at least one sub-bucket): a margin for the time
between a grant and the provider's count of the request (the receipt's mark, the send
gate, the network)."""


def span(lim: Limit) -> int:
    """Sub-buckets counted before the current one: the window's and the slack's."""
    d = lim.window_s / SUB_BUCKETS
    return SUB_BUCKETS + max(1, math.ceil(SLACK_S / d - 1e-9))


EPS = 1e-9
ANNOUNCED_WINDOW_TOLERANCE = 0.1
"""An announcement with a window is of a quota of its unit whose window is within this
fraction of it (a provider's "minute" is never a stated day's count)."""


def limit_key(lim: Limit) -> str:
    """A limit's own identity in the quota state: its unit, window, amount (as a float:
    5 and 5.0 are one limit) and kind (rate or quota). Its counts are kept under it, not
    under its place in a list, so processes stating overlapping lists of limits (a rolling
    deploy) share the counts of the limits they have in common and never reset each
    other's; the same limit stated twice is one limit."""
    kind = "r" if lim.is_rate else "q"
    return f"{kind}|{float(lim.window_s)!r}|{float(lim.amount)!r}|{lim.unit}"


def _distinct(limits: Sequence[Limit]) -> list[tuple[str, Limit]]:
    """(key, limit) of each distinct limit, first occurrence first."""
    seen: dict[str, Limit] = {}
    for lim in limits:
        seen.setdefault(limit_key(lim), lim)
    return list(seen.items())


def request_units(limit: Limit, units: Mapping[str, float]) -> float:
    """What one request counts against ``limit``: 1 for a limit in requests, else its
    stated ``units`` of the limit's unit (0 when it states none)."""
    if limit.unit == "requests":
        return 1.0
    return float(units.get(limit.unit, 0.0))


@attrs.frozen(kw_only=True)
class TakeUnits:
    """Take the units of up to ``len(requests)`` requests from every limit, all limits or
    none per request; as many requests (from the first) as fit; replied with
    :class:`UnitsTaken`."""

    requests: tuple[Mapping[str, float], ...]
    """Per request: unit -> units it is expected to use."""


@attrs.frozen(kw_only=True)
class GiveBack:
    """Give back the units of requests granted ``age_s`` seconds ago and never sent;
    replied with :class:`QuotaRead`."""

    units: Mapping[str, float]
    """Unit -> units (summed over the requests); ``"requests"``: how many requests."""
    age_s: float = 0.0


@attrs.frozen(kw_only=True)
class Correct:
    """Correct the units of answered requests granted ``age_s`` seconds ago by
    ``delta`` (real use less the estimate, per unit; negative: less was used);
    replied with :class:`QuotaRead`."""

    delta: Mapping[str, float]
    age_s: float = 0.0


@attrs.frozen(kw_only=True)
class Announce:
    """A provider announced a quota's count: ``remaining`` units of ``unit`` until
    ``reset_s`` seconds from now, in its answer to a request sent ``sent_ago_s`` seconds
    ago (units granted since are taken from it). It applies to a quota of its unit whose
    window is within :data:`ANNOUNCED_WINDOW_TOLERANCE` of ``window_s`` (None: the
    longest of its unit), and only lowers its room. Replied with
    :class:`QuotaRead`; an announcement no limit counts is ignored."""

    unit: str
    remaining: float
    reset_s: float
    sent_ago_s: float = 0.0
    window_s: float | None = None


QuotaOp = TakeUnits | GiveBack | Correct | Announce
"""Any operation on a :class:`QuotaState`."""


@attrs.frozen(kw_only=True)
class QuotaRead:
    """Reply to every op but a take: the units each limit has room for now, in order."""

    room: tuple[float, ...]


@attrs.frozen(kw_only=True)
class UnitsTaken(QuotaRead):
    """Reply to :class:`TakeUnits`.

    Attributes:
        granted: requests granted (from the first).
        wait_s: when fewer than asked were granted, seconds until the next request could
            fit (infinity: it never fits: larger than a limit); 0 otherwise.
        limit: the index of the limit that held it back (-1: none).
        reset_s: for a quota that held it back, seconds until its window renews
            (a live announcement's reset, else when its oldest units leave the window).
    """

    granted: int
    wait_s: float
    limit: int
    reset_s: float


@attrs.define
class QuotaState:
    """Per (org, provider), per limit (by :func:`limit_key`, whatever list it is stated
    in): ``tat[k]`` of each rate, ``counts[k]`` (sub-bucket -> units) of each quota,
    ``announced[k]`` = (units remaining, reset at) of a quota whose count the provider
    announced."""

    tat: dict[str, float] = attrs.field(factory=dict)
    counts: dict[str, dict[int, float]] = attrs.field(factory=dict)
    announced: dict[str, tuple[float, float]] = attrs.field(factory=dict)

    def handle(self, op: QuotaOp, now: float, limits: Sequence[Limit]) -> QuotaRead:
        """Apply ``op`` at ``now`` (seconds, any monotonic clock) under ``limits`` (the
        state of a limit not in ``limits`` is kept, untouched: another caller's).

        Raises:
            TypeError: ``op`` is not a quota operation.
        """
        self._expire(now, limits)
        if isinstance(op, TakeUnits):
            return self._take(op, now, limits)
        if isinstance(op, GiveBack):
            self._less(op.units, now - max(0.0, op.age_s), now, limits)
        elif isinstance(op, Correct):
            more = {u: d for u, d in op.delta.items() if d > 0}
            less = {u: -d for u, d in op.delta.items() if d < 0}
            self._add([float(more.get(lim.unit, 0.0)) for lim in limits], now, limits)
            self._less(less, now - max(0.0, op.age_s), now, limits)
        elif isinstance(op, Announce):
            self._announce(op, now, limits)
        else:
            raise TypeError(f"not a quota operation: {op!r}")
        return QuotaRead(room=tuple(self._room(lim, now) for lim in limits))

    # -- the rules ------------------------------------------------------------------------

    def _expire(self, now: float, limits: Sequence[Limit]) -> None:
        for k, lim in _distinct(limits):
            ann = self.announced.get(k)
            if ann is not None and now >= ann[1]:
                del self.announced[k]
            counts = self.counts.get(k)
            if counts:
                oldest = _bucket(now, lim) - span(lim)
                for b in [b for b in counts if b < oldest]:
                    del counts[b]

    def _room(self, lim: Limit, now: float) -> float:
        k = limit_key(lim)
        if lim.is_rate:
            rate = lim.amount / lim.window_s
            return max(0.0, _burst(lim, 0.0) - max(0.0, self.tat.get(k, 0.0) - now) * rate)
        room = max(0.0, lim.amount - _held(self.counts.get(k, {})))
        ann = self.announced.get(k)
        if ann is not None:  # an announcement only lowers it: the stated limit always holds
            return min(room, max(0.0, ann[0]))
        return room

    def _take(self, op: TakeUnits, now: float, limits: Sequence[Limit]) -> UnitsTaken:
        sums = [0.0] * len(limits)
        granted, wait, held, reset = 0, 0.0, -1, 0.0
        for request in op.requests:
            fits = True
            for i, lim in enumerate(limits):
                u = request_units(lim, request)
                w, r = self._wait(lim, sums[i], u, now)
                if w > EPS:
                    if fits or w > wait:
                        wait, held, reset = w, i, r
                    fits = False
            if not fits:
                break
            for i, lim in enumerate(limits):
                sums[i] += request_units(lim, request)
            granted += 1
        if granted:
            self._add(sums, now, limits)
        if granted == len(op.requests):
            wait, held, reset = 0.0, -1, 0.0
        room = tuple(self._room(lim, now) for lim in limits)
        return UnitsTaken(room=room, granted=granted, wait_s=wait, limit=held, reset_s=reset)

    def _wait(self, lim: Limit, before: float, u: float, now: float) -> tuple[float, float]:
        """(seconds until ``u`` more units fit in ``lim`` after ``before`` units taken
        in this op, seconds until its window renews); (0, 0) when they fit now. A quota
        with a live announcement holds both to its own count and to the announced one."""
        k = limit_key(lim)
        total = before + u
        if lim.is_rate:
            rate = lim.amount / lim.window_s
            start = max(self.tat.get(k, 0.0), now)
            need = start + total / rate - _burst(lim, u) / rate - now
            return (need, need) if need > EPS else (0.0, 0.0)
        if u > lim.amount + EPS:
            return math.inf, math.inf
        found = (0.0, 0.0)
        ann = self.announced.get(k)
        if ann is not None and total > ann[0] + EPS:
            found = (ann[1] - now, ann[1] - now)
        counts = dict(self.counts.get(k, {}))
        if before > 0:  # taken earlier in this op: in the current sub-bucket
            b = _bucket(now, lim)
            counts[b] = counts.get(b, 0.0) + before
        held = _held(counts)
        if held + u <= lim.amount + EPS:
            return found
        d = lim.window_s / SUB_BUCKETS
        renew = 0.0
        for b in sorted(counts):  # each leaves the window as the bucket span(lim) later ends
            held -= counts[b]
            renew = (b + span(lim) + 1) * d - now
            if held + u <= lim.amount + EPS:
                break
        first = (min(counts) + span(lim) + 1) * d - now if counts else 0.0
        own = (max(renew, EPS * 2), max(first, 0.0))
        return own if own[0] >= found[0] else found

    def _add(self, totals: Sequence[float], now: float, limits: Sequence[Limit]) -> None:
        seen: set[str] = set()
        for i, lim in enumerate(limits):
            k = limit_key(lim)
            total = totals[i]
            if total <= 0 or k in seen:
                continue
            seen.add(k)
            if lim.is_rate:
                rate = lim.amount / lim.window_s
                self.tat[k] = max(self.tat.get(k, 0.0), now) + total / rate
                continue
            b = _bucket(now, lim)
            counts = self.counts.setdefault(k, {})
            counts[b] = counts.get(b, 0.0) + total
            ann = self.announced.get(k)
            if ann is not None:
                self.announced[k] = (ann[0] - total, ann[1])

    def _less(self, units: Mapping[str, float], at: float, now: float, limits: Sequence[Limit]) -> None:
        """Take ``units`` back, as of requests granted at ``at``: a rate's ``tat`` moves
        back (never making room before ``now`` that was not there), a quota's sub-bucket of
        ``at`` and then older ones lose them (never below 0; the window may then hold the
        rest of those requests' units a little longer: conservative)."""
        for k, lim in _distinct(limits):
            total = float(units.get(lim.unit, 0.0))
            if total <= 0:
                continue
            if lim.is_rate:
                rate = lim.amount / lim.window_s
                tat = self.tat.get(k, 0.0)
                self.tat[k] = max(tat - total / rate, min(tat, now))
                continue
            ann = self.announced.get(k)
            if ann is not None:
                self.announced[k] = (ann[0] + total, ann[1])
            counts = self.counts.get(k, {})
            start = _bucket(at, lim)
            for b in sorted((b for b in counts if b <= start), reverse=True):
                taken = min(total, counts[b])
                counts[b] -= taken
                total -= taken
                if counts[b] <= EPS:
                    del counts[b]
                if total <= EPS:
                    break

    def _announce(self, op: Announce, now: float, limits: Sequence[Limit]) -> None:
        i = announced_limit(op, limits)
        if i is None:
            return
        lim = limits[i]
        k = limit_key(lim)
        since = _bucket(now - max(0.0, op.sent_ago_s), lim)
        counts = self.counts.get(k, {})
        granted_since = 0.0
        for b in sorted(counts):
            if b >= since:
                granted_since += counts[b]
        reset = min(max(0.0, op.reset_s), lim.window_s)
        self.announced[k] = (max(0.0, op.remaining) - granted_since, now + reset)


def announced_limit(op: Announce, limits: Sequence[Limit]) -> int | None:
    """The index of the quota an announcement is of: one counting its unit whose window
    is within :data:`ANNOUNCED_WINDOW_TOLERANCE` of its ``window_s``, the nearest (None:
    the longest of its unit); None when there is none (the announcement is ignored)."""
    found = [(i, lim) for i, lim in enumerate(limits) if lim.unit == op.unit and not lim.is_rate]
    if op.window_s is None:
        return max(found, key=lambda f: f[1].window_s)[0] if found else None
    window = op.window_s
    found = [f for f in found if abs(f[1].window_s - window) <= ANNOUNCED_WINDOW_TOLERANCE * window]
    if not found:
        return None
    return min(found, key=lambda f: abs(f[1].window_s - window))[0]


def _held(counts: Mapping[int, float]) -> float:
    held = 0.0
    for b in sorted(counts):
        held += counts[b]
    return held


def _bucket(t: float, lim: Limit) -> int:
    return math.floor(t / (lim.window_s / SUB_BUCKETS))


def _burst(lim: Limit, units: float) -> float:
    """A rate's tolerance in units: its burst (default a tenth of the window's amount),
    at least ``units`` (one request larger than it goes when the bucket is full)."""
    burst = lim.burst if lim.burst is not None else lim.amount / 10
    return max(burst, units)
