"""The hand-over between a shared pacer and the workers' local shares, under real worker
processes: 2 ``tooldispatch run`` workers share a Redis pacer (of this test's own) against
a provider that bounds the requests of every 0.2 s window; the test restarts Redis a few
times mid-run (each time empty, as a restart leaves it), and each time one worker's way
to it (a TCP proxy) stays cut for a second longer than the other's.

Each worker falls back to its share of the rate starting from what the shared bucket had
granted ahead (not a fresh, full bucket), the shares out of phase, and the first worker
back on Redis takes only the rest of the rate while the other is still local (before, it
took the whole rate for up to a second: 1.5x the provider's bound, 429s). Only the
provider's counts are asserted (no timing).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.scenario

RATE = 100
WINDOW_S = 0.2
BURST = 6
"""The provider's slack per window, as in ``test_pacer_bunching.py``."""
KEYS = 900
OUTAGES = 3
OUTAGE_S = 1.5
LATER_S = 1.2
"""How much longer worker 1 cannot reach Redis."""
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


def test_workers_hand_the_pacing_over_to_local_shares_and_back_within_the_rate(
    tmp_path: Path, servers: Any, own_redis: Any, window_provider: Any, report: Any
) -> None:
    api = window_provider("--rate", str(RATE), "--window", str(WINDOW_S), "--burst", str(BURST))
    play = tmp_path / "handover_play.py"
    play.write_text(PLAY, encoding="utf-8")
    env = {"FAULTS_PROVIDER_URL": api.url, "FAULTS_RPS": str(RATE)}
    workers, proxies = [], [servers.TcpProxy(own_redis.port) for _ in range(2)]
    for i in range(2):
        rows = tmp_path / f"rows{i}.txt"
        rows.write_text("".join(f"w{i}-row{n:05d}\n" for n in range(KEYS)), encoding="utf-8")
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
                tmp_path / f"w{i}.db",
                "--pacer",
                f"redis://127.0.0.1:{proxies[i].port}/0?prefix=td-handover&workers=2",
                "--concurrency",
                "32",
                env=env,
            )
        )
    tick = threading.Event()
    try:
        _wait_requests(api, 2 * RATE, workers)  # both running, each seen by the other
        for _ in range(OUTAGES):
            own_redis.stop()  # both workers lose it at once
            tick.wait(OUTAGE_S)
            proxies[1].cut()
            assert own_redis.start()  # worker 0 comes back first...
            tick.wait(LATER_S)
            proxies[1].mend()  # ...worker 1 later
            tick.wait(2.0)  # both back on Redis
        done = [servers.finish(w, WORKER_TIMEOUT_S) for w in workers]
    finally:
        for proxy in proxies:
            proxy.close()
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    for i, (code, log) in enumerate(done):
        assert code == 0, f"worker {i}:\n{log[-6000:]}"
        assert any(m.startswith("outage: pacer") for m in report(log)), log[-4000:]
    stats = api.stats()
    print(f"provider: {stats}")
    assert stats["rate_limited"] == 0, stats
    assert stats["max_in_window"] <= stats["limit"], stats


def _wait_requests(api: Any, n: int, workers: list[Any]) -> None:
    tick = threading.Event()
    for _ in range(int(60 / 0.05)):
        if int(api.stats().get("requests", 0)) >= n:
            return
        assert all(w.poll() is None for w in workers), "a worker exited before the outages"
        tick.wait(0.05)
    raise AssertionError(f"fewer than {n} requests within 60 s")
