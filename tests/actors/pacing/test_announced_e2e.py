"""Pacing to the limits a provider announces, end to end: the public API (a DispatchSystem,
an ``http_tool`` stating no pacing) against ``examples/provider.py --announce`` (every
answer states ``RateLimit-Policy: "requests-1s";q=R;w=1`` and the rest). Rates are
measured by ``bench/_pacing_announced.py``; these tests assert on what the provider
counted and what the governor reports."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from actors.http import http_tool
from actors.pacing.bucket import PACE_MARGIN

pytestmark = pytest.mark.scenario

WAIT_S = 120.0


def _live(futures: list[Any]) -> list[str]:
    return [f.get(timeout=WAIT_S).execution for f in futures]


def _pacing(system: Any) -> dict[str, Any]:
    return dict(system.stats()["pacing"]["acme/example"])


@pytest.mark.parametrize("rate", [50, 200])
def test_announced_limit_is_paced_to_from_the_first_answer_with_no_429(
    rate: int, example_provider: Callable[..., Any], make_system: Any
) -> None:
    provider = example_provider("--rate", str(rate), "--announce")
    tool = http_tool("country", f"{provider.url}/v1/country", provider="example")  # no pacing stated
    system = make_system([tool])
    futures = [system.proxy().execute("country", {"code": "FR", "i": i}) for i in range(rate * 2)]
    assert _live(futures) == ["live"] * (rate * 2)
    stats = provider.stats()
    seen = _pacing(system)
    assert (seen["learnt"], seen["limit_rps"], seen["learner_cuts"]) == ("announced", rate, None)
    if rate <= 50:
        # learning an unknown rate meets a 429 at slow start's first overshoot; an
        # announced one is never passed (the provider's bucket holds 10 requests: a
        # stall of 0.2 s of its sends or of the provider is absorbed)
        assert stats.get("rate_limited", 0) == 0
        assert seen["rate_rps"] == pytest.approx(rate * PACE_MARGIN)
    else:  # a provider starved of CPU (a loaded CI box) reads 10 ms of sends as a bunch
        assert stats.get("rate_limited", 0) <= rate * 2 // 20
        assert rate * PACE_MARGIN / 2 <= seen["rate_rps"] <= rate * PACE_MARGIN * (1 + 1e-9)
    busiest = max(s.get("accepted", 0) for s in stats["per_second"].values())
    assert busiest <= rate + 10  # never above the limit (plus the provider's burst)


def test_announced_limit_change_mid_run_is_followed(
    example_provider: Callable[..., Any], make_system: Any
) -> None:
    provider = example_provider("--rate", "50", "--announce")
    tool = http_tool("country", f"{provider.url}/v1/country", provider="example")
    system = make_system([tool])
    proxy = system.proxy()
    first = [proxy.execute("country", {"code": "FR", "i": i}) for i in range(50)]
    assert _live(first) == ["live"] * 50
    assert _pacing(system)["limit_rps"] == 50
    provider.set_limits("100/s")  # raised: followed at the next answer
    raised = [proxy.execute("country", {"code": "DE", "i": i}) for i in range(200)]
    assert _live(raised) == ["live"] * 200
    seen = _pacing(system)
    assert (seen["learnt"], seen["limit_rps"]) == ("announced", 100)
    assert seen["rate_rps"] == pytest.approx(100 * PACE_MARGIN)
    assert provider.stats().get("rate_limited", 0) == 0
    provider.set_limits("20/s")  # lowered: the answers in flight meet a 429 or two at most
    start = time.monotonic()
    lowered = [proxy.execute("country", {"code": "IT", "i": i}) for i in range(40)]
    assert _live(lowered) == ["live"] * 40
    assert time.monotonic() - start >= 40 / 20 - 1.0  # paced at the new limit, not the old
    seen = _pacing(system)
    assert (seen["limit_rps"], seen["rate_rps"]) == (20, pytest.approx(20 * PACE_MARGIN))
    assert provider.stats().get("rate_limited", 0) <= 3
