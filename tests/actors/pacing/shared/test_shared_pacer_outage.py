"""Redis going away mid-run: a local share of the rate, said out loud, then rejoining.

Each test runs its own ``redis-server`` (conftest.py), kills or freezes it mid-run and
restarts it on the same port. The pacer's own clock is a fake one, so the local
fallback's pacing and the retry schedule are checked without sleeping.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from actors import DispatchSystem, Pacing, Policy, RunInfo, Tool
from actors.pacing import Pacer, ProviderLimits, open_pacer
from stores import SqliteReceiptStore

from .conftest import RedisServer


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def _pacer(server: RedisServer, prefix: str, clock: FakeClock, workers: int = 4) -> Any:
    from actors.pacing.redis_pacer import RedisPacer

    limits = {"p": ProviderLimits(rate_rps=40.0, burst=4)}
    return RedisPacer(server.url, limits, prefix=prefix, expected_workers=workers, clock=clock, retry_s=1.0)


def test_redis_pacer_paces_a_local_share_while_redis_is_down(
    redis_server: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    pacer = _pacer(redis_server, prefix, clock)
    assert not pacer.take("o", "p").degraded
    pacer.set_rate("o", "p", 20.0)  # the shared rate this worker last saw
    redis_server.kill()
    with caplog.at_level(logging.WARNING, logger="tooldispatch"):
        first = pacer.take("o", "p", 5, partial=True)
    assert first.degraded and pacer.snapshot()["degraded"]
    assert first.rate_rps == pytest.approx(20.0 / 4)  # a quarter of the last shared rate
    if first.granted == 0:  # its share starts at its own point of the workers' grid
        assert first.verdict == "wait" and first.wait_s <= 1 / 5.0
        clock.now += first.wait_s
        first = pacer.take("o", "p", 5, partial=True)
    assert first.granted == 1  # the burst shrinks with the share: 4 / 4
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "pacing locally at 1/4" in caplog.text
    again = pacer.take("o", "p")
    assert (again.granted, again.verdict) == (0, "wait")  # paced, never unpaced
    assert again.wait_s == pytest.approx(1 / 5.0)
    clock.now += 0.2
    assert pacer.take("o", "p").granted == 1
    pacer.close()


def test_redis_pacer_never_waits_on_a_frozen_redis_longer_than_its_timeout(
    redis_server: RedisServer, prefix: str
) -> None:
    clock = FakeClock()
    pacer = _pacer(redis_server, prefix, clock)
    pacer.take("o", "p")
    redis_server.freeze()
    try:
        grant = pacer.take("o", "p")  # read timeout (0.5 s), then the local share
        assert grant.degraded
        assert pacer.take("o", "p").degraded  # no new attempt before retry_s: no new wait
    finally:
        redis_server.thaw()
    pacer.close()


def test_redis_pacer_rejoins_when_redis_returns_and_hands_over_its_pause(
    redis_server: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    pacer = _pacer(redis_server, prefix, clock)
    pacer.take("o", "p")
    redis_server.kill()
    assert pacer.pause("o", "p", 60.0).degraded  # a 429 while Redis is away
    redis_server.start()  # same port, empty (a restart: no state, no scripts)
    assert pacer.take("o", "p").degraded  # before retry_s: still local
    clock.now += 1.0
    with caplog.at_level(logging.INFO, logger="tooldispatch"):
        back = pacer.take("o", "p")
    assert not back.degraded and not pacer.snapshot()["degraded"]
    assert back.verdict == "paused" and back.wait_s > 50  # the local pause went to Redis
    assert "answers again" in caplog.text
    snap = pacer.snapshot()
    assert (snap["outages"], snap["script_loads"]) == (1, 2)  # NOSCRIPT after the restart: reloaded
    other: Pacer = open_pacer(f"{redis_server.url}?prefix={prefix}", {"p": ProviderLimits(rate_rps=40.0)})
    assert other.take("o", "p").verdict == "paused"  # every worker sees it
    other.close()
    pacer.close()


def test_redis_pacer_unpaced_provider_is_paced_while_redis_is_down(
    redis_server: RedisServer, prefix: str
) -> None:
    from actors.pacing.bucket import SLOW_START_RPS
    from actors.pacing.redis_pacer import RedisPacer

    clock = FakeClock()
    pacer = RedisPacer(redis_server.url, {}, prefix=prefix, expected_workers=2, clock=clock)
    assert pacer.take("o", "free", 100).granted == 100  # unpaced while shared
    redis_server.kill()
    local = pacer.take("o", "free", 100, partial=True)
    assert local.degraded and local.rate_rps == pytest.approx(SLOW_START_RPS / 2)  # one of 2 workers' share
    if local.granted == 0:  # its share starts at its own point of the workers' grid
        assert local.verdict == "wait" and local.wait_s <= 2 / SLOW_START_RPS
        clock.now += local.wait_s
        local = pacer.take("o", "free", 100, partial=True)
    assert local.granted == 1
    pacer.close()


def test_redis_pacer_treats_a_read_only_replica_as_an_outage(redis_server: RedisServer, prefix: str) -> None:
    """After a failover the pacer's address may name a replica: READONLY to every write."""
    clock = FakeClock()
    pacer = _pacer(redis_server, prefix, clock)
    pacer.take("o", "p")
    admin = redis_server.client()
    admin.replicaof("127.0.0.1", "1")  # a replica of a master that is not there
    try:
        assert pacer.take("o", "p").degraded
    finally:
        admin.replicaof("NO", "ONE")
    clock.now += 1.0
    assert not pacer.take("o", "p").degraded
    pacer.close()


