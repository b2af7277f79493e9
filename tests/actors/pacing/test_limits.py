"""Several limits on one provider, and limits in units, against a provider that keeps them.

The provider (``tests/_limited_provider.py``) is an HTTP server on 127.0.0.1 that keeps a
request rate (a token bucket) and quotas in requests and in tokens (fixed windows, as
most providers count), answering 429 past any of them; its calls use their estimated
tokens give or take 50 %. Windows are a few seconds long (the same rules as a minute's,
scaled down) so a test runs in seconds. Tests assert on counts: 429s, how each call
ended, the most the provider accepted in any window; rates are ``bench/_pacing_limits.py``'s.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from actors import Limit, Pacing, Policy, QuotaExhaustedError, RateLimitedError, Tool
from actors.http import http_tool
from actors.pacing.reports import report_usage
from stores.types import ReceiptStatus
from tests._limited_provider import LimitedProvider, most_in_window

from ..conftest import WAIT_S

pytestmark = pytest.mark.scenario


@pytest.fixture
def limited() -> Iterator[Any]:
    made: list[LimitedProvider] = []

    def make(limits: list[tuple[float, float, str]], **kwargs: Any) -> LimitedProvider:
        provider = LimitedProvider(limits, **kwargs).start()
        made.append(provider)
        return provider

    yield make
    for provider in made:
        provider.stop()


def _outcomes(futures: list[Any]) -> list[Any]:
    out = []
    for future in futures:
        try:
            out.append(future.get(timeout=WAIT_S))
        except Exception as exc:
            out.append(exc)
    return out


def test_limits_rate_and_quota_are_each_held(limited: Any, make_system: Any) -> None:
    # 50 requests/s and 100 requests per 4 s (a "minute" of 4 s): the quota binds
    provider = limited([(50, 1.0, "requests"), (100, 4.0, "requests")], burst=5)
    pacing = Pacing(limits=[Limit(50, "second"), Limit(100, 4.0)])
    tool = http_tool("call", provider.url, provider="limited", pacing=pacing, timeout_s=30.0)
    system = make_system([tool], policy=Policy(batch_grace_s=0.01, retry_attempts=0))
    results = _outcomes(system.proxy().execute_many("call", [{"i": i} for i in range(250)]))
    assert [getattr(r, "execution", r) for r in results] == ["live"] * 250
    assert provider.statuses == {200: 250}
    assert most_in_window([(t, 1.0) for t, _ in provider.accepted], 4.0) <= 100
    assert most_in_window([(t, 1.0) for t, _ in provider.accepted], 1.0) <= 50 + 5
    waits = system.stats()["waits"]["tools"]["call"]
    assert waits.get("quota", 0.0) > 1.0  # the calls past the first 100 waited for the quota


def test_limits_tokens_with_estimates_off_by_half_meet_no_429(limited: Any, make_system: Any) -> None:
    provider = limited([(2000, 3.0, "tokens")], spread=0.5)
    rng = random.Random(5)
    inputs = [{"i": i, "tokens": rng.randint(10, 200)} for i in range(70)]
    tool = http_tool(
        "chat",
        provider.url,
        provider="limited",
        pacing=Pacing(limits=[Limit(2000, 3.0, "tokens")]),
        timeout_s=30.0,
    )
    tool = attrs.evolve(
        tool,
        units=lambda input: {"tokens": input["tokens"]},
        units_used=lambda input, output: {"tokens": output["tokens"]},
    )
    system = make_system([tool], policy=Policy(batch_grace_s=0.01, retry_attempts=0))
    results = _outcomes(system.proxy().execute_many("chat", inputs))
    assert [getattr(r, "execution", r) for r in results] == ["live"] * 70
    assert provider.statuses == {200: 70}  # estimates that ran low did not meet a 429
    assert most_in_window(provider.accepted, 3.0) <= 2000


def test_limits_usage_reported_by_the_tool_corrects_the_estimate(limited: Any, make_system: Any) -> None:
    provider = limited([(1000, 3.0, "tokens")], spread=0.0)
    http = http_tool("raw", provider.url, provider="limited")

    def fn(input: Any, ctx: Any) -> Any:
        out = http.fn(input, ctx)
        report_usage(tokens=out["tokens"])
        return out

    # estimated at 300 tokens each (600 until the bias is learnt), used 100: corrected,
    # 5 to 8 calls fit in a window (3 s, and the pacer's second of slack); uncorrected,
    # 1 to 3 would (40 calls: 13 windows or more, 52 s)
    tool = Tool(
        tool_id="chat", fn=fn, provider="limited", pacing=Pacing(limits=[Limit(1000, 3.0, "tokens")]),
        units=lambda input: {"tokens": 300}, timeout_s=60.0,
    )  # fmt: skip
    system = make_system([tool], policy=Policy(batch_grace_s=0.01, max_concurrency=1))
    results = _outcomes(system.proxy().execute_many("chat", [{"i": i, "tokens": 100} for i in range(40)]))
    assert [getattr(r, "execution", r) for r in results] == ["live"] * 40
    assert provider.statuses == {200: 40}
    span = provider.accepted[-1][0] - provider.accepted[0][0]
    assert span < 10 * 4.0


def test_limits_spent_quota_refuses_past_the_timeout_receipts_pending(
    limited: Any, make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    provider = limited([(5, 60.0, "requests")])
    tool = http_tool(
        "call", provider.url, provider="limited", pacing=Pacing(limits=[Limit(5, "minute")]), timeout_s=2.0
    )
    system = make_system([tool], policy=Policy(batch_grace_s=0.01))
    inputs = [{"i": i} for i in range(8)]
    results = _outcomes(system.proxy().execute_many("call", inputs))
    live = [r for r in results if getattr(r, "execution", None) == "live"]
    refused = [r for r in results if isinstance(r, QuotaExhaustedError)]
    assert len(live) == 5 and len(refused) == 3
    assert refused[0].limit == "5 requests/minute" and 55.0 < refused[0].reset_s <= 62.0
    assert "5 requests/minute" in str(refused[0]) and "in 6" in str(refused[0])
    assert provider.statuses == {200: 5}  # refused before they were sent
    keys = [key_of(tool, i, digest=tool.credentials() if tool.credentials else "") for i in inputs]
    statuses = [r.status for r in read_receipts(keys)]
    assert statuses.count(ReceiptStatus.PENDING) == 3  # a rerun pays for them later
    assert not any(isinstance(r, RateLimitedError) for r in results)


def test_limits_docs_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    page = (Path(__file__).resolve().parents[3] / "docs" / "pacing.md").read_text(encoding="utf-8")
    section = page.split("## Several limits, and units", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert block is not None, "docs/pacing.md: 'Several limits, and units' has no example"
    exec(compile(block.group(1), "docs/pacing.md example", "exec"), {"__name__": "__example__"})
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines) == sorted(
        ["SAY 0 TWICE", "SAY 1 TWICE", "SAY 2 TWICE", "refused: 3 requests/day (room again in 24 h)"]
    )
