"""The report of a rerun after ``kill -9`` with batch requests in flight says what this run
did: the receipts its calls completed, members of the requests it took over from the
dead run and sent again included (not "reused from earlier runs", not "joined"), the
lookups the provider billed it and replayed for it (the example provider's own
counters), and the store agrees (every receipt completed under this run's id; its
``attempts`` the sends of its request: the dead run's and the rerun's). The rerun's first
calls take over a request whose other members no call has asked for yet (``--concurrency``
below the request's size): they ride along, and their rows' calls come later. Real
processes, real ``kill -9``, SQLite and Postgres, threads and gevent (the suite's runtime).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import uuid
from typing import Any

import pytest

pytestmark = pytest.mark.scenario

ROWS = 50
WAIT_S = 120.0
PROVIDER = "local-provider"
PG_URL = os.environ.get("TOOLDISPATCH_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
COLUMNS = ("key", "status", "lease_owner_run_id", "attempts")


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: Any, tmp_path: Any) -> Any:
    """(the --db of both runs, a reader of its receipts: rows of :data:`COLUMNS`)."""
    if request.param == "sqlite":
        path = str(tmp_path / "r.db")

        def read_sqlite() -> list[tuple[Any, ...]]:
            with sqlite3.connect(path) as conn:
                return conn.execute(f"select {', '.join(COLUMNS)} from receipts").fetchall()

        yield path, read_sqlite
        return
    try:
        import psycopg

        psycopg.connect(PG_URL, connect_timeout=3).close()
    except Exception as exc:  # ImportError or a connection error
        if os.environ.get("CI"):
            pytest.fail(f"Postgres at {PG_URL} unavailable ({exc})")
        pytest.skip(f"Postgres at {PG_URL} unavailable ({exc})")
    schema = f"td_test_{uuid.uuid4().hex[:12]}"

    def read_postgres() -> list[tuple[Any, ...]]:
        with psycopg.connect(PG_URL) as conn:
            return conn.execute(f'select {", ".join(COLUMNS)} from "{schema}".receipts').fetchall()

    try:
        yield f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={schema}", read_postgres
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _seen(stats: dict[str, Any]) -> int:
    """Requests the provider received: served, answered 429, replayed, answered 409."""
    names = ("requests", "rate_limited", "idempotent_replays", "idempotent_conflicts")
    return sum(int(stats.get(name, 0)) for name in names)


def test_cli_kill_9_rerun_report_counts_taken_over_members_as_completed_this_run(
    cli: Any, provider_factory: Any, domains: list[str], tmp_path: Any, db: Any
) -> None:
    url, read = db
    server = provider_factory("--latency", "2")
    rows = tmp_path / "domains.txt"
    rows.write_text("".join(f"{d}\n" for d in domains[:ROWS]), encoding="utf-8")
    env = cli.env(TOOLDISPATCH_PROVIDER_URL=server.url, COLUMNS="400")
    args = ["run", cli.examples / "domains_play.py", "--input", rows, "--db", url]

    with open(tmp_path / "killed.stderr", "w") as err:
        proc = subprocess.Popen(
            cli.command(*args, "--output", tmp_path / "killed.jsonl"), cwd=tmp_path, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
        try:  # killed while the provider serves its batch request(s)
            cli.poll_until(
                lambda: proc.poll() is not None or server.calls()["serving"] > 0,
                timeout_s=WAIT_S,
                what="the provider to serve the run's requests",
            )
            assert proc.poll() is None, (tmp_path / "killed.stderr").read_text()
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=WAIT_S) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # the provider's figures for the rerun alone: the dead run's requests answered first
    cli.poll_until(lambda: server.calls()["serving"] == 0, timeout_s=WAIT_S, what="the provider to answer")
    before = server.stats()
    taken = {key for key, status, _, _ in read() if status in ("queued", "running")}
    assert taken, "the killed run held no receipt"

    run_id = f"rerun-{uuid.uuid4().hex[:8]}"
    second = cli.run(
        *args, "--output", tmp_path / "second.jsonl", "--run-id", run_id, "--concurrency", "10",
        env=env, timeout_s=WAIT_S * 2,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    after = server.stats()
    receipts = read()
    assert len(receipts) == ROWS
    assert all(status == "completed" for _, status, _, _ in receipts), receipts
    mine = [r for r in receipts if r[2] == run_id]
    assert len(mine) == ROWS  # the dead run completed nothing; this one everything
    for key, _, _, attempts in receipts:  # sends of its request: the dead run's too
        if key in taken:
            assert attempts == 2, (key, attempts)
        else:
            assert attempts == 1, (key, attempts)

    report = cli.report(second.stderr)
    billed = int(after.get("items", 0)) - int(before.get("items", 0))
    replayed = int(after.get("replayed_items", 0)) - int(before.get("replayed_items", 0))
    assert replayed > 0  # the dead run's requests, sent again whole, replayed
    lookups = report[f"lookups {PROVIDER} answered (billable)"]
    assert lookups == f"{billed}" + (
        f" (and {replayed} replayed for a repeated Idempotency-Key, not billed)" if replayed else ""
    ), (lookups, before, after)
    seen = _seen(after) - _seen(before)
    limited = int(after.get("rate_limited", 0)) - int(before.get("rate_limited", 0))
    assert report[f"requests sent to {PROVIDER}"] == f"{seen} ({limited} answered 429)"
    assert report["receipts completed this run (calls that ran)"] == str(len(mine))
    assert report["reused from earlier runs"] == "0 receipts (0 calls)"
    assert report["reused within this run (calls)"] == "0"
    assert report["joined a lookup in flight (calls)"] == "0"
    assert report["rows"] == f"{ROWS} ({ROWS} ok, 0 failed)"
    per_tool = cli.tools_report(second.stderr)["inspect_domain"]
    assert per_tool["ran (receipt completed; local: runs)"] == ROWS
    assert per_tool["reused, earlier runs"] == 0 and per_tool["joined in flight"] == 0
    assert per_tool["lookups answered (billable)"] == billed
    assert per_tool["answers replayed (not billed)"] == replayed
    last = [line for line in second.stderr.splitlines() if line.startswith("progress: rows")][-1]
    assert f"| calls: {ROWS} ran, 0 reused, 0 joined, 0 failed |" in last, last