def test_an_unknown_limit_is_learnt_again_after_redis_comes_back(
    redis_server: RedisServer, prefix: str
) -> None:
    from actors import Pacing, Policy
    from actors.governor.shared import shared_governor
    from actors.pacing.redis_pacer import RedisPacer

    clock = FakeClock()
    pacer = RedisPacer(redis_server.url, prefix=prefix, expected_workers=4, clock=clock, retry_s=1.0)
    gov = shared_governor(Policy(), {"p": Pacing(start_rps=40.0)}, pacer, rng=lambda: 0.0)
    key = ("o", "p")
    assert gov.acquire("o", "p", 1, object(), clock.now).grants
    gov.release("o", "p", 1, 1, clock.now)
    assert gov.pacing.roles[key].learner is not None  # alone: it holds the learner lease
    shared_rate = gov.pacing.seen[key][0]
    assert shared_rate is not None and shared_rate >= 40.0  # slow start, from its first answer
    redis_server.kill()
    gov.release("o", "p", 0, 1, clock.now)  # an answer while Redis is away
    assert pacer.snapshot()["degraded"] and gov.pacing.roles[key].learner is None  # its counts are its own
    gov.acquire("o", "p", 1, object(), clock.now)
    assert gov.pacing.seen[key][0] == pytest.approx(shared_rate / 4)  # a quarter of the shared rate, paced
    redis_server.start()  # empty: the shared state is gone
    clock.now += 1.0
    gov.release("o", "p", 0, 1, clock.now)
    assert not pacer.snapshot()["degraded"]
    learner = gov.pacing.roles[key].learner
    assert learner is not None and learner.phase == "slow_start"  # learnt anew, shared again
    pacer.close()


CALL_WAIT_S = 15.0


