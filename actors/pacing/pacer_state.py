"""The pacing state of one (org, provider) in Python: the rules of the Redis script.

:class:`BucketState` is the Redis script (``actors/pacing/pacer.lua``) line for line (GCRA take,
shared pause with a once-per-event cut, AIMD growth, the circuit with one half-open
probe, the learner lease and the counts an unknown limit is learnt from), run
in-process by :class:`actors.pacing.pacers.LocalPacer` and by a
:class:`~actors.pacing.redis_pacer.RedisPacer` whose Redis is away. It takes the script's
argument list and answers the script's reply list, so one parser reads both and the
conformance suite holds them to the same behaviour.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

__all__ = ["BucketState"]

Reply = list[str]


def _fmt(x: float) -> str:
    return repr(float(x)) if math.isfinite(x) else "inf"


@attrs.define
class BucketState:
    """State of one (org, provider); the fields are the script's (``pacer.lua``'s header)."""

    tat: float = 0.0
    rate: float = 0.0
    ref: float = 0.0
    ver: int = 0
    ss: int = 0
    used: float = 0.0
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
    holder: str = ""
    """The learner lease (the script's ``KEYS[3]``): its holder, until ``lease_until``."""
    lease_until: float = 0.0
    fresh: bool = True
    _burst_arg: float = -1.0
    _use_window: float = 0.5

    def run(self, argv: Sequence[str], now: float) -> Reply:
        """Apply one operation (the script's ARGV) at ``now`` (seconds); the script's reply."""
        op = argv[0]
        init_rate, init_ss = float(argv[1]), int(argv[2])
        self._burst_arg, self._use_window = float(argv[3]), float(argv[5])
        if self.fresh:
            self.rate = self.ref = init_rate
            self.ss, self.used_at, self.fresh = init_ss, now, False
        args = argv[6:]
        if op == "take":
            return self._take(now, int(args[0]), args[1] == "1", float(args[4]))
        if op == "pause":
            return self._pause(now, *(float(a) for a in args[:6]))
        if op == "grow":
            return self._grow(now, *(float(a) for a in args[:4]))
        if op == "set":
            old, self.rate = self.rate, float(args[0])
            self.ref, self.ss, self.ver = self.rate, int(args[1]), self.ver + 1
            self._rescale(old, now)
            return self._state(now, [])
        if op == "record":
            return self._record(now, *(float(a) for a in args[:5]))
        if op == "learn":
            return self._learn(now, args)
        if op == "state":
            return self._state(now, [_fmt(max(0.0, self.pause - now)), _fmt(self._used_rps(now))])
        raise ValueError(f"unknown pacer op {op!r}")

    def _state(self, now: float, extra: list[str]) -> Reply:
        return [_fmt(now), _fmt(self.rate), _fmt(self.ref), str(self.ver), str(self.ss), *extra]

    def _rescale(self, old: float, now: float) -> None:
        if old > 0 and self.rate > 0 and self.tat > now:
            self.tat = now + (self.tat - now) * old / self.rate

    def _burst(self) -> float:
        b = self._burst_arg if self._burst_arg >= 0 else 1 + self.rate / 100
        return max(b, 1.0)

    def _used_rps(self, now: float) -> float:
        return self.used * math.exp(-max(0.0, now - self.used_at) / self._use_window) / self._use_window

    def _take(self, now: float, n: int, partial: bool, probe_lease_s: float) -> Reply:
        verdict, workers = "go", "1"
        if self.c_open > 0:
            if now < self.c_open:
                return self._state(now, ["0", _fmt(self.c_open - now), "refuse", workers])
            if self.c_probe > now:
                return self._state(now, ["0", _fmt(self.c_probe - now), "wait", workers])
            verdict, n, partial = "probe", 1, True
        if now < self.pause:
            return self._state(now, ["0", _fmt(self.pause - now), "paused", workers])
        k, wait = n, 0.0
        if self.rate > 0:
            period, b = 1 / self.rate, self._burst()
            tat = max(self.tat, now)
            # the time owed first, with 1 µs of slack (epoch seconds: see the script)
            avail = math.floor((b * period - (tat - now) + 1e-6) / period)
            if partial:
                k = min(n, avail)
            elif avail < n:
                k = 0
            if k < 1:
                need = 1 if partial else n
                if need > b:
                    return self._state(now, ["0", "inf", "wait", workers])
                wait = max(tat + need * period - b * period - now, 1e-6)
                return self._state(now, ["0", _fmt(wait), "wait", workers])
            self.tat = tat + k * period
            wait = max(0.0, self.tat + period - b * period - now)
        decay = math.exp(-max(0.0, now - self.used_at) / self._use_window)
        self.used, self.used_at = self.used * decay + k, now
        if verdict == "probe":
            self.c_probe = now + probe_lease_s
        return self._state(now, [str(k), _fmt(wait), verdict, workers])

    def _pause(
        self, now: float, pause_s: float, cut_ver: float, dec: float, ss_dec: float, min_rps: float,
        start_rps: float,
    ) -> Reply:  # fmt: skip
        cut, old = 0, self.rate
        if cut_ver >= 0 and cut_ver == self.ver:
            cut, self.ver = 1, self.ver + 1
            self.ev, self.ev_at, self.ev_acc = self.ev + 1, now, self.acc
            if self.rate <= 0:
                self.rate, self.ss = max(start_rps, self._used_rps(now) * ss_dec), 1
            else:
                d = ss_dec if self.ss == 1 else dec
                self.ss, self.ref = 0, self.rate
                self.rate = max(min_rps, self.rate * d)
        self._rescale(old, now)
        self.pause = max(self.pause, now + pause_s)
        if self.rate > 0:
            self.tat = max(self.tat, self.pause + self._burst() / self.rate)
        return self._state(now, [str(cut), _fmt(self.pause - now)])

    def _grow(self, now: float, add: float, mul: float, max_rps: float, in_use: float) -> Reply:
        grown = 0
        if self.rate > 0 and self._used_rps(now) >= in_use * self.rate:
            rate = self.rate * mul + add
            if max_rps > 0:
                rate = min(rate, max_rps)
            grown, old = int(rate != self.rate), self.rate
            self.rate = rate
            self._rescale(old, now)
        return self._state(now, [str(grown)])

    def _learn(self, now: float, args: Sequence[str]) -> Reply:
        n, holder, lease_s = float(args[0]), args[1], float(args[2]) / 1000
        rate, in_use = float(args[3]), float(args[8])
        self.acc += n
        leader = 0
        if holder and (not self.holder or now >= self.lease_until or self.holder == holder):
            self.holder, self.lease_until, leader = holder, now + lease_s, 1
        if leader and rate >= 0:
            old, self.rate, self.ss = self.rate, rate, int(args[4])
            self.lim, self.ph, self.cuts = float(args[5]), int(args[6]), int(args[7])
            if self.lim > 0:
                self.ref = self.lim
            self._rescale(old, now)
        busy = int(self.rate > 0 and self._used_rps(now) >= in_use * self.rate)
        return self._state(
            now,
            [str(leader), _fmt(self.acc), str(self.ev), _fmt(now - self.ev_at), _fmt(self.ev_acc),
             _fmt(self.pause - now), str(busy), _fmt(self.lim), str(self.ph), str(self.cuts)],
        )  # fmt: skip

    def _record(
        self, now: float, answered: float, unavailable: float, threshold: float, open_s: float,
        open_max_s: float,
    ) -> Reply:  # fmt: skip
        opened = 0
        if answered > 0:
            self.c_fail, self.c_open, self.c_period, self.c_probe = 0, 0.0, 0.0, 0.0
        elif unavailable <= 0:
            self.c_probe = 0.0
        else:
            self.c_fail += int(unavailable)
            if self.c_open > 0 and now >= self.c_open:
                self.c_period, opened = min(open_max_s, max(open_s, 2 * self.c_period)), 1
            elif self.c_open == 0 and threshold > 0 and self.c_fail >= threshold:
                self.c_period, opened = open_s, 1
            if opened:
                self.c_open, self.c_probe = now + self.c_period, 0.0
        return self._state(now, [str(opened), _fmt(max(0.0, self.c_open - now))])
