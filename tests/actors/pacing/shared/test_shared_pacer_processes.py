"""Real worker processes pacing one (org, provider) through one Redis.

Each worker is ``_hosts/pacer_worker.py`` (under gevent monkey-patching in the gevent
run), driven line by line over stdin. Counts are checked against the bound a shared
pacer guarantees (rate x elapsed + burst), never against a timing.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import RedisServer

pytestmark = pytest.mark.scenario

HOST = Path(__file__).parent / "_hosts" / "pacer_worker.py"
WAIT_S = 30.0


class Worker:
    """One worker process; :meth:`ask` sends a command and returns its JSON answer."""

    def __init__(self, runtime: str, *args: str, host: Path = HOST) -> None:
        prefix = [sys.executable, "-m", "gevent.monkey"] if runtime == "gevent" else [sys.executable]
        self.proc = subprocess.Popen(
            [*prefix, str(host), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def answer(self, timeout_s: float = WAIT_S) -> dict[str, Any]:
        try:
            return dict(json.loads(self.lines.get(timeout=timeout_s)))
        except queue.Empty:
            raise AssertionError(f"worker {self.proc.pid} did not answer (exit {self.proc.poll()})") from None

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def ask(self, command: str) -> dict[str, Any]:
        self.send(command)
        return self.answer()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(WAIT_S)


@pytest.fixture
def start_workers(runtime: str, redis_server: RedisServer, prefix: str) -> Iterator[Any]:
    """``start_workers(n, rate, burst)``: n ready worker processes on one bucket."""
    started: list[Worker] = []

    def start(n: int, rate: float, burst: float) -> list[Worker]:
        url = f"{redis_server.url}?prefix={prefix}"
        workers = [Worker(runtime, url, str(rate), str(burst)) for _ in range(n)]
        started.extend(workers)
        for w in workers:
            assert w.answer() == {"ready": True}
        return workers

    yield start
    for w in started:
        w.stop()


def test_four_processes_stay_within_the_shared_rate(start_workers: Any) -> None:
    rate, burst, run_s = 50.0, 5.0, 3.0
    workers = start_workers(4, rate, burst)
    began = time.monotonic()
    for w in workers:
        w.send(f"run {run_s}")
    answers = [w.answer() for w in workers]
    elapsed = time.monotonic() - began
    total = sum(a["grants"] for a in answers)
    assert not any(a["degraded"] for a in answers)
    assert total <= rate * elapsed + burst, f"{total} grants in {elapsed:.2f} s at {rate}/s"
    assert all(a["grants"] > 0 for a in answers)  # each worker was paced, none starved out


def test_one_processs_pause_holds_every_process(start_workers: Any) -> None:
    workers = start_workers(4, 100.0, 5.0)
    assert workers[0].ask("pause 30")["pause_s"] > 29  # its 429 said Retry-After: 30
    answers = [w.ask("take") for w in workers[1:]]
    assert [a["verdict"] for a in answers] == ["paused"] * 3
    assert all(a["granted"] == 0 and a["wait_s"] > 20 for a in answers)
