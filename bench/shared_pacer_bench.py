"""Shared pacer benchmark: grants/s and round-trip latency, LocalPacer vs RedisPacer vs throttled-py.

Run from the repository root::

    python bench/shared_pacer_bench.py [--redis redis://127.0.0.1:6379/0] [--takes 5000] [--threads 4]
    python -m gevent.monkey bench/shared_pacer_bench.py      # the same under gevent

For each pacer, on one (org, provider) bucket whose rate is far above what a machine can
take (so every take is granted and the figure is the pacer's own cost): ``--takes``
sequential takes from one caller (grants/s, latency p50 and p99 in microseconds), then
the same number split over ``--threads`` concurrent callers, each with its own
connection (grants/s). Pacers: our ``LocalPacer`` (in-process), our ``RedisPacer`` (one
EVALSHA per take), and the best library of the conformance suite, ``throttled-py``'s
GCRA on Redis (skipped when not installed), with a raw ``PING`` as the round-trip floor.
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

from actors.shared_pacer import LocalPacer, ProviderLimits, open_pacer

RATE = 1e9
Take = Callable[[], Any]


def _local(url: str, prefix: str) -> Callable[[], Take]:
    pacer = LocalPacer({"p": ProviderLimits(rate_rps=RATE, burst=1e6)})
    return lambda: lambda: pacer.take("o", "p")


def _redis(url: str, prefix: str) -> Callable[[], Take]:
    def make() -> Take:
        pacer = open_pacer(f"{url}?prefix={prefix}:ours", {"p": ProviderLimits(rate_rps=RATE, burst=1e6)})
        return lambda: pacer.take("o", "p")

    return make


def _throttled(url: str, prefix: str) -> Callable[[], Take]:
    from datetime import timedelta

    from throttled import RateLimiterType, Throttled, rate_limiter, store

    def make() -> Take:
        quota = rate_limiter.per_duration(timedelta(seconds=1), limit=int(RATE), burst=1_000_000)
        limiter = Throttled(
            using=RateLimiterType.GCRA.value, quota=quota, store=store.RedisStore(server=url),
            key_prefix=f"{prefix}:throttled",
        )  # fmt: skip
        return lambda: limiter.limit("o/p")

    return make


def _ping(url: str, prefix: str) -> Callable[[], Take]:
    import redis

    def make() -> Take:
        client = redis.Redis.from_url(url)
        return client.ping

    return make


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
    rows: list[tuple[str, float, float, float, float]] = []
    for name, factory in (("LocalPacer", _local), ("RedisPacer", _redis), ("throttled-py GCRA", _throttled),
                          ("raw PING (floor)", _ping)):  # fmt: skip
        try:
            make = factory(url, prefix)
        except ImportError:
            print(f"{name}: not installed, skipped")
            continue
        seq, p50, p99 = _sequential(make(), takes)
        rows.append((name, seq, p50, p99, _concurrent(make, takes, threads)))
    ours = next(r for r in rows if r[0] == "RedisPacer")
    print(f"\n{'pacer':<20} {'grants/s':>10} {'p50 µs':>8} {'p99 µs':>8} {f'{threads}x grants/s':>13}"
          f" {'÷ Redis':>8} {f'{threads}x ÷ Redis':>12}")  # fmt: skip
    for name, seq, p50, p99, conc in rows:
        print(f"{name:<20} {seq:>10.0f} {p50:>8.0f} {p99:>8.0f} {conc:>13.0f} {seq / ours[1]:>8.2f}"
              f" {conc / ours[4]:>12.2f}")  # fmt: skip
    import redis

    client = redis.Redis.from_url(url)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


if __name__ == "__main__":
    main()
