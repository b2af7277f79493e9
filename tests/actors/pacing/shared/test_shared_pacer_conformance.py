"""Conformance suite of a pacer shared through Redis, run on our pacers and on libraries.

Each test is one property a shared pacer needs (issue 11, section 2). Candidates: our
``LocalPacer`` and ``RedisPacer``, and the libraries ``limits`` (sliding window
counter), ``throttled-py`` (GCRA) and ``pyrate-limiter`` (GCRA state bucket) when they
are installed. A library's known gaps are expected failures (strict: a gap that closes
fails the run, so the table in bench/README.md stays true). Every candidate runs on a
private ``redis-server`` of its own (see conftest.py).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .conftest import Candidate, RedisServer, expect

MakeCandidate = Callable[[float, int], Candidate]


def _drain(cand: Candidate, limit: int = 50) -> int:
    """Take until refused; how many were granted."""
    taken = 0
    for _ in range(limit):
        granted, _wait = cand.take()
        if not granted:
            return taken
        taken += granted
    raise AssertionError(f"{cand.name} never refused in {limit} takes")


def test_pacer_rate_change_applies_from_now(make_candidate: MakeCandidate, request: Any) -> None:
    cand = make_candidate(4, 1)
    expect(cand, "rate_change", request)
    _drain(cand)
    cand.set_rate(1000)
    granted, wait_s = cand.take()
    assert granted == 1 or wait_s <= 0.01, f"raised to 1000/s, still told to wait {wait_s:.3f} s"


def test_pacer_rate_cut_grants_no_fresh_burst(make_candidate: MakeCandidate, request: Any) -> None:
    cand = make_candidate(4, 5)
    expect(cand, "no_fresh_burst_on_cut", request)
    _drain(cand)
    cand.set_rate(3)
    granted, wait_s = cand.take()
    assert granted == 0, "a cut rate granted a fresh burst"
    assert wait_s > 0


def test_pacer_shared_pause_holds_every_worker(make_candidate: MakeCandidate, request: Any) -> None:
    first = make_candidate(100, 5)
    expect(first, "shared_pause", request)
    other = first.worker()
    try:
        first.pause(30.0)  # one worker's 429 with Retry-After: 30
        granted, wait_s = other.take()
    finally:
        other.close()
    assert granted == 0
    assert wait_s > 20


def test_pacer_takes_n_tokens_at_once_all_or_none(make_candidate: MakeCandidate, request: Any) -> None:
    cand = make_candidate(1, 5)
    expect(cand, "n_tokens", request)
    assert cand.take(3)[0] == 3
    assert cand.take(3)[0] == 0, "3 of the 2 tokens left were granted"
    assert cand.take(2)[0] == 2
    assert cand.take(1)[0] == 0
    assert make_candidate(1, 5).take(6)[0] == 0, "more than the burst was granted at once"


def test_pacer_one_round_trip_per_take(
    make_candidate: MakeCandidate, monkeypatch: pytest.MonkeyPatch, request: Any
) -> None:
    """Counted where redis-py sends (one send, then its replies, is one round trip; a
    pipeline is one send)."""
    import redis.connection

    cand = make_candidate(20, 2)
    expect(cand, "one_round_trip", request)
    cand.take()  # warm: connections, script loads
    sends = [0]
    real = redis.connection.AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        sends[0] += 1
        real(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    outcomes = [cand.take()[0] for _ in range(20)]
    monkeypatch.undo()
    assert 0 in outcomes and 1 in outcomes  # both grants and refusals were counted
    assert sends[0] == 20, f"{sends[0]} round trips for 20 takes"


def test_pacer_now_is_the_servers_clock(
    make_candidate: MakeCandidate, monkeypatch: pytest.MonkeyPatch, request: Any
) -> None:
    cand = make_candidate(1, 1)
    expect(cand, "redis_clock", request)
    other = cand.worker()
    try:
        assert cand.take()[0] == 1
        with _skewed_clock(monkeypatch, 120.0):  # this worker's clock is 2 minutes ahead
            granted, _wait = other.take()
    finally:
        other.close()
    assert granted == 0, "a worker with a fast clock took a token that is not there yet"


@contextlib.contextmanager
def _skewed_clock(monkeypatch: pytest.MonkeyPatch, ahead_s: float) -> Iterator[None]:
    real_time, real_ns = time.time, time.time_ns
    with monkeypatch.context() as patch:
        patch.setattr(time, "time", lambda: real_time() + ahead_s)
        patch.setattr(time, "time_ns", lambda: real_ns() + int(ahead_s * 1e9))
        clocks = sys.modules.get("pyrate_limiter.clocks")
        if clocks is not None:
            patch.setattr(clocks, "time_ns", lambda: real_ns() + int(ahead_s * 1e9))
        yield


def test_pacer_every_key_has_a_ttl(
    make_candidate: MakeCandidate, redis_server: RedisServer, request: Any
) -> None:
    cand = make_candidate(10, 2)
    expect(cand, "ttl", request)
    for _ in range(3):
        cand.take()
    cand.set_rate(5)
    with contextlib.suppress(NotImplementedError):
        cand.pause(2.0)
    cand.take(2)
    client = redis_server.client()
    keys = list(client.scan_iter("*"))
    assert keys, "nothing was written"
    assert {key: client.pttl(key) for key in keys if client.pttl(key) < 0} == {}


def test_pacer_workers_together_stay_within_rate_and_burst(
    make_candidate: MakeCandidate, request: Any
) -> None:
    rate, burst, workers = 100.0, 5, 6
    cand = make_candidate(rate, burst)
    expect(cand, "within_bound", request)
    pool = [cand.worker() for _ in range(workers)]
    grants = [0] * workers
    start = threading.Event()

    def run(i: int, deadline: float) -> None:
        start.wait()
        while time.monotonic() < deadline:
            granted, wait_s = pool[i].take()
            grants[i] += granted
            if not granted:
                time.sleep(min(wait_s, 0.005))

    began = time.monotonic()
    threads = [threading.Thread(target=run, args=(i, began + 0.6)) for i in range(workers)]
    for t in threads:
        t.start()
    start.set()
    for t in threads:
        t.join(30)
    elapsed = time.monotonic() - began
    for worker in pool:
        worker.close()
    assert sum(grants) <= rate * elapsed + burst, f"{sum(grants)} grants in {elapsed:.3f} s"
    assert sum(grants) >= burst  # the run did take tokens


def test_pacer_survives_a_script_cache_flush(
    make_candidate: MakeCandidate, redis_server: RedisServer, request: Any
) -> None:
    cand = make_candidate(100, 5)
    expect(cand, "noscript", request)
    assert cand.take()[0] == 1
    redis_server.client().script_flush()  # as a restart or a failover does
    assert cand.take()[0] == 1


def test_pacer_call_to_a_frozen_server_yields_and_returns(
    make_candidate: MakeCandidate, redis_server: RedisServer, request: Any
) -> None:
    """A server that stops answering costs a call its read timeout, not a hang, and
    other threads (greenlets under gevent) run meanwhile."""
    cand = make_candidate(100, 5)
    expect(cand, "cooperative_timeout", request)
    cand.take()
    go, ran = threading.Event(), threading.Event()
    helper = threading.Thread(target=lambda: go.wait(30) and ran.set())
    helper.start()
    redis_server.freeze()
    try:
        go.set()
        with contextlib.suppress(Exception):
            cand.take()
        ran_meanwhile = ran.is_set()
    finally:
        redis_server.thaw()
        helper.join(30)
    assert ran_meanwhile, "the call blocked every other thread (or the gevent hub) while waiting"


def test_pacer_keeps_pacing_when_the_server_is_gone(
    make_candidate: MakeCandidate, redis_server: RedisServer, request: Any
) -> None:
    cand = make_candidate(10, 2)
    expect(cand, "outage_fallback", request)
    cand.take()
    redis_server.kill()
    outcomes = [cand.take() for _ in range(5)]  # raises for a pacer without a fallback
    assert sum(granted for granted, _ in outcomes) < 5, "ran unpaced without its server"
