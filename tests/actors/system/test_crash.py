"""Crashes and stops: a host killed with SIGKILL mid-run loses no completed result and
re-executes no more than what was in flight; a clean stop leaves nothing claimed.

The crash test runs a real host process (``_hosts/crash_host.py``) on a real SQLite
file, in the same runtime as this test run (``-m gevent.monkey`` under gevent).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import actors
from actors import CallCancelledError, DispatchSystem, Policy, RunInfo, Tool
from stores import SqliteReceiptStore

HOST = Path(__file__).parent / "_hosts" / "crash_host.py"
CALLS = 200
KILL_AFTER = CALLS // 2
STALL_AFTER = CALLS * 3 // 4  # provider calls after this hang in the first run: the kill lands mid-run
MAX_CONCURRENCY = 4  # as in the host
BATCH_SIZE = 1  # the host's tool is not batched
HOST_TIMEOUT_S = 60.0
WAIT_S = 15.0


def _host_command(runtime: str, *args: str) -> list[str]:
    prefix = [sys.executable, "-m", "gevent.monkey"] if runtime == "gevent" else [sys.executable]
    return [*prefix, str(HOST), *args]


def _host_env() -> dict[str, str]:
    """The host imports the same ``actors``/``stores`` as this test process."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(actors.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _start_host(runtime: str, db: Path, log: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        _host_command(runtime, str(db), str(log), "--calls", str(CALLS), *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_host_env(),
    )


def _watchdog(proc: subprocess.Popen[str]) -> threading.Timer:
    """Kill a host that hangs, so a broken dispatcher fails the test instead of hanging it."""
    timer = threading.Timer(HOST_TIMEOUT_S, proc.kill)
    timer.daemon = True
    timer.start()
    return timer


def _shut(*systems: DispatchSystem) -> None:
    """Stop each system, then close its store (a system never closes its store)."""
    for system in systems:
        system.stop()
        system.store.close()


def _log_keys(log: Path) -> list[str]:
    if not log.exists():
        return []
    return [line.split()[0] for line in log.read_text().splitlines() if line.strip()]


def _statuses(db: Path) -> dict[str, str]:
    conn = sqlite3.connect(str(db))
    try:
        return dict(conn.execute("SELECT key, status FROM receipts").fetchall())
    finally:
        conn.close()


@pytest.mark.scenario
def test_crash_sigkill_rerun_loses_nothing_and_reexecutes_only_in_flight(
    tmp_path: Path, runtime: str
) -> None:
    db, log = tmp_path / "receipts.db", tmp_path / "provider.log"

    # First run: killed with SIGKILL once half the results are back.
    killed_run = ["--run-id", "r1", "--signal-after", str(KILL_AFTER), "--stall-after", str(STALL_AFTER)]
    first = _start_host(runtime, db, log, *killed_run)
    timer = _watchdog(first)
    try:
        assert first.stdout is not None
        progress = first.stdout.readline()  # blocks until the host reports progress
        assert progress.strip() == f"PROGRESS {KILL_AFTER}", (progress, first.stderr and first.stderr.read())
        os.kill(first.pid, signal.SIGKILL)
        assert first.wait(timeout=WAIT_S) == -signal.SIGKILL
    finally:
        timer.cancel()
        first.kill()
        first.communicate()

    first_keys = _log_keys(log)
    after_kill = _statuses(db)
    completed_at_kill = {key for key, status in after_kill.items() if status == "completed"}
    in_flight_at_kill = set(first_keys) - completed_at_kill
    assert len(set(first_keys)) == len(first_keys), "the first run executed a key twice"
    assert KILL_AFTER <= len(completed_at_kill) <= STALL_AFTER
    assert completed_at_kill <= set(first_keys)
    assert len(in_flight_at_kill) <= MAX_CONCURRENCY * BATCH_SIZE

    # Rerun of the same run (attempt 2): waits out the dead host's leases, finishes.
    second = _start_host(runtime, db, log, "--run-id", "r1", "--run-attempt", "2")
    timer = _watchdog(second)
    try:
        out, err = second.communicate(timeout=HOST_TIMEOUT_S)
    finally:
        timer.cancel()
        second.kill()
    assert second.returncode == 0, err
    (result_line,) = [line for line in out.splitlines() if line.startswith("RESULT ")]
    results: dict[str, Any] = json.loads(result_line.removeprefix("RESULT "))

    # Every call completed, with the right value, and is stored.
    assert sorted(int(n) for n in results) == list(range(CALLS))
    for n, (_key, _execution, value) in results.items():
        assert value == {"n": int(n), "square": int(n) ** 2}
    final = _statuses(db)
    all_keys = {key for key, _, _ in results.values()}
    assert len(all_keys) == CALLS
    assert {final.get(key) for key in all_keys} == {"completed"}

    # No completed result lost: each was served from its receipt, not run again.
    execution = {key: kind for key, kind, _ in results.values()}
    assert {execution[key] for key in completed_at_kill} == {"cached"}
    assert {execution[key] for key in all_keys - completed_at_kill} == {"live"}

    # Provider executions: each key at most once per run, and in total no more than the
    # unique calls plus what was in flight at the kill.
    second_keys = _log_keys(log)[len(first_keys) :]
    assert Counter(second_keys).most_common(1)[0][1] == 1
    assert set(second_keys) == all_keys - completed_at_kill
    assert len(first_keys) + len(second_keys) <= CALLS + len(in_flight_at_kill)


def test_crash_clean_stop_leaves_no_receipt_claimed(tmp_path: Path) -> None:
    db = tmp_path / "receipts.db"
    started = threading.Event()
    never = threading.Event()
    provider_calls: list[int] = []
    lock = threading.Lock()

    def provider(inp: Any, ctx: Any) -> Any:
        with lock:
            provider_calls.append(inp["n"])
        started.set()
        never.wait(0.2)  # the provider works; stop() arrives meanwhile
        return {"n": inp["n"]}

    system = DispatchSystem.start(
        tools=[Tool(tool_id="enrich", fn=provider)],
        store=SqliteReceiptStore(str(db)),
        run=RunInfo(run_id="r1", org_id="acme", scope="stop"),
        policy=Policy(max_concurrency=2, lease_ttl_s=30.0),
    )
    futures = [system.proxy().execute("enrich", {"n": n}) for n in range(12)]
    try:
        assert started.wait(WAIT_S)
    finally:
        _shut(system)

    live, cancelled = [], []
    for future in futures:
        try:
            live.append(future.get(timeout=0))  # stop() returned: every call is settled
        except CallCancelledError as exc:
            cancelled.append(exc)
    assert live, "no call was running when stop() was called"
    assert cancelled, "every call had finished before stop(): nothing was cancelled"
    assert len(live) + len(cancelled) == len(futures)
    assert {r.execution for r in live} == {"live"}
    assert len(provider_calls) == len(live)

    statuses = Counter(_statuses(db).values())
    assert statuses["queued"] == 0
    assert statuses["running"] == 0
    assert statuses["completed"] == len(live)
    assert set(statuses) <= {"completed", "pending"}
