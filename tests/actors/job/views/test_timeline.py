"""The run's time series: a point per provider per sample, its totals summed over the
provider's tools, bounded in memory by merging neighbours (the totals kept, so no request
is lost to a merge)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from actors.job.views import Point, Timeline, provider_tools


class _Tool:
    def __init__(self, tool_id: str, provider: str) -> None:
        self.tool_id, self.provider_name = tool_id, provider


def _stats(
    requests: dict[str, int], limited: dict[str, int], rates: dict[str, float | None]
) -> dict[str, Any]:
    return {
        "tools": {t: {"requests": n, "backpressure": limited.get(t, 0)} for t, n in requests.items()},
        "pacing": {f"default/{p}": {"rate_rps": r} for p, r in rates.items()},
    }


def test_provider_tools_groups_paid_tools_by_provider() -> None:
    tools = [_Tool("a", "acme"), _Tool("b", "acme"), _Tool("g", "maps"), _Tool("local", "local")]
    assert provider_tools(tools, {"local"}) == {"acme": ["a", "b"], "maps": ["g"]}


def test_timeline_sample_sums_a_providers_tools_and_takes_its_pacing_rate() -> None:
    timeline = Timeline({"acme": ["a", "b"], "maps": ["g"]}, started=100.0)
    timeline.sample(_stats({"a": 3, "b": 4, "g": 1}, {"a": 1}, {"acme": 12.5, "maps": None}), now=101.0)
    series = timeline.series()
    assert series["acme"] == [Point(t_s=1.0, requests=7, limited=1, rate_rps=12.5)]
    assert series["maps"] == [Point(t_s=1.0, requests=1, limited=0, rate_rps=None)]


def test_timeline_sample_drops_a_sample_not_later_than_the_last() -> None:
    timeline = Timeline({"acme": ["a"]}, started=0.0)
    timeline.sample(_stats({"a": 1}, {}, {"acme": 1.0}), now=2.0)
    timeline.sample(_stats({"a": 2}, {}, {"acme": 1.0}), now=2.0)
    assert [p.requests for p in timeline.series()["acme"]] == [1]


def test_timeline_stays_bounded_and_keeps_every_request_when_merging() -> None:
    timeline = Timeline({"acme": ["a"]}, started=0.0, max_points=100)
    for second in range(1, 10_001):  # 10,000 samples: ~2.8 hours at one a second
        timeline.sample(_stats({"a": 3 * second}, {"a": second // 10}, {"acme": 3.0}), now=float(second))
    points = timeline.series()["acme"]
    assert 50 <= len(points) <= 100
    assert points[-1] == Point(t_s=10_000.0, requests=30_000, limited=1000, rate_rps=3.0)
    # evenly spread: the gaps between neighbours (the last, still filling, apart) within a factor of 3
    gaps = [b.t_s - a.t_s for a, b in itertools.pairwise(points[:-1])]
    assert max(gaps) <= 3 * min(gaps), gaps
    # totals only grow
    assert all(a.requests <= b.requests and a.limited <= b.limited for a, b in itertools.pairwise(points))


def test_timeline_merging_averages_the_pacing_rate() -> None:
    timeline = Timeline({"acme": ["a"]}, started=0.0, max_points=2)
    for second, rate in ((1, 10.0), (2, 20.0), (3, None)):
        timeline.sample(_stats({"a": second}, {}, {"acme": rate}), now=float(second))
    assert timeline.series()["acme"] == [
        Point(t_s=2.0, requests=2, limited=0, rate_rps=15.0),
        Point(t_s=3.0, requests=3, limited=0, rate_rps=None),
    ]


def test_timeline_last_rates_are_requests_per_second_lately() -> None:
    timeline = Timeline({"acme": ["a"]}, started=0.0)
    assert timeline.last_rates() == {"acme": 0.0}
    for second, sent in ((1, 5), (2, 15), (3, 35)):
        timeline.sample(_stats({"a": sent}, {}, {}), now=float(second))
    assert timeline.last_rates(window=2) == {"acme": pytest.approx(15.0)}


def test_timeline_refuses_fewer_than_two_points() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        Timeline({}, started=0.0, max_points=1)
