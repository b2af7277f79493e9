"""A receipt store back after an outage serves the next claim at once: the time from the
server's return to the first request a worker sends after it (each needs a claim first)
is measured against a PostgreSQL this test stops and starts itself.

psycopg_pool connects again with an exponential back-off (1, 2, 4, 8... s); an outage of
about 9 s then ended 4-7 s after the server was back. The store asks its pool for a fresh
attempt every ``RECONNECT_S`` while a caller waits (``stores.postgres.conn``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.scenario

KEYS = 300
"""A tenth billed before the outage; the rest (about 7 s at RATE) still to claim after it."""
RATE = 40
OUTAGE_S = 8.5
"""How long PostgreSQL stays down (it then takes about a second to start): the back-off's
attempts at about 7 s and 15 s after the loss bracket its return."""
BACK_WITHIN_S = 3.0
"""The first request after the server's return goes within this many seconds (measured:
well under 1 s; the pool's back-off made it 4-7 s)."""
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


def test_a_worker_claims_again_promptly_once_postgres_is_back(
    tmp_path: Path, servers: Any, own_postgres: Any, provider: Any
) -> None:
    api = provider("--rate", str(RATE), "--burst", "4", "--latency", "0.01")
    play = tmp_path / "reconnect_play.py"
    play.write_text(PLAY, encoding="utf-8")
    rows = tmp_path / "domains.txt"
    rows.write_text("".join(f"site{i:05d}.example.fr\n" for i in range(KEYS)), encoding="utf-8")
    env = {"FAULTS_PROVIDER_URL": api.url, "FAULTS_RPS": str(RATE)}
    worker = servers.start_worker(
        tmp_path, "w0", play, "--input", rows, "--output", tmp_path / "w0.jsonl",
        "--db", own_postgres.url, "--concurrency", "16", env=env,
    )  # fmt: skip
    tick = threading.Event()
    try:
        _wait_items(api, KEYS // 10, worker)
        own_postgres.stop("fast")
        tick.wait(OUTAGE_S)
        own_postgres.start()
        back_at = time.monotonic()
        billed = int(api.stats().get("items", 0))
        while int(api.stats().get("items", 0)) <= billed:
            assert worker.poll() is None, "the worker exited during the outage"
            assert time.monotonic() - back_at < 60, "no request within 60 s of the server's return"
            tick.wait(0.02)
        gap_s = time.monotonic() - back_at
        code, log = servers.finish(worker, WORKER_TIMEOUT_S)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    print(f"first request {gap_s:.2f} s after PostgreSQL was back")
    assert code == 0, log[-6000:]
    assert gap_s < BACK_WITHIN_S, f"the first claim came {gap_s:.1f} s after the server was back"
    lines = servers.read_jsonl(tmp_path / "w0.jsonl")
    assert len(lines) == KEYS and all(line["error"] is None for line in lines)


def _wait_items(api: Any, n: int, worker: Any) -> None:
    tick = threading.Event()
    for _ in range(int(60 / 0.05)):
        if int(api.stats().get("items", 0)) >= n:
            return
        assert worker.poll() is None, "the worker exited before the outage"
        tick.wait(0.05)
    raise AssertionError(f"fewer than {n} items billed within 60 s")