@pytest.mark.waits
def test_redis_pacer_error_that_is_no_outage_still_serves_a_waiting_call(
    redis_server: Any, prefix: str, tmp_path: Path
) -> None:
    # 'a' holds the process's only slot; 'b' (same provider) waits in the governor. Redis
    # hits maxmemory while 'a' runs: every pacer call raises OutOfMemoryError, which is no
    # outage by name: it was not treated as one (no fallback to local pacing), the
    # governor's release and wakes raised before granting 'b', and 'b' waited forever
    from actors.pacing.redis_pacer import RedisPacer

    admin = redis_server.client()
    go, running = threading.Event(), threading.Event()

    def a(i: Any, c: Any) -> Any:
        running.set()
        assert go.wait(CALL_WAIT_S)
        admin.config_set("maxmemory", "1")  # used memory is over it: every write refused
        return i

    pacing = Pacing(rps=1000.0)
    tools = [
        Tool(tool_id="a", fn=a, provider="p", pacing=pacing),
        Tool(tool_id="b", fn=lambda i, c: i, provider="p", pacing=pacing),
    ]
    system = DispatchSystem.start(
        tools=tools,
        store=SqliteReceiptStore(str(tmp_path / "receipts.db")),
        run=RunInfo(run_id="r1", org_id="acme", scope="pacer-errors"),
        policy=Policy(max_concurrency=1, batch_grace_s=0.05, salvage_path=str(tmp_path / "s.jsonl")),
        pacer=RedisPacer(redis_server.url, prefix=prefix),
    )
    try:
        first = system.proxy().execute("a", {"n": 0})
        assert running.wait(CALL_WAIT_S)
        second = system.proxy().execute("b", {"n": 1})
        time.sleep(0.3)  # order only: 'b' asks the governor while 'a' holds the slot
        go.set()
        assert first.get(timeout=CALL_WAIT_S).value == {"n": 0}
        time.sleep(1.0)  # Redis refuses writes a while (the wakes armed before run out)
        admin.config_set("maxmemory", "0")  # Redis takes writes again
        assert second.get(timeout=CALL_WAIT_S).value == {"n": 1}
    finally:
        admin.config_set("maxmemory", "0")
        system.stop()


@pytest.mark.parametrize("verb", ["grow", "set", "learn"])
def test_redis_pacer_alone_never_paces_past_its_share(
    redis_server: RedisServer, prefix: str, verb: str
) -> None:
    """Growth (and a rate set or published) while Redis is away is scaled to this worker's
    share: four workers pacing alone stay within the provider's rate together."""
    from actors.pacing.redis_pacer import RedisPacer

    clock = FakeClock()
    limits = {"p": ProviderLimits(rate_rps=8.0, burst=4, max_rps=8.0)}
    pacer = RedisPacer(redis_server.url, limits, prefix=prefix, expected_workers=4, clock=clock, retry_s=60.0)
    pacer.take("o", "p")
    redis_server.kill()
    for _ in range(200):
        clock.now += 0.5
        pacer.take("o", "p")
        if verb == "grow":
            pacer.grow("o", "p", add_rps=1.0)
        elif verb == "set":
            pacer.set_rate("o", "p", 8.0)
        else:
            pacer.learn("o", "p", 10, "me", publish=(8.0, False, 8.0, "probe", 0))
    state = pacer.state("o", "p")
    assert state.degraded and state.rate_rps is not None and state.rate_rps <= 8.0 / 4 + 1e-9
    pacer.close()


def test_redis_pacer_keeps_a_shared_pause_and_an_open_circuit_when_redis_goes_away(
    redis_server: RedisServer, prefix: str
) -> None:
    from actors.pacing.pacers import PacerSettings
    from actors.pacing.redis_pacer import RedisPacer

    clock = FakeClock()
    limits = {"p": ProviderLimits(rate_rps=40.0, burst=4), "q": ProviderLimits(rate_rps=40.0, burst=4)}
    settings = PacerSettings(circuit_failures=1, circuit_open_s=60.0)
    pacer = RedisPacer(redis_server.url, limits, settings, prefix=prefix, clock=clock, retry_s=600.0)
    other = RedisPacer(redis_server.url, limits, settings, prefix=prefix, clock=clock)
    other.pause("o", "p", 60.0)  # another worker's 429
    other.record("o", "q", answered=0, unavailable=1)  # another worker opened q's circuit
    assert pacer.take("o", "p").verdict == "paused" and pacer.take("o", "q").verdict == "refuse"
    redis_server.kill()
    clock.now += 5.0
    paused, refused = pacer.take("o", "p"), pacer.take("o", "q")
    assert paused.degraded and (paused.granted, paused.verdict) == (0, "paused")
    assert paused.wait_s == pytest.approx(55.0, abs=0.5)
    assert refused.degraded and (refused.granted, refused.verdict) == (0, "refuse")
    clock.now += 56.0
    assert pacer.take("o", "p").granted == 1  # the pause ends when it would have
    pacer.close()
    other.close()


