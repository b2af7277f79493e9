"""A bounded time series per provider, sampled from ``stats()`` during a run.

The CLI's progress thread calls :meth:`Timeline.sample` about once a second. Each point
holds running totals (requests sent, those answered 429) and the pacing rate at that
moment; rates over time are the differences between neighbours, so merging two
neighbours (keeping the later totals) loses resolution, never requests. Past
``max_points`` every pair of neighbours is merged into one: memory stays bounded however
long the run. After a merge, a new sample is merged into the last point until the last
gap is as wide as the merged ones, so the points stay evenly spread over the run.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

__all__ = ["MAX_POINTS", "Point", "Timeline", "provider_tools"]

MAX_POINTS = 2000
"""Points kept per provider, at most (about 33 minutes at one a second before merging)."""


@attrs.frozen(kw_only=True)
class Point:
    """One sample of a provider."""

    t_s: float
    """Seconds since the run began."""
    requests: int
    """Requests sent to the provider so far (every attempt, those answered 429 among them)."""
    limited: int
    """Of them, answered 429 so far."""
    rate_rps: float | None
    """The pacing rate (requests/s) at ``t_s``; the mean of the points merged into it; None:
    unpaced or not known yet."""


def provider_tools(tools: Iterable[Any], local: Iterable[str] = ()) -> dict[str, list[str]]:
    """Provider name -> the ids of its paid tools (``Tool.provider_name``; ``local`` tool
    ids left out: they send no requests)."""
    skip = set(local)
    out: dict[str, list[str]] = {}
    for tool in tools:
        if tool.tool_id not in skip:
            out.setdefault(tool.provider_name, []).append(tool.tool_id)
    return out


def _merge(a: Point, b: Point) -> Point:
    rates = [r for r in (a.rate_rps, b.rate_rps) if r is not None]
    return Point(
        t_s=b.t_s, requests=b.requests, limited=b.limited, rate_rps=sum(rates) / len(rates) if rates else None
    )


class Timeline:
    """Samples per provider, bounded in memory; safe to read from another thread.

    Args:
        providers: provider name -> its tools' ids (:func:`provider_tools`).
        started: the run's start (monotonic seconds): ``t_s`` counts from it.
        max_points: points kept per provider (at least 2; see the module docstring).
    """

    def __init__(self, providers: Mapping[str, Sequence[str]], started: float, max_points: int = MAX_POINTS):
        if max_points < 2:
            raise ValueError(f"max_points must be at least 2, not {max_points}")
        self.providers = {name: list(ids) for name, ids in providers.items()}
        self.started = started
        self.max_points = max_points
        self._points: dict[str, list[Point]] = {name: [] for name in self.providers}
        self._spacing: dict[str, float] = dict.fromkeys(self.providers, 0.0)
        """Provider -> the gap its points keep since the last halving: a new sample closer
        to the one before the last is merged into the last, so the points stay evenly
        spread however long the run."""
        self._lock = threading.Lock()

    def sample(self, stats: Mapping[str, Any], now: float) -> None:
        """Add a point per provider from ``stats`` (the dispatch system's ``stats()``),
        taken at ``now`` (monotonic seconds). A sample not later than the last is dropped."""
        per_tool = stats.get("tools") if isinstance(stats.get("tools"), dict) else {}
        assert isinstance(per_tool, dict)
        pacing = stats.get("pacing") or {}
        t_s = max(0.0, now - self.started)
        with self._lock:
            for name, ids in self.providers.items():
                points = self._points[name]
                if points and t_s <= points[-1].t_s:
                    continue
                rates = [
                    float(view["rate_rps"])
                    for key, view in pacing.items()
                    if key.rpartition("/")[2] == name and view.get("rate_rps") is not None
                ]
                point = Point(
                    t_s=t_s,
                    requests=sum(int(per_tool.get(t, {}).get("requests", 0)) for t in ids),
                    limited=sum(int(per_tool.get(t, {}).get("backpressure", 0)) for t in ids),
                    rate_rps=sum(rates) if rates else None,  # one rate per org: their sum
                )
                if len(points) > 1 and points[-1].t_s - points[-2].t_s < self._spacing[name]:
                    points[-1] = _merge(points[-1], point)  # the last gap is not wide enough yet
                else:
                    points.append(point)
                if len(points) > self.max_points:
                    points = self._points[name] = self._halve(points)
                    self._spacing[name] = (points[-1].t_s - points[0].t_s) / (len(points) - 1)

    @staticmethod
    def _halve(points: list[Point]) -> list[Point]:
        """Every pair of neighbours merged into one (an odd last point kept as it is)."""
        merged = [_merge(points[i], points[i + 1]) for i in range(0, len(points) - 1, 2)]
        if len(points) % 2:
            merged.append(points[-1])
        return merged

    def series(self) -> dict[str, list[Point]]:
        """Provider name -> its points, oldest first (a copy)."""
        with self._lock:
            return {name: list(points) for name, points in self._points.items()}

    def last_rates(self, window: int = 2) -> dict[str, float]:
        """Provider name -> requests sent per second over its last ``window`` intervals
        (0.0 before two points)."""
        out: dict[str, float] = {}
        with self._lock:
            for name, points in self._points.items():
                recent = points[-(window + 1) :]
                span = recent[-1].t_s - recent[0].t_s if len(recent) > 1 else 0.0
                out[name] = (recent[-1].requests - recent[0].requests) / span if span > 0 else 0.0
        return out
