"""A quota the provider announces and the tool does not state counts, end to end: the
public API (a DispatchSystem, an ``http_tool`` stating no limits) against
``examples/provider.py --limit 50/s --limit 200/min --announce`` (every answer states
``RateLimit-Policy: "requests-1s";q=50;w=1, "requests-60s";q=200;w=60`` and the counts
left). Once the minute's 200 are used, calls wait for its reset instead of meeting 429s;
a call whose timeout ends before the reset is refused at once naming the quota, not
sent, its receipt left pending."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from actors import QuotaExhaustedError
from actors.http import http_tool
from stores.types import ReceiptStatus

pytestmark = pytest.mark.scenario

WAIT_S = 150.0


def _outcome(future: Any) -> Any:
    try:
        return future.get(timeout=WAIT_S)
    except Exception as exc:
        return exc


def test_announced_quota_not_stated_holds_calls_for_its_reset_and_refuses_the_hasty(
    example_provider: Callable[..., Any], make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    provider = example_provider("--limit", "50/s", "--limit", "200/min", "--announce")
    tool = http_tool("country", f"{provider.url}/v1/country", provider="example", timeout_s=120.0)
    system = make_system([tool])
    proxy = system.proxy()
    first = [proxy.execute("country", {"code": "FR", "i": i}) for i in range(150)]
    assert [getattr(_outcome(f), "execution", None) for f in first] == ["live"] * 150
    # calls that cannot wait the minute out: those the minute's quota has room for go, the
    # rest are refused at once naming it (not sent: no 429)
    hasty_inputs = [{"code": "DE", "i": i} for i in range(100)]
    start = time.monotonic()
    hasty = [_outcome(proxy.execute("country", x, timeout_s=5.0)) for x in hasty_inputs]
    assert time.monotonic() - start < 5.0  # at once, not at their timeout
    sent = [getattr(r, "execution", None) == "live" for r in hasty]
    refused = [r for r in hasty if isinstance(r, QuotaExhaustedError)]
    assert sum(sent) + len(refused) == 100, [r for r in hasty if not isinstance(r, QuotaExhaustedError)][:3]
    assert 0 < sum(sent) <= 50 and refused
    assert {r.limit for r in refused} == {"200 requests/minute"}
    assert all(0 < r.reset_s <= 61.0 for r in refused) and "200 requests/minute" in str(refused[0])
    reset_s = min(r.reset_s for r in refused)
    unsent = [x for x, went in zip(hasty_inputs, sent, strict=True) if not went]
    digest = tool.credentials() if tool.credentials else ""
    receipts = read_receipts([key_of(tool, x, digest=digest) for x in unsent])
    assert [r.status if r else None for r in receipts] == [ReceiptStatus.PENDING] * len(unsent)
    # patient calls wait for the reset, then go: no 429
    start = time.monotonic()
    later = [proxy.execute("country", {"code": "IT", "i": i}) for i in range(20)]
    assert [getattr(_outcome(f), "execution", None) for f in later] == ["live"] * 20
    waited = time.monotonic() - start
    stats = provider.stats()
    # (at most one 429: a request sent before the first answer said the limits)
    assert stats.get("rate_limited", 0) <= 1, stats
    assert waited >= reset_s - 2.0  # they waited for the reset
    windows = stats["windows"]["200/min"]
    assert windows["0"]["accepted"] == 150 + sum(sent) and windows["1"]["accepted"] == 20, windows
    waits = system.stats()["waits"]["tools"]["country"]
    assert waits.get("quota", 0) >= reset_s - 2.0, waits  # counted as a quota wait
    print(
        f"first window: {150 + sum(sent)} of 200 used, {len(refused)} refused, "
        f"then waited {waited:.1f} s (reset in {reset_s:.1f} s); 429s: {stats.get('rate_limited', 0)}"
    )
