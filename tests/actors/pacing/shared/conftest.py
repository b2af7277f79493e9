"""Fixtures of the shared pacer tests: a private Redis server per test that needs one.

* ``redis_server``: a ``redis-server`` subprocess on a free port of 127.0.0.1 (no
  persistence), which a test may kill, restart, pause (SIGSTOP) and resume, or flush
  scripts on, without touching the machine's shared Redis. Skipped when ``redis-server``
  is not installed (``apt-get install redis-server``); a failure when ``CI`` is set.
* ``prefix``: a unique key prefix.

Works unchanged on threads and under gevent (subprocess and sockets are patched).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

START_WAIT_S = 10.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A private ``redis-server`` on 127.0.0.1:``port`` (started by :meth:`start`)."""

    def __init__(self, workdir: Path) -> None:
        self.port = _free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it and wait (on its log, not a sleep) until it accepts connections."""
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir), "--loglevel", "notice"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        ready = threading.Event()
        proc = self.proc

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if "Ready to accept connections" in line:
                    ready.set()
            ready.set()  # exited: let start() report it

        threading.Thread(target=read, daemon=True).start()
        assert ready.wait(START_WAIT_S), "redis-server did not start"
        assert proc.poll() is None, f"redis-server exited with {proc.returncode}"

    def kill(self) -> None:
        """SIGKILL it (as a crash or a lost host would)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(START_WAIT_S)

    def freeze(self) -> None:
        """SIGSTOP: connections stay open but nothing answers."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=5, decode_responses=True)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A started private Redis; killed at teardown (thawed first if frozen)."""
    if shutil.which("redis-server") is None:
        message = (
            "redis-server is not installed: `apt-get install redis-server` to run the shared pacer tests"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    pytest.importorskip("redis", reason="pip install 'tooldispatch[redis]' to run the shared pacer tests")
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.thaw()
        server.kill()


@pytest.fixture
def prefix() -> str:
    """A unique key prefix."""
    return f"tdtest:{uuid.uuid4().hex[:10]}"


# --- candidates: our pacers and the libraries tried against the conformance suite ----------


class Candidate:
    """One rate limiter under the conformance suite: one (org, provider) bucket.

    ``gaps``: property -> why this candidate fails it (the tests expect those to fail,
    strictly); ``local``: an in-process pacer (properties about Redis do not apply).
    """

    name = "abstract"
    gaps: ClassVar[dict[str, str]] = {}
    local = False

    def __init__(self, url: str, prefix: str, rate: float, burst: int) -> None:
        self.url, self.prefix, self.rate, self.burst = url, prefix, rate, burst

    def take(self, n: int = 1) -> tuple[int, float]:
        """(tokens granted, seconds until a take could succeed)."""
        raise NotImplementedError

    def set_rate(self, rate: float) -> None:
        raise NotImplementedError

    def pause(self, pause_s: float) -> None:
        raise NotImplementedError(f"{self.name} has no shared pause")

    def worker(self) -> Candidate:
        """Another worker on the same bucket (its own connections)."""
        return type(self)(self.url, self.prefix, self.rate, self.burst)

    def close(self) -> None:
        pass


class OurPacer(Candidate):
    def __init__(self, url: str, prefix: str, rate: float, burst: int, pacer: Any = None) -> None:
        super().__init__(url, prefix, rate, burst)
        from actors.pacing import ProviderLimits, open_pacer

        limits = {"prov": ProviderLimits(rate_rps=rate, burst=burst)}
        self.pacer = pacer or open_pacer(self.pacer_url(), limits)

    def pacer_url(self) -> str:
        return f"{self.url}?prefix={self.prefix}&workers=1"

    def take(self, n: int = 1) -> tuple[int, float]:
        grant = self.pacer.take("org", "prov", n)
        return grant.granted, grant.wait_s

    def set_rate(self, rate: float) -> None:
        self.pacer.set_rate("org", "prov", rate)

    def pause(self, pause_s: float) -> None:
        self.pacer.pause("org", "prov", pause_s)

    def close(self) -> None:
        self.pacer.close()


class RedisCandidate(OurPacer):
    name = "RedisPacer"


class LocalCandidate(OurPacer):
    name = "LocalPacer"
    local = True

    def pacer_url(self) -> str:
        return "local"

    def worker(self) -> Candidate:
        return LocalCandidate(self.url, self.prefix, self.rate, self.burst, pacer=self.pacer)


class LimitsCandidate(Candidate):
    """``limits``: the sliding window counter on Redis (its moving window times entries
    with the worker's ``time.time()``)."""

    name = "limits"
    gaps: ClassVar[dict[str, str]] = {
        "no_fresh_burst_on_cut": "a rate is part of the key: a new rate starts an empty window",
        "within_bound": "no burst apart from the window: a whole window's worth (rate x 1 s) goes at once",
        "one_round_trip": "hit() returns a bool: when refused, the wait needs get_window_stats()",
        "shared_pause": "no pause",
        "outage_fallback": "raises redis errors; no fallback",
    }

    def __init__(self, url: str, prefix: str, rate: float, burst: int) -> None:
        super().__init__(url, prefix, rate, burst)
        from limits import strategies
        from limits.storage import RedisStorage

        self.storage = RedisStorage(url, key_prefix=prefix, socket_timeout=0.5, socket_connect_timeout=0.25)
        self.limiter = strategies.SlidingWindowCounterRateLimiter(self.storage)
        self.set_rate(rate)

    def set_rate(self, rate: float) -> None:
        from limits import RateLimitItemPerSecond

        # a window of burst / rate seconds holds the burst; windows are whole seconds
        seconds = max(1, round(self.burst / rate))
        self.item = RateLimitItemPerSecond(max(1, round(rate * seconds)), seconds)

    def take(self, n: int = 1) -> tuple[int, float]:
        import time

        if self.limiter.hit(self.item, "org/prov", cost=n):
            return n, 0.0
        stats = self.limiter.get_window_stats(self.item, "org/prov")
        return 0, max(0.0, stats.reset_time - time.time())


class ThrottledCandidate(Candidate):
    """``throttled-py``: its GCRA on Redis."""

    name = "throttled-py"
    gaps: ClassVar[dict[str, str]] = {
        "rate_change": "the theoretical arrival time is kept in time, not tokens: a raised rate "
        "waits out the backlog of the old one",
        "no_fresh_burst_on_cut": "(same cause) a cut rate owes fewer tokens: part of the burst is free again",
        "shared_pause": "no pause",
        "outage_fallback": "raises redis errors; no fallback",
    }

    def __init__(self, url: str, prefix: str, rate: float, burst: int) -> None:
        super().__init__(url, prefix, rate, burst)
        from throttled import store

        options = {"SOCKET_TIMEOUT": 0.5, "SOCKET_CONNECT_TIMEOUT": 0.25}
        self.store = store.RedisStore(server=url, options=options)
        self.set_rate(rate)

    def set_rate(self, rate: float) -> None:
        from datetime import timedelta

        from throttled import RateLimiterType, Throttled, rate_limiter

        quota = rate_limiter.per_duration(timedelta(seconds=1000), limit=round(rate * 1000), burst=self.burst)
        self.throttled = Throttled(
            using=RateLimiterType.GCRA.value, quota=quota, store=self.store, key_prefix=self.prefix
        )

    def take(self, n: int = 1) -> tuple[int, float]:
        result = self.throttled.limit("org/prov", cost=n)
        return (0, result.state.retry_after) if result.limited else (n, 0.0)


class PyrateCandidate(Candidate):
    """``pyrate-limiter``: GCRA in a :class:`StateBucket` on a ``RedisStateStore``."""

    name = "pyrate-limiter"
    gaps: ClassVar[dict[str, str]] = {
        "redis_clock": "the arrival time comes from the worker's clock (WallClock)",
        "rate_change": "the theoretical arrival time is kept in time, not tokens",
        "no_fresh_burst_on_cut": "(same cause) a cut rate owes fewer tokens: part of the burst is free again",
        "shared_pause": "no pause",
        "outage_fallback": "raises redis errors; no fallback",
    }

    def __init__(self, url: str, prefix: str, rate: float, burst: int) -> None:
        super().__init__(url, prefix, rate, burst)
        import redis
        from pyrate_limiter import RedisStateStore

        self.client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.25)
        self.store = RedisStateStore(self.client, f"{prefix}:org/prov")
        self.set_rate(rate)

    def set_rate(self, rate: float) -> None:
        from pyrate_limiter import GCRA, Rate, StateBucket

        self.bucket = StateBucket([Rate(round(rate * 1000), 1_000_000, burst=self.burst)], GCRA(), self.store)

    def take(self, n: int = 1) -> tuple[int, float]:
        from pyrate_limiter import RateItem, WallClock

        item = RateItem("org/prov", WallClock().now(), n)
        if self.bucket.put(item):
            return n, 0.0
        wait_ms = self.bucket.waiting(item)
        return 0, (float("inf") if wait_ms < 0 else wait_ms / 1000)

    def close(self) -> None:
        self.client.close()


