"""Sends of several worker processes sharing a Redis pacer, against a provider that bounds
the requests of every 0.2 s window: one worker stalls between its grants and its sends
(its receipt store locked for 0.5 s, or the process stopped for 0.22 s) while the other
goes on. Per-process spacing cannot see the other process: the stalled worker's late
requests and the other's fresh ones reached the provider together (past the window's
bound: 429s). A request leaves within its grant's slot or asks the shared pacer again.

Real processes, a Redis and a provider of this test's own; the provider counts (the most
requests within one window, its 429s); no timing is asserted.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.scenario

RATE = 100
"""The provider's bound per second (``RATE * WINDOW_S + BURST`` per window) and the play's
stated rate."""
WINDOW_S = 0.2
BURST = 6
"""The provider's slack per window: sends paced at the rate with a little jitter stay
within it."""
KEYS = 900
"""Rows per worker: the run lasts about 2 * KEYS / RATE seconds."""
STALLS = 4
"""Stalls of each kind."""
WORKER_TIMEOUT_S = 120.0

PLAY = """
import os

from actors import Pacing
from actors.http import http_tool

tools = [http_tool("lookup", os.environ["FAULTS_PROVIDER_URL"] + "/v1/lookup", provider="window-provider",
                   pacing=Pacing(rps=float(os.environ["FAULTS_RPS"])))]


def play(row, ctx):
    return ctx.tool("lookup", {"row": row})
"""


def test_a_stalled_worker_asks_again_instead_of_bunching_its_late_sends(
    tmp_path: Path, servers: Any, own_redis: Any, window_provider: Any
) -> None:
    api = window_provider("--rate", str(RATE), "--window", str(WINDOW_S), "--burst", str(BURST))
    play = tmp_path / "bunching_play.py"
    play.write_text(PLAY, encoding="utf-8")
    env = {"FAULTS_PROVIDER_URL": api.url, "FAULTS_RPS": str(RATE)}
    workers, dbs = [], []
    for i in range(2):
        rows = tmp_path / f"rows{i}.txt"
        rows.write_text("".join(f"w{i}-row{n:05d}\n" for n in range(KEYS)), encoding="utf-8")
        dbs.append(tmp_path / f"w{i}.db")
        workers.append(
            servers.start_worker(
                tmp_path,
                f"w{i}",
                play,
                "--input",
                rows,
                "--output",
                tmp_path / f"w{i}.jsonl",
                "--db",
                dbs[-1],
                "--pacer",
                f"{own_redis.url}?prefix=td-bunching&workers=2",
                "--concurrency",
                "32",
                env=env,
            )
        )
    tick = threading.Event()
    try:
        _wait_requests(api, RATE, workers)  # both running
        stalled = workers[0]
        for _ in range(STALLS):
            tick.wait(0.8)
            with sqlite3.connect(dbs[0], timeout=30) as lock:  # its receipts cannot be marked running
                lock.execute("BEGIN EXCLUSIVE")
                tick.wait(0.5)
                lock.rollback()
            tick.wait(0.8)
            os.kill(stalled.pid, signal.SIGSTOP)  # the whole process stalls
            tick.wait(0.22)
            os.kill(stalled.pid, signal.SIGCONT)
        done = [servers.finish(w, WORKER_TIMEOUT_S) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    for i, (code, log) in enumerate(done):
        assert code == 0, f"worker {i}:\n{log[-6000:]}"
    stats = api.stats()
    print(f"provider: {stats}")
    assert stats["rate_limited"] == 0, stats
    assert stats["max_in_window"] <= stats["limit"], stats


def _wait_requests(api: Any, n: int, workers: list[Any]) -> None:
    tick = threading.Event()
    for _ in range(int(60 / 0.05)):
        if int(api.stats().get("requests", 0)) >= n:
            return
        assert all(w.poll() is None for w in workers), "a worker exited before the stalls"
        tick.wait(0.05)
    raise AssertionError(f"fewer than {n} requests within 60 s")
