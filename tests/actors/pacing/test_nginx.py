"""Pacing against a real rate limiter: nginx ``limit_req`` (429 + ``Retry-After: 1``).

nginx comes from the distribution (``apt-get install nginx-light``; ``.ci/run`` installs
it). Without it these tests skip locally, saying how to get it, and fail when ``CI`` is
set. Each test starts its own nginx on a free 127.0.0.1 port (``tests/_nginx.py``).
Rates are measured by ``bench/pacing_bench.py``; these tests assert on counts: what the
provider accepted and refused, and how each call ended.
"""

from __future__ import annotations

from typing import Any

import pytest

from actors import Pacing, Policy, RateLimitedError, Tool
from actors.http import http_tool

pytestmark = pytest.mark.scenario

WAIT_S = 120.0


def _outcomes(futures: list[Any]) -> list[Any]:
    out = []
    for future in futures:
        try:
            out.append(future.get(timeout=WAIT_S))
        except Exception as exc:
            out.append(exc)
    return out


def test_pacing_stated_burst_goes_at_once_with_no_429(nginx: Any, make_system: Any) -> None:
    limiter = nginx(100 / 60, burst=49)  # 100/min; nginx lets 1 + 49 through at once
    # a call may wait at most 10 s for its turn to send: spaced one per 0.6 s (no burst)
    # only the first ~16 of 50 would go, the rest would come back unsent
    tool: Tool = http_tool(
        "verify", limiter.url, provider="nginx", pacing=Pacing(rps=100 / 60, burst=50), timeout_s=10.0
    )
    system = make_system([tool], policy=Policy(batch_grace_s=0.05, retry_attempts=1))
    futures = [system.proxy().execute("verify", {"i": i}) for i in range(50)]
    results = _outcomes(futures)
    assert [getattr(r, "execution", r) for r in results] == ["live"] * 50
    assert limiter.statuses() == {200: 50}
    assert system.stats()["backpressure"] == 0


def test_pacing_stated_burst_is_taken_at_its_word(nginx: Any, make_system: Any) -> None:
    # the provider lets 10 through at once, the tool states 20: the requests really went
    # together (spaced one by one, none would have met a 429)
    limiter = nginx(10, burst=9)
    tool = http_tool("verify", limiter.url, provider="nginx", pacing=Pacing(rps=10, burst=20))
    system = make_system([tool], policy=Policy(batch_grace_s=0.05))
    results = _outcomes([system.proxy().execute("verify", {"i": i}) for i in range(20)])
    assert limiter.statuses().get(429, 0) >= 5
    assert system.stats()["backpressure"] >= 5
    assert len(results) == 20


def test_pacing_honours_retry_after_of_a_real_limiter(nginx: Any, make_system: Any) -> None:
    limiter = nginx(20, burst=2)
    tool = http_tool("verify", limiter.url, provider="nginx")  # rate unknown: learnt
    system = make_system([tool], policy=Policy(batch_grace_s=0.05))
    results = _outcomes([system.proxy().execute("verify", {"i": i}) for i in range(120)])
    seen = limiter.statuses()
    limited = seen.get(429, 0)
    ok = [r for r in results if getattr(r, "execution", None) == "live"]
    # every 429 was either re-admitted and later accepted or is a call's final error
    assert seen.get(200, 0) == len(ok)
    assert all(isinstance(r, RateLimitedError) for r in results if r not in ok)
    assert system.stats()["backpressure"] == limited
    # learnt from what nginx accepted: most calls went through, few met a 429 (bounds loose
    # enough for a CI box running eight suites on two cores; the rates are in the bench)
    assert len(ok) >= 100
    assert limited <= 24
