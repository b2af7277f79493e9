"""A receipt store outage under many workers: 2 real ``tooldispatch run`` processes share a
PostgreSQL and a Redis pacer that this test starts itself, against ``examples/provider.py``;
the test restarts PostgreSQL for a few seconds mid-run.

Every row completes (claims, reads, waits on the other worker's receipts and mark-running
ride the outage out within the calls' own timeout, as completion writes do), nothing is
billed twice (the provider counts what it billed), and each worker's report names the
outage with its duration. Only counts are asserted (no timing).
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.scenario

KEYS = 240
RATE = 40
"""The provider's limit and the play's stated rate, requests/s: the run lasts about KEYS/RATE s."""
OUTAGE_S = 12.0
"""How long PostgreSQL stays down: longer than a store call waits for a connection
(``PostgresReceiptStore(connect_timeout_s=10)``), so calls fail on it, not only wait."""
WORKER_TIMEOUT_S = 150.0

PLAY = """
import os

from actors import Pacing
from actors.http import http_tool

BASE = os.environ["FAULTS_PROVIDER_URL"]
tools = [http_tool("lookup", f"{BASE}/v1/domain", provider="faults-provider",
                   pacing=Pacing(rps=float(os.environ["FAULTS_RPS"])))]


def play(row, ctx):
    return ctx.tool("lookup", {"domain": row})
"""
TLDS = ("fr", "de", "jp", "br", "it", "es", "nl", "se", "ca", "au", "in", "mx")


def _rows(tmp_path: Path) -> tuple[Path, Path, Path]:
    play = tmp_path / "outage_play.py"
    play.write_text(PLAY, encoding="utf-8")
    domains = [f"site{i:05d}.example.{TLDS[i % len(TLDS)]}" for i in range(KEYS)]
    rows = tmp_path / "domains.txt"
    rows.write_text("\n".join(domains) + "\n", encoding="utf-8")
    backwards = tmp_path / "domains_reversed.txt"
    backwards.write_text("\n".join(reversed(domains)) + "\n", encoding="utf-8")
    return play, rows, backwards


def test_two_workers_ride_out_a_postgres_restart_every_row_once_and_the_report_names_it(
    tmp_path: Path, servers: Any, own_postgres: Any, own_redis: Any, provider: Any, report: Any
) -> None:
    api = provider("--rate", str(RATE), "--burst", "4", "--latency", "0.02")
    play, rows, backwards = _rows(tmp_path)
    env = {"FAULTS_PROVIDER_URL": api.url, "FAULTS_RPS": str(RATE)}
    args = ("--db", own_postgres.url, "--pacer", own_redis.url, "--concurrency", "32")
    workers = [
        servers.start_worker(
            tmp_path, f"w{i}", play, "--input", order, "--output", tmp_path / f"w{i}.jsonl", *args, env=env
        )
        for i, order in enumerate((rows, backwards))
    ]
    try:
        billed = _wait_billed(api, KEYS // 4, workers)
        own_postgres.stop("fast")  # every session ends (AdminShutdown); new ones are refused
        threading.Event().wait(OUTAGE_S)  # the outage itself
        own_postgres.start()
        done = [servers.finish(w, WORKER_TIMEOUT_S) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    for i, (code, log) in enumerate(done):
        assert code == 0, f"worker {i} (outage at {billed} billed):\n{log[-6000:]}"
        lines = servers.read_jsonl(tmp_path / f"w{i}.jsonl")
        assert len(lines) == KEYS
        failed = [line for line in lines if line["error"] is not None]
        assert failed == [], failed[:5]
        outages = {m: v for m, v in report(log).items() if m.startswith("outage: receipt store")}
        assert outages, f"worker {i}'s report names no store outage:\n{log[-4000:]}"
        (value,) = outages.values()
        assert re.search(r"\d+\.\d s", value), value
    stats = api.stats()
    assert stats.get("unique_items") == KEYS, stats
    assert stats.get("repeated_items", 0) == 0, stats  # nothing billed twice


def _wait_billed(api: Any, n: int, workers: list[Any]) -> int:
    """Wait until the provider billed ``n`` items (a worker that exits first fails the test)."""
    tick = threading.Event()
    for _ in range(int(60 / 0.05)):
        billed = int(api.stats().get("items", 0))
        if billed >= n:
            return billed
        assert all(w.poll() is None for w in workers), "a worker exited before the outage"
        tick.wait(0.05)
    raise AssertionError(f"fewer than {n} items billed within 60 s")
