"""Workers sharing a Redis pacer that hear the same announced quotas (in any order) add them
in the same order, so they count against one shared quota state (signed by its list of
limits). Two governors, each with its own RedisPacer on one private Redis."""

from __future__ import annotations

import pytest

from actors.governor.decisions import Governor
from actors.pacing.announced import Announcement
from actors.pacing.redis_pacer import RedisPacer
from actors.tool import Limit, Pacing, Policy

from .conftest import RedisServer

ORG = "acme"


def test_workers_hearing_announced_quotas_in_any_order_share_one_count(
    redis_server: RedisServer, prefix: str
) -> None:
    daily = Announcement(limit=100, window_s=86400.0, remaining=10, reset_s=3600.0, name="daily")
    tokens = Announcement(unit="tokens", limit=20000, window_s=60.0, remaining=19000, reset_s=30.0)
    stated = Limit(5000, "hour")
    pacers, govs = [], []
    for heard in ([daily, tokens], [tokens, daily]):
        pacer = RedisPacer(redis_server.url, prefix=prefix)
        gov = Governor(Policy(), {"p": Pacing(rps=1000, limits=[stated])}, lambda: 0.0, pacer)
        gov.announced(ORG, "p", heard, sent_at=0.0, now=0.0)
        pacers.append(pacer)
        govs.append(gov)
    try:
        expected = (stated, Limit(100.0, "day"), Limit(20000.0, "minute", "tokens"))
        assert [p.unit_limits["p"] for p in pacers] == [expected, expected]
        assert pacers[0].take_units(ORG, "p", [{"tokens": 100.0}] * 6).granted == 6
        room = pacers[1].give_back_units(ORG, "p", {}).room  # the other worker sees those 6
        assert room == pytest.approx((4994.0, 4.0, 18400.0))
        got = pacers[1].take_units(ORG, "p", [{}] * 6)
        assert got.granted == 4 and got.limit == 1 and 3590 < got.reset_s <= 3600
    finally:
        for pacer in pacers:
            pacer.close()