CANDIDATES: dict[str, tuple[type[Candidate], str | None]] = {
    "local": (LocalCandidate, None),
    "redis": (RedisCandidate, None),
    "limits": (LimitsCandidate, "limits"),
    "throttled": (ThrottledCandidate, "throttled"),
    "pyrate": (PyrateCandidate, "pyrate_limiter"),
}
LIBRARIES_HINT = "pip install limits throttled-py pyrate-limiter to compare the libraries"


@pytest.fixture(params=list(CANDIDATES))
def make_candidate(request: pytest.FixtureRequest, redis_server: RedisServer, prefix: str) -> Iterator[Any]:
    """``make_candidate(rate, burst)``: a fresh candidate on a fresh bucket; closed at teardown."""
    cls, module = CANDIDATES[request.param]
    if module is not None:
        pytest.importorskip(module, reason=LIBRARIES_HINT)
    made: list[Candidate] = []

    def make(rate: float, burst: int) -> Candidate:
        cand = cls(redis_server.url, f"{prefix}:{len(made)}", rate, burst)
        made.append(cand)
        return cand

    yield make
    for cand in made:
        cand.close()


def expect(cand: Candidate, prop: str, request: pytest.FixtureRequest) -> None:
    """Skip a Redis property on a local pacer; mark a candidate's known gap an expected failure."""
    if cand.local and prop in ("one_round_trip", "redis_clock", "ttl", "noscript", "cooperative_timeout",
                               "outage_fallback"):  # fmt: skip
        pytest.skip(f"{prop}: not a property of an in-process pacer")
    if prop in cand.gaps:
        request.applymarker(pytest.mark.xfail(reason=f"{cand.name}: {cand.gaps[prop]}", strict=True))
