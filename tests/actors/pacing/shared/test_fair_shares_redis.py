"""The fairness keys of a bucket in Redis (``KEYS[4]``, ``...:fair``): written with the
state's TTL, and bounded: keys idle past ``fair_window_s`` are deleted by the next keyed
take. The shares themselves: ``test_fair_shares_runs.py`` (workers) and the conformance
test (the script against ``BucketState``)."""

from __future__ import annotations

import time

from actors.pacing import PacerSettings, ProviderLimits, RedisPacer

from .conftest import RedisServer

WINDOW_S = 0.05


def test_fair_shares_redis_keys_expire_and_idle_keys_are_deleted(
    redis_server: RedisServer, prefix: str
) -> None:
    settings = PacerSettings(fair_window_s=WINDOW_S, state_ttl_s=60.0)
    pacer = RedisPacer(redis_server.url, {"p": ProviderLimits(rate_rps=1000.0)}, settings, prefix=prefix)
    client = redis_server.client()
    try:
        fair = pacer.keys("o", "p")[3]
        pacer.take("o", "p")  # no key: the hash is not touched
        assert not client.exists(fair)
        for i in range(50):
            pacer.take("o", "p", key=f"customer-{i}", weight=1 + i % 3)
        assert client.hlen(fair) == 50
        assert 0 < client.pttl(fair) <= 60_000
        time.sleep(2 * WINDOW_S)  # every key idle past the window (none owes anything at 1000/s)
        pacer.take("o", "p", key="last")
        assert client.hkeys(fair) == ["last"]
    finally:
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
        client.close()
        pacer.close()
