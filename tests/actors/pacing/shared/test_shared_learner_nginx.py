"""Worker processes sharing a provider of unknown limit through one Redis learn ONE estimate.

Real processes (``_hosts/learn_worker.py``, each a DispatchSystem with its own SQLite
file, under gevent monkey-patching in the gevent run), a private Redis, and nginx
``limit_req`` (429 + ``Retry-After: 1``; ``tests/_nginx.py``; without nginx this skips
locally, saying how to get it, and fails when ``CI`` is set). Counts only: the rates
are measured by ``bench/scaleout_bench.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import RedisServer
from .test_shared_pacer_processes import Worker

pytestmark = pytest.mark.scenario

HOST = Path(__file__).parent / "_hosts" / "learn_worker.py"
RATE = 20.0
"""nginx's limit, requests/s."""
BURST = 2
WORKERS = 4
CALLS = 240
"""Calls in all (about 12 s of the limit)."""
DONE_WAIT_S = 180.0


def test_workers_learn_one_estimate_of_an_unknown_limit(
    runtime: str, redis_server: RedisServer, prefix: str, tmp_path: Path, nginx: Any
) -> None:
    pacer_url = f"{redis_server.url}?prefix={prefix}"
    limiter = nginx(RATE, BURST)
    workers = [
        Worker(runtime, pacer_url, limiter.url, str(tmp_path / f"w{i}.db"), str(i), str(WORKERS),
               str(CALLS), host=HOST)
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
    seen = limiter.statuses()
    live = sum(e["live"] for e in ends)
    assert sum(e["other"] for e in ends) == 0
    assert live + sum(e["rate_limited"] for e in ends) == CALLS
    assert seen.get(200, 0) == live  # every call nginx accepted is a live result, no more
    # one estimate, learnt from what nginx accepted from all of them (each worker alone
    # saw about a quarter of it), shown by every worker
    limits = {r["limit_rps"] for r in reports}
    assert len(limits) == 1, reports
    (limit,) = limits
    assert limit is not None and 0.5 * RATE <= limit <= 1.5 * RATE, reports
    assert len({(r["learnt"], r["learner_cuts"]) for r in reports}) == 1, reports
    assert all(r["learnt"] in ("plateau", "probe") for r in reports), reports
    # few 429s (loose: a CI box runs several suites on two cores; the share is in the bench)
    assert seen.get(429, 0) <= 24, seen