def _worker(server: RedisServer, prefix: str, clock: FakeClock, name: str, burst: float | None = None) -> Any:
    from actors.pacing.redis_pacer import RedisPacer

    limits = {"p": ProviderLimits(rate_rps=10.0, burst=burst)}
    return RedisPacer(
        server.url, limits, prefix=prefix, expected_workers=2, clock=clock, retry_s=1.0, worker_id=name
    )


def test_a_local_share_starts_from_what_the_shared_bucket_had_granted_ahead(
    redis_server: RedisServer, prefix: str
) -> None:
    clock = FakeClock()
    pacer = _worker(redis_server, prefix, clock, "a", burst=4)
    assert pacer.take("o", "p", 4).granted == 4  # the whole shared burst: 0.4 s of the rate ahead
    redis_server.kill()
    local = pacer.take("o", "p", 2, partial=True)
    assert local.degraded and local.rate_rps == pytest.approx(5.0)
    # not a fresh, full bucket (2 tokens at once): its first token comes when the shared
    # bucket would have had one again (0.4 s less the burst's 0.3 s), or later
    assert local.granted == 0 and local.wait_s >= 0.1 - 0.01
    pacer.close()


def test_workers_local_shares_run_out_of_phase(redis_server: RedisServer, prefix: str) -> None:
    clock = FakeClock()
    a, b = (_worker(redis_server, prefix, clock, name) for name in ("a", "b"))
    for pacer in (a, b, a):  # each named in the workers set: 2 workers, ranks 0 and 1
        pacer.take("o", "p")
        clock.now += 3.0  # (a take names its worker every presence_s / 4)
    redis_server.kill()
    first = []
    for pacer in (a, b):
        local = pacer.take("o", "p")
        assert local.degraded and local.rate_rps == pytest.approx(5.0)
        first.append(clock.now + (0.0 if local.granted else local.wait_s))
    # each at 5/s, their points 0.1 s apart (half a period of 0.2 s), not together
    apart = (first[1] - first[0]) % 0.2
    assert apart == pytest.approx(0.1, abs=0.02)
    a.close()
    b.close()


def test_a_worker_back_on_redis_leaves_the_shares_of_those_still_local(
    redis_server: RedisServer, prefix: str
) -> None:
    clock = FakeClock()
    a, b = (_worker(redis_server, prefix, clock, name) for name in ("a", "b"))
    for pacer in (a, b, a):  # each named in the workers set: a and b know of 2 workers
        pacer.take("o", "p")
        clock.now += 3.0
    key = a.keys("o", "p")[0]
    redis_server.kill()
    assert a.take("o", "p").degraded and b.take("o", "p").degraded
    redis_server.start()  # empty: a restart
    clock.now += 1.0
    back = a.take("o", "p")
    assert not back.degraded and back.granted == 1
    admin = redis_server.client()
    assert admin.hget(key, "aw_n") == "1"  # b is presumed still local
    held = a.take("o", "p")
    assert held.granted == 0
    assert held.wait_s == pytest.approx(0.2, abs=0.03)  # 10/s less b's half: 5/s, not 10/s
    assert not b.take("o", "p").degraded  # b back too
    assert admin.hget(key, "aw_n") == "0"  # nobody is presumed local any more
    admin.close()
    a.close()
    b.close()


def test_a_worker_back_on_redis_hands_over_the_rate_it_learnt_locally(
    redis_server: RedisServer, prefix: str
) -> None:
    clock = FakeClock()
    pacer = _worker(redis_server, prefix, clock, "a")
    version = pacer.take("o", "p").version
    redis_server.kill()
    cut = pacer.pause("o", "p", 0.5, cut_version=version)  # a 429 while local: its share is cut
    assert cut.degraded and cut.cut and cut.rate_rps == pytest.approx(5.0 * 0.8)
    redis_server.start()  # empty: the shared state is gone
    clock.now += 1.0
    back = pacer.state("o", "p")
    assert not back.degraded
    assert back.rate_rps == pytest.approx(10.0 * 0.8)  # the cut, scaled to every worker's rate
    pacer.close()
