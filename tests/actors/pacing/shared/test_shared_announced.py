"""Worker processes sharing a provider that announces its limit through one Redis pace to
it together from the first answers: Σ within the limit, no 429.

Real processes (``_hosts/announced_worker.py``, each a DispatchSystem with its own
SQLite file, under gevent monkey-patching in the gevent run), a private Redis, and
``examples/provider.py --rate R --announce``. Counts only: the rates are measured by
``bench/_pacing_announced.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actors.pacing.bucket import PACE_MARGIN

from .conftest import RedisServer
from .test_shared_pacer_processes import Worker

pytestmark = pytest.mark.scenario

HOST = Path(__file__).parent / "_hosts" / "announced_worker.py"
RATE = 50
WORKERS = 2
CALLS = 200
"""Calls in all (about 4 s of the limit)."""
DONE_WAIT_S = 180.0


def test_workers_pace_together_to_an_announced_limit(
    runtime: str, redis_server: RedisServer, prefix: str, tmp_path: Path, example_provider: Callable[..., Any]
) -> None:
    provider = example_provider("--rate", str(RATE), "--announce")
    pacer_url = f"{redis_server.url}?prefix={prefix}"
    workers = [
        Worker(runtime, pacer_url, f"{provider.url}/v1/country", str(tmp_path / f"w{i}.db"), str(i),
               str(WORKERS), str(CALLS), host=HOST)
        for i in range(WORKERS)
    ]  # fmt: skip
    try:
        for w in workers:
            assert w.answer() == {"ready": True}
        for w in workers:
            w.send("go")
        ends = [w.answer(DONE_WAIT_S) for w in workers]
        reports: list[dict[str, Any]] = [w.ask("report") for w in workers]
    finally:
        for w in workers:
            w.stop()
    assert sum(e["live"] for e in ends) == CALLS
    stats = provider.stats()
    assert stats.get("rate_limited", 0) == 0  # learning would meet a 429 at slow start's overshoot
    busiest = max(s.get("accepted", 0) for s in stats["per_second"].values())
    assert busiest <= RATE + 10  # both together within the limit (plus the provider's burst)
    for report in reports:  # each worker read the announcement; one rate for both
        assert (report["learnt"], report["limit_rps"]) == ("announced", RATE), reports
        assert report["rate_rps"] == pytest.approx(RATE * PACE_MARGIN), reports
