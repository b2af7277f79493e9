"""The pacer shared through Redis (made by :func:`actors.pacing.pacer_url.open_pacer`).

redis-py is imported here, inside :class:`RedisPacer`'s constructor, so a process that
never opens a Redis pacer does not need it, and one that does imports it after gevent
patched the socket module (redis-py's sockets then yield to the hub). The rules run on
the server are the Lua script ``pacer.lua`` shipped inside this package (:data:`SCRIPT`).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any

import attrs

from actors.pacing.pacers import LocalPacer, Pacer
from actors.pacing.quotas import QuotaOp, QuotaRead, TakeUnits, UnitsTaken
from actors.pacing.redis_quotas import QUOTA_SCRIPT, parse_quota_reply, quota_args, quota_ttl_ms
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

__all__ = ["DEFAULT_PREFIX", "SCRIPT", "RedisPacer", "parse_reply", "script_args"]

log = logging.getLogger("tooldispatch")

DEFAULT_PREFIX = "tooldispatch:pacer"

SCRIPT = resources.files("actors.pacing").joinpath("pacer.lua").read_text(encoding="utf-8")
"""The Lua script every verb runs (``actors/pacing/pacer.lua``, package data; its header
documents the keys and arguments)."""


def _redact(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


_ESCAPES = str.maketrans({"%": "%25", "/": "%2F", "{": "%7B", "}": "%7D"})


def _escape(name: str) -> str:
    return name.translate(_ESCAPES)


def _num(x: float | None) -> str:
    return "0" if x is None else repr(float(x))


def script_args(op: PacerOp, limits: ProviderLimits, settings: PacerSettings, worker: str = "") -> list[str]:
    """The script's ARGV for ``op`` on a bucket started from ``limits`` (the layout is in
    ``pacer.lua``'s header). ``worker``: name this worker in the bucket's workers set (a
    take only; ``""``: leave the set alone).

    Raises:
        TypeError: ``op`` is not a pacer operation.
    """
    s = settings
    burst = -1.0 if limits.burst is None else limits.burst
    head = [_num(limits.rate_rps), str(int(limits.slow_start)), repr(float(burst))]
    head += [str(math.ceil(s.state_ttl_s * 1000)), repr(s.use_window_s)]
    if isinstance(op, Take):
        own = [
            "take",
            str(op.n),
            "1" if op.partial else "0",
            worker,
            repr(s.presence_s),
            repr(s.probe_lease_s),
            "1" if op.nested else "0",
            "0" if op.key is None else "1",
            op.key or "",
            repr(float(op.weight)),
            repr(s.fair_window_s),
        ]
    elif isinstance(op, Pause):
        cut = -1 if op.cut_version is None else op.cut_version
        own = ["pause", repr(float(op.pause_s)), str(cut), repr(s.decrease), repr(s.slow_start_decrease)]
        own += [repr(s.min_rps), repr(s.unpaced_start_rps)]
    elif isinstance(op, Grow):
        own = ["grow", repr(op.add_rps), repr(op.mul), _num(limits.max_rps), repr(s.in_use_fraction)]
    elif isinstance(op, SetRate):
        own = ["set", _num(op.rate_rps), str(int(op.slow_start))]
    elif isinstance(op, Record):
        own = ["record", str(op.answered), str(op.unavailable), str(s.circuit_failures or 0)]
        own += [repr(s.circuit_open_s), repr(s.circuit_open_max_s)]
    elif isinstance(op, Learn):
        rate, slow, limit, phase, cuts = op.publish or (-1.0, False, None, "unpaced", 0)
        lease_ms = str(math.ceil(s.learner_lease_s * 1000))
        own = ["learn", str(op.accepted), op.holder, lease_ms, repr(float(rate)), str(int(slow))]
        own += [_num(limit), str(PHASES.index(phase)), str(cuts), repr(s.in_use_fraction)]
    elif isinstance(op, Rejoin):
        own = ["rejoin", repr(float(op.spent)), repr(float(op.pause_s)), _num(op.rate_rps), str(op.away)]
        own += [repr(float(op.share)), repr(float(op.since_s)), repr(s.away_s)]
    elif isinstance(op, ReadState):
        own = ["state"]
    else:
        raise TypeError(f"not a pacer operation: {op!r}")
    return [own[0], *head, *own[1:]]


def parse_reply(op: PacerOp, reply: Sequence[str], degraded: bool = False) -> PacerState:
    """The script's reply to ``op`` as the value :class:`~actors.pacing.pacers.Pacer`'s verb
    returns (``Grant.workers`` and ``Grant.rank`` are -1 when the take named no worker)."""
    rate, ref = float(reply[1]), float(reply[2])
    base: dict[str, Any] = {
        "rate_rps": rate if rate > 0 else None,
        "reference_rps": ref if ref > 0 else None,
        "version": int(float(reply[3])),
        "slow_start": reply[4] == "1",
        "degraded": degraded,
    }
    if isinstance(op, Take):
        granted, wait_s, verdict, workers = int(float(reply[5])), float(reply[6]), reply[7], int(reply[8])
        owed_s, rank = float(reply[9]), int(reply[10])
        return Grant(
            **base, granted=granted, wait_s=wait_s, verdict=verdict, workers=workers, owed_s=owed_s, rank=rank
        )
    if isinstance(op, Pause):
        return Paused(**base, cut=reply[5] == "1", pause_s=float(reply[6]))
    if isinstance(op, Grow):
        return Grown(**base, grown=reply[5] == "1")
    if isinstance(op, Record):
        return CircuitRecorded(**base, opened=reply[5] == "1", open_s=float(reply[6]))
    if isinstance(op, Learn):
        limit_rps = float(reply[12])
        return Learnt(
            **base,
            leader=reply[5] == "1",
            accepted=round(float(reply[6])),
            events=int(float(reply[7])),
            event_ago_s=float(reply[8]),
            event_accepted=round(float(reply[9])),
            pause_in_s=float(reply[10]),
            in_use=reply[11] == "1",
            limit_rps=limit_rps if limit_rps > 0 else None,
            phase=PHASES[min(len(PHASES) - 1, max(0, int(float(reply[13]))))],
            cuts=int(float(reply[14])),
        )
    return PacerState(**base)


def _scaled(op: PacerOp, share: float) -> PacerOp:
    """``op`` with its rates (a growth step, a rate set or published, a limit) scaled to
    this worker's ``share``: pacing alone, a worker never grows, or is set, past its share
    of what the workers would have together (None and values <= 0 mean "none" and stay)."""

    def scale(x: float | None) -> float | None:
        return x * share if x is not None and x > 0 else x

    if isinstance(op, Grow):
        return attrs.evolve(op, add_rps=op.add_rps * share if op.add_rps > 0 else op.add_rps)
    if isinstance(op, SetRate):
        return attrs.evolve(op, rate_rps=scale(op.rate_rps))
    if isinstance(op, Learn) and op.publish is not None:
        rate, slow, limit, phase, cuts = op.publish
        return attrs.evolve(op, publish=(rate * share if rate > 0 else rate, slow, scale(limit), phase, cuts))
    return op


OUTAGE_SERVICE = "pacer"
"""The service name outages of Redis are counted under (``Pacer.outage_log``)."""


class RedisPacer(Pacer):
    """Pacing state shared by every worker pointed at one Redis (7 or later).

    Each verb is one EVALSHA of :data:`SCRIPT` (loaded with SCRIPT
    LOAD on first use and again when Redis answers NOSCRIPT: a restart or failover
    flushed its script cache), atomic on the server and timed by its ``TIME``. Keys are
    ``{prefix}:{<org>/<provider>}:state`` (a hash), ``...:workers`` (a sorted set) and
    ``...:learner`` (the learner lease, a string) and ``...:fair`` (the fairness keys taking,
    a hash), each written with a TTL
    (``state_ttl_s`` past the last write, longer while a pause or an open circuit lasts;
    ``2 * presence_s`` for the workers; ``learner_lease_s`` for the lease).

    **Redis away.** Connecting and reading time out after ``connect_timeout_s`` /
    ``timeout_s`` and are never retried inside a call, so no call waits longer than
    that. A Redis that answers but cannot serve the call (READONLY: the address now names a
    replica after a failover; CLUSTERDOWN; OOM at maxmemory; BUSY; LOADING: any
    redis-py error) counts as away too. A call that fails that
    way is answered by a :class:`LocalPacer` instead, and the pacer says so: one warning
    in the ``tooldispatch`` log, ``degraded=True`` on every reply and in :meth:`snapshot`,
    and the outage with its duration in ``outage_log`` (a run's report names it).
    The local pacer paces each bucket at a conservative share of the last shared rate this worker saw:
    ``share = 1 / max(expected_workers, workers seen taking from that bucket)``, with
    the burst scaled the same way (at least one token); a bucket with no rate yet
    (unpaced) is paced at ``unpaced_start_rps * share``. It never runs unpaced. A share
    starts from what the shared bucket had granted ahead (its first token comes when the
    shared bucket would have had one again), and the workers' shares run out of phase:
    worker ``rank`` (its place among the workers by name) paces at the points
    ``(rank + j * n) / rate`` of Redis's clock. Every ``retry_s`` one call tries Redis
    again; when it answers the pacer hands over what each share did
    (:class:`~actors.pacing.values.Rejoin`: the tokens it granted ahead, its pause, a rate
    it cut, and the other workers presumed still local, whose shares the workers on
    Redis leave free until each is back or ``away_s`` has passed), rejoins (an info line)
    and drops the local state.

    Args:
        url: a redis-py URL (``redis://host:port/db``), or a ready ``redis.Redis`` client
            (then its own timeouts apply).
        limits / settings: as :class:`~actors.pacing.pacers.Pacer`.
        prefix: key prefix (tests use a unique one and delete it); the keys are
            ``PREFIX:{...}``, so trailing colons are dropped (``newcomer:`` gives
            ``newcomer:{...}``, not ``newcomer::{...}``).
        expected_workers: workers assumed to share a bucket when Redis is away.
        connect_timeout_s / timeout_s: socket connect and read timeouts, seconds.
        retry_s: while degraded, how often a call tries Redis again.
        worker_id: this worker's name in the workers set (default host:pid:random).
        clock: monotonic seconds for the retry schedule and the local fallback.

    Raises:
        ValueError: an empty ``prefix`` (or one of colons only).
    """

    backend = "redis"

    def __init__(
        self,
        url: Any,
        limits: Mapping[str, ProviderLimits] | None = None,
        settings: PacerSettings | None = None,
        *,
        prefix: str = DEFAULT_PREFIX,
        expected_workers: int = 4,
        connect_timeout_s: float = 0.25,
        timeout_s: float = 0.5,
        retry_s: float = 1.0,
        worker_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not prefix.rstrip(":"):
            raise ValueError(f"a Redis pacer needs a key prefix (default {DEFAULT_PREFIX!r}), got {prefix!r}")
        prefix = prefix.rstrip(":")
        super().__init__(limits, settings)
        import redis  # lazily: after gevent patching
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.client: Any
        """The Redis client every call goes through (made from ``url``, or ``url`` itself)."""
        if isinstance(url, str):
            self.url = _redact(url)
            self.client = redis.Redis.from_url(
                url,
                socket_connect_timeout=connect_timeout_s,
                socket_timeout=timeout_s,
                retry=Retry(NoBackoff(), 0),
                decode_responses=True,
            )
        else:
            self.url, self.client = repr(url), url
        errors = redis.exceptions
        # away, or unable to serve this call: a replica after a failover (READONLY), a
        # cluster without a master, maxmemory (OOM), a busy script, a loading dataset...:
        # any error from Redis (NOSCRIPT is handled in _run). A caller waiting on a pacer
        # call that raised would never be granted (its actor only logs the error).
        self._down_errors: tuple[type[BaseException], ...] = (errors.RedisError, OSError)
        self._noscript = redis.exceptions.NoScriptError
        self.prefix = prefix
        self.expected_workers = max(1, expected_workers)
        self.retry_s = retry_s
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.clock = clock
        self._sha: str | None = None
        self._quota_sha: str | None = None
        self._lock = threading.Lock()
        self._presence_at: dict[tuple[str, str], float] = {}
        self._seen: dict[tuple[str, str], tuple[float | None, int, int]] = {}
        self._fallback = LocalPacer({}, self.settings, clock)
        self._seeded: dict[tuple[str, str], int] = {}
        """(org, provider) paced locally -> the rate version it started from."""
        self._owed: dict[tuple[str, str], tuple[float, int]] = {}
        """(org, provider) -> (when the shared bucket's grants run out, this clock; this
        worker's rank), as the last take said."""
        self._offset = 0.0
        """Redis's clock less this one, as the last reply said (seconds)."""
        self._holds: dict[tuple[str, str], tuple[float, float]] = {}
        """(org, provider) -> (paused until, circuit open until), this clock, as Redis last
        said: the local fallback keeps them."""
        self._degraded_since: float | None = None
        self._retry_at = 0.0
        self.outages = 0
        self.script_loads = 0
        self.last_error = ""

    def keys(self, org_id: str, provider: str) -> list[str]:
        """The Redis keys of (org, provider): [state hash, workers sorted set, learner lease,
        fairness keys hash].

        ``%``, ``/``, ``{`` and ``}`` in the names are percent-escaped (``a/b`` + ``c`` and
        ``a`` + ``b/c`` are two buckets; a brace cannot move the cluster hash tag); other
        names keep the keys of earlier releases."""
        base = f"{self.prefix}:{{{_escape(org_id)}/{_escape(provider)}}}"
        return [f"{base}:state", f"{base}:workers", f"{base}:learner", f"{base}:fair"]

    def _eval(self, org_id: str, provider: str, op: PacerOp) -> list[str]:
        """One EVALSHA of ``op`` (the script loaded again if Redis lost it); the raw reply."""
        keys = self.keys(org_id, provider)
        worker = ""
        if isinstance(op, Take):  # name this worker in the workers set every presence_s / 4
            now, key = self.clock(), (org_id, provider)
            if now >= self._presence_at.get(key, -math.inf) + self.settings.presence_s / 4:
                self._presence_at[key] = now
                worker = self.worker_id
        argv = script_args(op, self.limits_of(provider), self.settings, worker)
        sha = self._sha or self._load()
        sent = self.clock()
        try:
            reply = self.client.evalsha(sha, len(keys), *keys, *argv)
        except self._noscript:  # the script cache was flushed (restart, failover, SCRIPT FLUSH)
            reply = self.client.evalsha(self._load(), len(keys), *keys, *argv)
        self._offset = float(reply[0]) - (sent + self.clock()) / 2
        return [str(x) for x in reply]

    def apply_quota(self, org_id: str, provider: str, op: QuotaOp) -> QuotaRead:
        """One EVALSHA of ``quotas.lua`` on ``{...}:quota``; while Redis is away, this
        worker's share of each limit, kept locally (a quota's count starts afresh there:
        each worker takes at most its share of it meanwhile)."""
        limits = self.unit_limits.get(provider, ())
        ttl = quota_ttl_ms(limits, self.settings.state_ttl_s)
        argv = quota_args(op, limits, ttl)
        if argv is None:
            return QuotaRead(room=())
        now = self.clock()
        if self._degraded_since is None or now >= self._retry_at:
            try:
                key = self.keys(org_id, provider)[0].rsplit(":", 1)[0] + ":quota"
                sha = self._quota_sha or self._load_quota()
                try:
                    reply = self.client.evalsha(sha, 1, key, *argv)
                except self._noscript:
                    reply = self.client.evalsha(self._load_quota(), 1, key, *argv)
                return parse_quota_reply(op, [str(x) for x in reply], len(limits))
            except self._down_errors as exc:
                self._degrade(exc, now)
        share = self._share((org_id, provider))
        self._fallback.unit_limits[provider] = tuple(
            attrs.evolve(
                lim, amount=lim.amount * share, burst=None if lim.burst is None else lim.burst * share
            )
            for lim in limits
        )
        reply = self._fallback.apply_quota(org_id, provider, op)
        if isinstance(op, TakeUnits) and not isinstance(reply, UnitsTaken):  # pragma: no cover
            raise TypeError(reply)
        return reply

    def _load_quota(self) -> str:
        sha: str = self.client.script_load(QUOTA_SCRIPT)
        self._quota_sha = sha
        return sha

    def _load(self) -> str:
        sha: str = self.client.script_load(SCRIPT)
        self._sha = sha
        self.script_loads += 1
        return sha

    def apply(self, org_id: str, provider: str, op: PacerOp) -> PacerState:
        """One EVALSHA of ``op``; while Redis is away, the local fallback's reply
        (``degraded=True``)."""
        key = (org_id, provider)
        now = self.clock()
        if self._degraded_since is None or now >= self._retry_at:
            try:
                if self._degraded_since is not None:
                    self._hand_over()
                reply = parse_reply(op, self._eval(org_id, provider, op))
            except self._down_errors as exc:
                self._degrade(exc, now)
            else:
                if self._degraded_since is not None:
                    self._rejoin()
                workers = self._seen.get(key, (None, 0, 1))[2]
                if isinstance(reply, Grant):
                    rank = self._owed.get(key, (0.0, 0))[1]
                    if reply.workers == -1:
                        reply = attrs.evolve(reply, workers=workers, rank=rank)
                    workers = reply.workers
                    self._owed[key] = (now + reply.owed_s, reply.rank)
                self._seen[key] = (reply.rate_rps, reply.version, workers)
                self._hold(key, reply, now)
                return reply
        return attrs.evolve(self._local(org_id, provider, op), degraded=True)

    def _hold(self, key: tuple[str, str], reply: PacerState, now: float) -> None:
        """Note a pause or an open circuit the reply tells of (or that one has ended)."""
        paused, opened = self._holds.get(key, (0.0, 0.0))
        if isinstance(reply, Grant):
            left = reply.wait_s if reply.wait_s != math.inf else 0.0
            if reply.verdict == "paused":
                paused = now + left
            elif reply.verdict == "refuse":
                opened = now + left
            elif reply.verdict != "wait":  # granted: neither holds now
                paused = opened = 0.0
        elif isinstance(reply, Paused):
            paused = now + reply.pause_s
        elif isinstance(reply, CircuitRecorded):
            opened = now + reply.open_s if reply.open_s > 0 else 0.0
        if paused > now or opened > now:
            self._holds[key] = (paused, opened)
        else:
            self._holds.pop(key, None)

    def _share(self, key: tuple[str, str]) -> float:
        return 1.0 / max(self.expected_workers, self._seen.get(key, (None, 0, 1))[2])

    def _local(self, org_id: str, provider: str, op: PacerOp) -> PacerState:
        key = (org_id, provider)
        with self._lock:
            if key not in self._seeded:
                self._seed(key)
            share = self._share(key)
        return self._fallback.apply(org_id, provider, _scaled(op, share))

    def _seed(self, key: tuple[str, str]) -> None:
        """Start the local share of (org, provider) from the shared state last seen: its
        rate and burst times this worker's share, its pause and open circuit, and what
        the shared bucket had granted ahead (its first token comes when the shared bucket
        would have had one again). The shares of the workers run out of phase: worker
        ``rank`` of ``n`` paces at the points ``(rank + j * n) / rate`` of Redis's clock."""
        org_id, provider = key
        share = self._share(key)
        lim = self.limits_of(provider)
        full, version, _ = self._seen.get(key, (lim.rate_rps, 0, 1))
        full = full if full is not None else self.settings.unpaced_start_rps
        rate = full * share
        burst = None if lim.burst is None else max(1.0, lim.burst * share)
        max_rps = None if lim.max_rps is None else lim.max_rps * share
        self._fallback.limits[provider] = ProviderLimits(rate_rps=rate, burst=burst, max_rps=max_rps)
        paused, opened = self._holds.get(key, (0.0, 0.0))
        now = self.clock()
        runs_out, rank = self._owed.get(key, (now, 0))
        shared_burst = max(1.0, lim.burst if lim.burst is not None else 1 + full / 100)
        first = max(now, runs_out - (shared_burst - 1) / full)
        spacing, period = 1 / full, 1 / rate
        phase = (rank * spacing - self._offset) % period
        first += (phase - first) % period  # this worker's next point on its grid
        self._fallback.seed(
            org_id, provider, rate, version, pause_s=paused - now, open_s=opened - now,
            first_s=first - now, phase=phase,
        )  # fmt: skip
        self._seeded[key] = version

    def _degrade(self, exc: BaseException, now: float) -> None:
        with self._lock:
            self._retry_at = now + self.retry_s
            self.last_error = f"{type(exc).__name__}: {exc}"
            if self._degraded_since is not None:
                return
            self._degraded_since = now
            self.outages += 1
        self.outage_log.failed(OUTAGE_SERVICE, self.url, self.last_error)
        log.warning(
            "pacer %s unreachable (%s): pacing locally at 1/%d of the last shared rates (or of what "
            "each provider starts at) until it answers again; retrying every %.1f s",
            self.url, self.last_error, self.expected_workers, self.retry_s,
        )  # fmt: skip

    def _hand_over(self) -> None:
        """What each local share did goes to Redis first (raises if it is still away): the
        tokens it granted ahead of its rate, its pause, the rate it learnt (a local cut,
        scaled back to every worker's), and the other workers its share was counted for
        (``max(expected_workers, workers seen) - 1``), presumed still local (see
        :class:`~actors.pacing.values.Rejoin`)."""
        now = self.clock()
        since = 0.0 if self._degraded_since is None else now - self._degraded_since
        for key, version in list(self._seeded.items()):
            state = self._fallback.bucket_state(*key)
            if state is None:
                continue
            share = self._share(key)
            spent = max(0.0, state.tat - now) * state.rate if state.rate > 0 else 0.0
            learnt = state.rate / share if state.ver != version and state.rate > 0 else None
            op = Rejoin(  # the others: as many as the shares were counted for
                spent=spent, pause_s=max(0.0, state.pause - now), rate_rps=learnt,
                away=max(0, round(1 / share) - 1), share=share, since_s=since,
            )  # fmt: skip
            self._eval(key[0], key[1], op)

    def _rejoin(self) -> None:
        with self._lock:
            if self._degraded_since is None:
                return
            self._degraded_since = None
            self._seeded.clear()
            self._fallback.forget()
            self._presence_at.clear()  # name this worker in its next take (it is back)
        self.outage_log.answered(OUTAGE_SERVICE, self.url)
        log.info("pacer %s answers again: workers share its pacing state again", self.url)

    def snapshot(self) -> dict[str, Any]:
        """``backend``, ``url`` (password redacted), ``prefix``, ``degraded`` (True while
        pacing locally), ``outages`` (times it went away), ``script_loads`` (1 + NOSCRIPT
        reloads), ``last_error``, and per bucket the last shared ``rate`` and ``workers``."""
        return {
            "backend": self.backend,
            "url": self.url,
            "prefix": self.prefix,
            "degraded": self._degraded_since is not None,
            "outages": self.outages,
            "script_loads": self.script_loads,
            "last_error": self.last_error,
            "buckets": {
                f"{org}/{provider}": {"rate": rate, "version": version, "workers": workers}
                for (org, provider), (rate, version, workers) in self._seen.items()
            },
        }

    def wall_time(self, fallback: float) -> float:
        """Redis's ``TIME`` (one round trip; ``fallback`` when it does not answer)."""
        if self._degraded_since is not None:
            return fallback
        try:
            seconds, micros = self.client.time()
        except self._down_errors:
            return fallback
        return float(seconds) + float(micros) / 1e6

    def close(self) -> None:
        """Close the Redis connections."""
        self.client.close()
