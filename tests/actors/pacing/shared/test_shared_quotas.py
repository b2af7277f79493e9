"""The quota state through a RedisPacer: two pacers (two workers) share every limit; while
Redis is away each keeps its share of each limit locally."""

from __future__ import annotations

from actors.pacing.redis_pacer import RedisPacer
from actors.tool import Limit

from .conftest import RedisServer

LIMITS = (Limit(10, "minute"), Limit(1000, "minute", "tokens"))


def _pacer(url: str, prefix: str) -> RedisPacer:
    pacer = RedisPacer(url, prefix=prefix, expected_workers=4)
    pacer.unit_limits["p"] = LIMITS
    return pacer


def test_shared_quotas_two_pacers_take_from_the_same_limits(redis_server: RedisServer, prefix: str) -> None:
    a, b = _pacer(redis_server.url, prefix), _pacer(redis_server.url, prefix)
    try:
        assert a.take_units("org", "p", [{"tokens": 300}] * 2).granted == 2
        got = b.take_units("org", "p", [{"tokens": 300}] * 2)
        assert got.granted == 1 and got.limit == 1  # 900 tokens taken: the 4th would pass 1,000
        b.correct_units("org", "p", {"tokens": -500})
        assert a.take_units("org", "p", [{"tokens": 300}]).granted == 1
        a.give_back_units("org", "p", {"requests": 1, "tokens": 300})
        assert b.give_back_units("org", "p", {}).room == (7.0, 600.0)
    finally:
        a.close()
        b.close()


def test_shared_quotas_redis_away_keeps_a_share_locally(redis_server: RedisServer, prefix: str) -> None:
    pacer = _pacer(redis_server.url, prefix)
    redis_server.kill()
    try:
        got = pacer.take_units("org", "p", [{"tokens": 100}] * 5)
        assert got.granted == 2  # a quarter of 10 requests (expected_workers=4)
        assert pacer.snapshot()["degraded"]
    finally:
        pacer.close()
