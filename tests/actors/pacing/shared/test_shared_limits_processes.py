"""Several limits, in requests and in tokens, kept by two worker processes through one Redis.

Each worker is ``_hosts/limits_worker.py`` (under gevent monkey-patching in the gevent
run): a whole DispatchSystem pacing through a RedisPacer on a private ``redis-server``,
against one provider on 127.0.0.1 that keeps 50 requests/s, 100 requests and 2,000 tokens
per 4 s (fixed windows) and answers 429 past any of them. Together the workers stay
within every limit: no 429, and no window of the provider's log holds more than its limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests._limited_provider import LimitedProvider, most_in_window

from .conftest import RedisServer
from .test_shared_pacer_processes import Worker

pytestmark = pytest.mark.scenario

HOST = Path(__file__).parent / "_hosts" / "limits_worker.py"


def test_shared_limits_two_processes_stay_within_every_limit(
    redis_server: RedisServer, prefix: str, tmp_path: Path, runtime: Any
) -> None:
    provider = LimitedProvider(
        [(50, 1.0, "requests"), (100, 4.0, "requests"), (2000, 4.0, "tokens")], burst=5
    )
    provider.start()
    url = f"{redis_server.url}?prefix={prefix}"
    workers = [
        Worker(runtime, url, provider.url, str(tmp_path / f"w{k}.db"), str(k * 1000), "150", host=HOST)
        for k in range(2)
    ]
    try:
        for worker in workers:
            assert worker.answer()["ready"]
        for worker in workers:
            worker.send("go")
        done = [worker.answer(timeout_s=300) for worker in workers]
    finally:
        for worker in workers:
            worker.proc.kill()
            worker.proc.wait()
        provider.stop()
    assert [d["outcomes"] for d in done] == [{"live": 150}, {"live": 150}], provider.refused_by
    assert not any(d["degraded"] for d in done)
    assert provider.statuses == {200: 300}
    requests = [(t, 1.0) for t, _ in provider.accepted]
    assert most_in_window(requests, 4.0) <= 100
    assert most_in_window(provider.accepted, 4.0) <= 2000
    assert most_in_window(requests, 1.0) <= 50 + 5
