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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from actors import BatchStrategy, Limit, Pacing, Policy, QuotaExhaustedError, RateLimitedError, Tool
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


def test_limits_a_call_that_never_fits_is_refused_alone(make_system: Any) -> None:
    """One call estimated at more than the whole quota is refused; the calls queued behind
    it on that tool go (one waiter's refusal is its own)."""
    paid: list[int] = []

    def fn(input: Any, ctx: Any) -> Any:
        time.sleep(0.05)
        paid.append(input["n"])
        return input

    tool = Tool(
        tool_id="big", fn=fn, provider="p", timeout_s=5.0,
        pacing=Pacing(limits=[Limit(10000, "minute", "tokens")]),
        units=lambda input: {"tokens": input["tokens"]},
    )  # fmt: skip
    system = make_system([tool], policy=Policy(max_concurrency=2))
    inputs = [{"n": n, "tokens": 50000 if n == 2 else 10} for n in range(10)]
    results = _outcomes([system.proxy().execute("big", x) for x in inputs])
    refused = [i for i, r in enumerate(results) if isinstance(r, QuotaExhaustedError)]
    assert refused == [2] and "more than its whole quota" in str(results[2])
    assert sorted(paid) == [n for n in range(10) if n != 2]


def test_limits_a_call_is_judged_against_a_quota_for_its_estimate_not_the_factor(make_system: Any) -> None:
    """A batch of 10 members of 30 tokens (300: 600 at the cold bias factor of 2) under a
    quota of 400 tokens/minute: taken at the quota (400), not refused as larger than it."""
    paid: list[int] = []

    def batch_fn(items: list[Any], ctx: Any) -> list[Any]:
        paid.extend(x["i"] for x in items)
        return items

    tool = Tool(
        tool_id="batched", fn=lambda input, ctx: input, provider="p", timeout_s=3.0,
        batch=BatchStrategy(batch_fn=batch_fn, max_batch_size=10),
        pacing=Pacing(limits=[Limit(400, "minute", "tokens")]), units=lambda input: {"tokens": 30},
    )  # fmt: skip
    system = make_system([tool])
    results = _outcomes(system.proxy().execute_many("batched", [{"i": i} for i in range(10)]))
    assert all(not isinstance(r, Exception) for r in results), results
    assert sorted(paid) == list(range(10))


def test_limits_a_batch_larger_than_a_quota_is_split(make_system: Any) -> None:
    """10 members of 30 tokens (300) under a quota of 200 tokens/minute: the batch is
    halved (as under a money budget) and the half that fits goes; the rest wait for the
    window past their timeout and are refused as such, not as larger than the quota."""
    paid: list[int] = []

    def batch_fn(items: list[Any], ctx: Any) -> list[Any]:
        paid.extend(x["i"] for x in items)
        return items

    tool = Tool(
        tool_id="batched", fn=lambda input, ctx: input, provider="p", timeout_s=2.0,
        batch=BatchStrategy(batch_fn=batch_fn, max_batch_size=10),
        pacing=Pacing(limits=[Limit(200, "minute", "tokens")]), units=lambda input: {"tokens": 30},
    )  # fmt: skip
    system = make_system([tool])
    results = _outcomes(system.proxy().execute_many("batched", [{"i": i} for i in range(10)]))
    assert len(paid) >= 5
    refused = [r for r in results if isinstance(r, Exception)]
    assert len(refused) == 10 - len(paid)
    assert all(isinstance(r, QuotaExhaustedError) and "is spent" in str(r) for r in refused), refused


def test_limits_systems_sharing_a_local_pacer_each_hold_to_every_stated_limit(tmp_path: Path) -> None:
    """Two systems share one LocalPacer for provider ``p``, one stating 100/minute, the
    other 2/minute: the pacer keeps both (each once), so the second's calls hold to its
    2/minute (the first's was kept alone: all 6 went)."""
    from actors import DispatchSystem, RunInfo
    from actors.pacing import LocalPacer
    from stores import SqliteReceiptStore

    pacer = LocalPacer()

    def start(name: str, limit: Limit) -> DispatchSystem:
        tool = Tool(
            tool_id="t", fn=lambda i, c: i, provider="p", timeout_s=2.0, pacing=Pacing(limits=[limit])
        )
        return DispatchSystem.start(
            tools=[tool], store=SqliteReceiptStore(str(tmp_path / f"{name}.db")), pacer=pacer,
            run=RunInfo(run_id=name, org_id="o", scope="s"), policy=Policy(batch_grace_s=0.01),
        )  # fmt: skip

    a = start("a", Limit(100, "minute"))
    b = start("b", Limit(2, "minute"))
    try:
        results = _outcomes(b.proxy().execute_many("t", [{"i": i} for i in range(6)]))
    finally:
        b.stop()
        a.stop()
    assert sum(not isinstance(r, Exception) for r in results) == 2
    assert all(isinstance(r, QuotaExhaustedError) for r in results if isinstance(r, Exception))
    assert pacer.unit_limits["p"] == (Limit(100, "minute"), Limit(2, "minute"))
