"""The pacer's rules: on LocalPacer with a fake clock, and across two RedisPacers.

The plain rules (GCRA spacing, n tokens, pause and once-per-event cut, AIMD growth in
use only, the circuit's single probe) are driven on :class:`LocalPacer` with a fake
clock; the cross-worker ones (one cut per congestion event, one half-open probe, every
key with a TTL) on several :class:`RedisPacer` instances of one private Redis.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from actors.pacing import (
    InvalidPacerURLError,
    LocalPacer,
    Pacer,
    PacerSettings,
    ProviderLimits,
    open_pacer,
)
from actors.tool import Pacing, Policy

from .conftest import RedisServer


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _local(limits: ProviderLimits, settings: PacerSettings | None = None) -> tuple[LocalPacer, FakeClock]:
    clock = FakeClock()
    return LocalPacer({"p": limits}, settings, clock=clock), clock


def test_local_pacer_spaces_grants_at_the_rate() -> None:
    pacer, clock = _local(ProviderLimits(rate_rps=10.0, burst=1))
    assert pacer.take("o", "p").granted == 1
    clock.now += 0.05
    refused = pacer.take("o", "p")
    assert (refused.granted, refused.verdict) == (0, "wait")
    assert refused.wait_s == pytest.approx(0.05)
    clock.now += 0.05
    assert pacer.take("o", "p").granted == 1


def test_local_pacer_takes_up_to_n_when_partial_and_never_more_than_the_burst() -> None:
    pacer, _ = _local(ProviderLimits(rate_rps=1.0, burst=5))
    assert pacer.take("o", "p", 10, partial=True).granted == 5
    whole, _ = _local(ProviderLimits(rate_rps=1.0, burst=5))
    never = whole.take("o", "p", 6)
    assert never.granted == 0 and math.isinf(never.wait_s)


def test_local_pacer_unpaced_provider_grants_everything_until_a_429() -> None:
    pacer, _ = _local(ProviderLimits())
    assert pacer.take("o", "p", 500).granted == 500
    paused = pacer.pause("o", "p", 1.0, cut_version=0)
    assert paused.cut and paused.slow_start
    assert paused.rate_rps == pytest.approx(max(10.0, 500 / 0.5 * 0.5))


def test_local_pacer_cuts_once_per_congestion_event() -> None:
    pacer, clock = _local(ProviderLimits(rate_rps=10.0, burst=1))
    version = pacer.take("o", "p").version
    first = pacer.pause("o", "p", 1.0, cut_version=version)
    second = pacer.pause("o", "p", 1.0, cut_version=version)  # another 429 of the same event
    assert (first.cut, second.cut) == (True, False)
    assert second.rate_rps == pytest.approx(8.0)
    assert pacer.take("o", "p").verdict == "paused"
    clock.now += 2.0
    grant = pacer.take("o", "p")
    assert grant.granted == 1 and grant.version == version + 1
    assert pacer.pause("o", "p", 0.5, cut_version=grant.version).rate_rps == pytest.approx(6.4)


def test_local_pacer_leaves_slow_start_at_half_the_rate() -> None:
    pacer, _ = _local(ProviderLimits(rate_rps=40.0, slow_start=True))
    state = pacer.pause("o", "p", 0.1, cut_version=0)
    assert state.rate_rps == pytest.approx(20.0) and not state.slow_start


def test_local_pacer_grows_only_a_rate_in_use_and_never_past_its_cap() -> None:
    pacer, clock = _local(ProviderLimits(rate_rps=10.0, burst=10, max_rps=10.5))
    assert not pacer.grow("o", "p", add_rps=1.0).grown  # nobody takes: no growth
    pacer.take("o", "p", 10)
    grown = pacer.grow("o", "p", add_rps=1.0)
    assert grown.grown and grown.rate_rps == pytest.approx(10.5)
    clock.now += 10.0  # use decays
    assert not pacer.grow("o", "p", mul=2.0).grown


def test_local_pacer_circuit_opens_once_then_lets_one_probe_through() -> None:
    settings = PacerSettings(circuit_failures=3, circuit_open_s=5.0, circuit_open_max_s=60.0)
    pacer, clock = _local(ProviderLimits(rate_rps=100.0, burst=10), settings)
    assert not pacer.record("o", "p", answered=0, unavailable=2).opened
    opened = pacer.record("o", "p", answered=0, unavailable=1)
    assert opened.opened and opened.open_s == pytest.approx(5.0)
    assert not pacer.record("o", "p", answered=0, unavailable=1).opened  # same outage
    assert pacer.take("o", "p").verdict == "refuse"
    clock.now += 5.0
    probe = pacer.take("o", "p", 3)
    assert (probe.verdict, probe.granted) == ("probe", 1)
    assert pacer.take("o", "p").verdict == "wait"  # one probe at a time
    again = pacer.record("o", "p", answered=0, unavailable=1)  # the probe failed
    assert again.opened and again.open_s == pytest.approx(10.0)
    clock.now += 10.0
    assert pacer.take("o", "p").verdict == "probe"
    clock.now += settings.probe_lease_s  # the prober died: its claim lapses
    assert pacer.take("o", "p").verdict == "probe"
    assert not pacer.record("o", "p", answered=1, unavailable=0).opened
    assert pacer.take("o", "p").verdict == "go"


def test_provider_limits_from_pacing_start_as_the_governor_does() -> None:
    stated = ProviderLimits.from_pacing(Pacing(rps=50.0))
    assert stated.rate_rps == pytest.approx(49.0) and stated.max_rps == pytest.approx(49.0)
    unknown = ProviderLimits.from_pacing(Pacing(start_rps=10.0))
    assert unknown.slow_start and unknown.rate_rps == 10.0 and unknown.max_rps is None
    assert ProviderLimits.from_pacing(Pacing()).rate_rps is None


def test_pacer_settings_from_policy_take_its_circuit() -> None:
    settings = PacerSettings.from_policy(Policy(circuit_failures=3, circuit_open_s=2.0), presence_s=5.0)
    assert (settings.circuit_failures, settings.circuit_open_s, settings.presence_s) == (3, 2.0, 5.0)


def test_open_pacer_parses_the_pacer_option() -> None:
    assert isinstance(open_pacer(None), LocalPacer)
    assert isinstance(open_pacer("local"), LocalPacer)
    pytest.importorskip("redis")
    pacer: Any = open_pacer(
        "redis://:secret@127.0.0.1:1/3?prefix=a:b&workers=8&timeout=0.2&connect_timeout=0.1"
    )
    try:
        assert pacer.backend == "redis" and pacer.prefix == "a:b" and pacer.expected_workers == 8
        assert "secret" not in pacer.url and "secret" not in str(pacer.snapshot())
        kwargs = pacer.client.connection_pool.connection_kwargs
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"], kwargs["db"]) == (0.2, 0.1, 3)
    finally:
        pacer.close()
    for bad in ("postgresql://x/y", "redis://h?workers=0", "redis://h?timeout=soon"):
        with pytest.raises(InvalidPacerURLError):
            open_pacer(bad)


# --- across workers, on a real Redis ------------------------------------------------------


@pytest.fixture
def make_workers(redis_server: RedisServer, prefix: str) -> Iterator[Any]:
    """``make_workers(open_s)``: eight RedisPacers (each its own connections) on one
    bucket, circuits opening at the first unavailable outcome for ``open_s``; the keys
    are deleted after."""
    made: list[Pacer] = []

    def make(open_s: float = 30.0) -> list[Pacer]:
        settings = PacerSettings(circuit_failures=1, circuit_open_s=open_s)
        limits = {"p": ProviderLimits(rate_rps=50.0, burst=20)}  # the rate never masks the probe rule
        pacers = [open_pacer(f"{redis_server.url}?prefix={prefix}", limits, settings) for _ in range(8)]
        made.extend(pacers)
        return pacers

    yield make
    for pacer in made:
        pacer.close()
    client = redis_server.client()
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


def _together(pacers: list[Pacer], call: Any) -> list[Any]:
    """Run ``call(pacer)`` on every pacer at once (threads; greenlets under gevent)."""
    out: list[Any] = [None] * len(pacers)
    barrier = threading.Barrier(len(pacers))

    def run(i: int) -> None:
        barrier.wait()
        out[i] = call(pacers[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(pacers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_redis_pacer_workers_cut_once_for_one_congestion_event(make_workers: Any) -> None:
    workers = make_workers()
    version = workers[0].take("o", "p").version
    replies = _together(workers, lambda w: w.pause("o", "p", 1.0, cut_version=version))
    assert sum(r.cut for r in replies) == 1
    assert workers[3].state("o", "p").rate_rps == pytest.approx(40.0)


def test_redis_pacer_workers_open_the_circuit_once(make_workers: Any) -> None:
    workers = make_workers(open_s=30.0)
    opened = _together(workers, lambda w: w.record("o", "p", answered=0, unavailable=1))
    assert sum(r.opened for r in opened) == 1  # one opening, whoever saw it
    assert {g.verdict for g in _together(workers, lambda w: w.take("o", "p"))} == {"refuse"}


def test_redis_pacer_workers_send_one_half_open_probe(make_workers: Any) -> None:
    workers = make_workers(open_s=0.0)  # half-open as soon as it opened
    assert workers[0].record("o", "p", answered=0, unavailable=1).opened
    grants = _together(workers, lambda w: w.take("o", "p"))
    assert sorted(g.verdict for g in grants) == ["probe"] + ["wait"] * 7


def test_redis_pacer_keys_all_expire_and_outlive_a_long_pause(
    make_workers: Any, redis_server: RedisServer, prefix: str
) -> None:
    pacer = make_workers()[0]
    pacer.take("o", "p")
    pacer.grow("o", "p", add_rps=1.0)
    pacer.record("o", "q", answered=0, unavailable=0)
    pacer.set_rate("o", "r", 5.0)
    pacer.pause("o", "p", 7200.0)
    pacer.learn("o", "s", 1, "me")
    client = redis_server.client()
    ttls = {key: client.pttl(key) for key in client.scan_iter(f"{prefix}:*")}
    assert len(ttls) == 6 and all(ttl > 0 for ttl in ttls.values())
    assert ttls[f"{prefix}:{{o/p}}:state"] > 7200 * 1000
    assert ttls[f"{prefix}:{{o/s}}:learner"] <= pacer.settings.learner_lease_s * 1000


def test_redis_pacer_workers_count_together_and_one_holds_the_learner_lease(make_workers: Any) -> None:
    workers = make_workers()
    for w in workers:
        w.settings = attrs.evolve(w.settings, learner_lease_s=0.2)
    replies = _together(workers, lambda w: w.learn("o", "p", 1, f"w{workers.index(w)}"))
    assert sum(r.leader for r in replies) == 1
    assert max(r.accepted for r in replies) == len(workers)  # every worker's count, summed
    leader = next(w for w, r in zip(workers, replies, strict=True) if r.leader)
    follower = next(w for w in workers if w is not leader)
    name = f"w{workers.index(follower)}"
    ignored = follower.learn("o", "p", 0, name, (5.0, False, 6.0, "plateau", 1))
    assert not ignored.leader and ignored.rate_rps == 50.0 and ignored.limit_rps is None
    published = leader.learn("o", "p", 0, f"w{workers.index(leader)}", (5.0, False, 6.0, "plateau", 1))
    assert published.leader and (published.rate_rps, published.limit_rps) == (5.0, 6.0)
    assert published.version == replies[0].version  # publishing is no congestion event
    time.sleep(0.5)  # the holder goes quiet: its lease lapses
    taken = follower.learn("o", "p", 0, name)
    assert taken.leader and (taken.limit_rps, taken.phase, taken.cuts) == (6.0, "plateau", 1)
    assert not leader.learn("o", "p", 0, f"w{workers.index(leader)}").leader


@pytest.mark.parametrize("burst", [1, 2, 3, 7])
@pytest.mark.parametrize("rps", [0.5, 1.0, 5.0, 50.0, 100.0, 3000.0])
def test_local_pacer_on_an_epoch_clock_grants_an_idle_bucket_its_whole_burst(rps: float, burst: int) -> None:
    """Redis's TIME is epoch seconds (a double's step there is 0.24 µs): the bucket's
    arithmetic must not lose a token to rounding (burst 1 would never grant)."""
    clock = FakeClock()
    clock.now = 1_800_000_000.123456
    pacer = LocalPacer({"p": ProviderLimits(rate_rps=rps, burst=burst)}, clock=clock)
    assert pacer.take("o", "p", burst, partial=True).granted == burst
    clock.now += 1.0 / rps
    assert pacer.take("o", "p").granted == 1  # one period later: one more


@pytest.mark.parametrize("burst", [1, 2])
@pytest.mark.waits
def test_redis_pacer_grants_an_idle_bucket_its_whole_burst(
    redis_server: RedisServer, prefix: str, burst: int
) -> None:
    rates = [0.98 * r for r in (1, 2, 5, 10, 20, 50, 100)]  # as Pacing(rps=r) states them
    limits = {f"p{i}": ProviderLimits(rate_rps=rate, burst=burst) for i, rate in enumerate(rates)}
    pacer = open_pacer(f"{redis_server.url}?prefix={prefix}", limits)
    try:
        granted = [pacer.take("o", name, burst, partial=True).granted for name in limits]
        assert granted == [burst] * len(rates)
        time.sleep(1.1)
        assert [pacer.take("o", name).granted for name in limits] == [1] * len(rates)
    finally:
        pacer.close()


def test_redis_pacer_keys_of_two_buckets_never_meet(redis_server: RedisServer, prefix: str) -> None:
    limits = {"c": ProviderLimits(rate_rps=1.0), "b/c": ProviderLimits(rate_rps=100.0)}
    pacer = open_pacer(f"{redis_server.url}?prefix={prefix}", limits)
    try:
        assert pacer.keys("a/b", "c") != pacer.keys("a", "b/c")  # type: ignore[attr-defined]
        assert pacer.keys("a{x}", "p")[0] == f"{prefix}:{{a%7Bx%7D/p}}:state"  # type: ignore[attr-defined]
        assert pacer.keys("o", "p")[0] == f"{prefix}:{{o/p}}:state"  # plain names: as before
        pacer.set_rate("a", "b/c", 100.0)
        assert pacer.state("a/b", "c").rate_rps != pytest.approx(100.0)  # the other bucket's rate
    finally:
        pacer.close()


@pytest.mark.parametrize("given", ["newcomer:", "newcomer", "newcomer::"])
def test_redis_pacer_prefix_with_a_trailing_colon_is_not_doubled(
    redis_server: RedisServer, prefix: str, given: str
) -> None:
    mine = f"{prefix}-{given}"  # unique per test; the keys are deleted after
    pacer = open_pacer(f"{redis_server.url}?prefix={mine}", {"p": ProviderLimits(rate_rps=10.0)})
    client = redis_server.client()
    try:
        assert pacer.take("o", "p").granted == 1
        written = sorted(client.scan_iter(f"{prefix}-newcomer*"))
        assert written, "the take wrote no key"
        expected = f"{prefix}-newcomer:{{o/p}}:"
        assert all(k.startswith(expected) for k in written), written
        assert not any("::" in k for k in written), written
    finally:
        pacer.close()
        for key in client.scan_iter(f"{prefix}-*"):
            client.delete(key)


@pytest.mark.parametrize("bad", ["redis://h?prefix=", "redis://h?prefix=:", "redis://h?prefix=%3A%3A"])
def test_open_pacer_refuses_an_empty_prefix(bad: str) -> None:
    pytest.importorskip("redis")
    with pytest.raises(InvalidPacerURLError, match="prefix must not be empty"):
        open_pacer(bad)
