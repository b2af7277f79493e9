"""Shared pacer benchmark: grants/s and round-trip latency, LocalPacer vs RedisPacer vs throttled-py.

Run from the repository root::

    python bench/shared_pacer_bench.py [--redis redis://127.0.0.1:6379/0] [--takes 5000] [--threads 4]
    python -m gevent.monkey bench/shared_pacer_bench.py      # the same under gevent

For each pacer, on one (org, provider) bucket whose rate is far above what a machine can
take (so every take is granted and the figure is the pacer's own cost): ``--takes``
sequential takes from one caller (grants/s, latency p50 and p99 in microseconds), then
the same number split over ``--threads`` concurrent callers, each with its own
connection (grants/s); then round trips per take (counted where redis-py sends) when
granted and when refused (a refusal must also say how long to wait). Pacers: our
``LocalPacer`` (in-process), our ``RedisPacer`` (one EVALSHA per take), the libraries
of the conformance suite (``throttled-py`` GCRA, ``limits`` sliding window counter,
``pyrate-limiter`` GCRA state bucket; each skipped when not installed), and a raw
``PING`` as the round-trip floor.
One run, the same Redis, ratios to RedisPacer. Keys go under a unique prefix, deleted
at the end. See bench/README.md.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import click

try:
    import actors  # noqa: F401 - is the package importable?
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from actors.pacing import LocalPacer, ProviderLimits, open_pacer

RATE = 1e9
Take = Callable[[], Any]
Factory = Callable[[str, str, float, int], Callable[[], Take]]


def _local(url: str, prefix: str, rate: float, burst: int) -> Callable[[], Take]:
    pacer = LocalPacer({"p": ProviderLimits(rate_rps=rate, burst=burst)})
    return lambda: lambda: pacer.take("o", "p")


def _redis(url: str, prefix: str, rate: float, burst: int) -> Callable[[], Take]:
    def make() -> Take:
        pacer = open_pacer(f"{url}?prefix={prefix}:ours", {"p": ProviderLimits(rate_rps=rate, burst=burst)})
        return lambda: pacer.take("o", "p")

    return make


def _throttled(url: str, prefix: str, rate: float, burst: int) -> Callable[[], Take]:
    from datetime import timedelta

    from throttled import RateLimiterType, Throttled, rate_limiter, store

    def make() -> Take:
        quota = rate_limiter.per_duration(timedelta(seconds=1), limit=int(rate), burst=burst)
        limiter = Throttled(
            using=RateLimiterType.GCRA.value, quota=quota, store=store.RedisStore(server=url),
            key_prefix=f"{prefix}:throttled",
        )  # fmt: skip
        return lambda: limiter.limit("o/p").state.retry_after  # the wait comes with the answer

    return make


def _limits(url: str, prefix: str, rate: float, burst: int) -> Callable[[], Take]:
    from limits import RateLimitItemPerSecond, strategies
    from limits.storage import RedisStorage

    def make() -> Take:
        limiter = strategies.SlidingWindowCounterRateLimiter(RedisStorage(url, key_prefix=f"{prefix}:limits"))
        item = RateLimitItemPerSecond(int(min(rate, 1e8)), 1)

        def take() -> Any:  # refused: the wait is a second call
            return limiter.hit(item, "o/p") or limiter.get_window_stats(item, "o/p")

        return take

    return make


def _pyrate(url: str, prefix: str, rate: float, burst: int) -> Callable[[], Take]:
    import redis
    from pyrate_limiter import GCRA, Rate, RateItem, RedisStateStore, StateBucket, WallClock

    def make() -> Take:
        store = RedisStateStore(redis.Redis.from_url(url), f"{prefix}:pyrate")
        bucket = StateBucket([Rate(int(min(rate, 1e8)), 1000, burst=burst)], GCRA(), store)
        clock = WallClock()

        def take() -> Any:
            item = RateItem("o/p", clock.now(), 1)
            return bucket.put(item) or bucket.waiting(item)

        return take

    return make


def _ping(url: str, prefix: str, rate: float, burst: int) -> Callable[[], Take]:
    import redis

    def make() -> Take:
        return redis.Redis.from_url(url).ping

    return make


PACERS: list[tuple[str, Factory]] = [
    ("LocalPacer", _local),
    ("RedisPacer", _redis),
    ("throttled-py GCRA", _throttled),
    ("limits sliding win.", _limits),
    ("pyrate-limiter GCRA", _pyrate),
    ("raw PING (floor)", _ping),
]


def _round_trips(take: Take, n: int = 50) -> float:
    """redis-py sends per call (a send and its replies is one round trip)."""
    try:
        import redis.connection
    except ImportError:
        return 0.0
    take()
    cls = redis.connection.AbstractConnection
    real, sends = cls.send_packed_command, [0]

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        sends[0] += 1
        real(self, command, check_health)

    cls.send_packed_command = counted  # type: ignore[method-assign]
    try:
        for _ in range(n):
            take()
    finally:
        cls.send_packed_command = real  # type: ignore[method-assign]
    return sends[0] / n


def _sequential(take: Take, n: int) -> tuple[float, float, float]:
    take()  # warm: connect, load scripts
    lat = []
    began = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        take()
        lat.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - began
    qs = statistics.quantiles(lat, n=100)
    return n / elapsed, qs[49] * 1e6, qs[98] * 1e6


def _concurrent(make: Callable[[], Take], n: int, threads: int) -> float:
    takes = [make() for _ in range(threads)]
    for take in takes:
        take()
    start = threading.Event()

    def run(take: Take) -> None:
        start.wait()
        for _ in range(n // threads):
            take()

    pool = [threading.Thread(target=run, args=(t,)) for t in takes]
    for t in pool:
        t.start()
    began = time.perf_counter()
    start.set()
    for t in pool:
        t.join()
    return (n // threads * threads) / (time.perf_counter() - began)


@click.command()
@click.option("--redis", "url", default="redis://127.0.0.1:6379/0", show_default=True)
@click.option("--takes", default=5000, show_default=True)
@click.option("--threads", default=4, show_default=True)
def main(url: str, takes: int, threads: int) -> None:
    """Print grants/s and latency of each pacer, and ratios to RedisPacer."""
    monkey = sys.modules.get("gevent.monkey")
    runtime = "gevent" if monkey and monkey.is_module_patched("threading") else "threads"
    print(f"python {platform.python_version()}, runtime {runtime}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f}, redis {url}, {takes} takes, {threads} callers")  # fmt: skip
    prefix = f"bench:{uuid.uuid4().hex[:8]}"
    rows: list[tuple[str, float, float, float, float, float, float]] = []
    for name, factory in PACERS:
        try:
            make = factory(url, f"{prefix}:{len(rows)}", RATE, 1_000_000)
            refusing = factory(url, f"{prefix}:{len(rows)}r", 1.0, 1)
        except ImportError:
            print(f"{name}: not installed, skipped")
            continue
        seq, p50, p99 = _sequential(make(), takes)
        granted_rt, refused_rt = _round_trips(make()), _round_trips(refusing())
        rows.append((name, seq, p50, p99, _concurrent(make, takes, threads), granted_rt, refused_rt))
    ours = next(r for r in rows if r[0] == "RedisPacer")
    print(f"\n{'pacer':<20} {'grants/s':>9} {'p50 µs':>7} {'p99 µs':>7} {f'{threads}x grants/s':>12}"
          f" {'÷ Redis':>8} {f'{threads}x ÷ Redis':>11} {'RT/grant':>8} {'RT/refusal':>10}")  # fmt: skip
    for name, seq, p50, p99, conc, g_rt, r_rt in rows:
        print(f"{name:<20} {seq:>9.0f} {p50:>7.0f} {p99:>7.0f} {conc:>12.0f} {seq / ours[1]:>8.2f}"
              f" {conc / ours[4]:>11.2f} {g_rt:>8.2f} {r_rt:>10.2f}")  # fmt: skip
    import redis

    client = redis.Redis.from_url(url)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


if __name__ == "__main__":
    main()
