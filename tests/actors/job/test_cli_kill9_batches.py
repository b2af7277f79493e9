"""Issue 26: ``tooldispatch run examples/domains_play.py`` killed with SIGKILL while batch
requests are in flight, then run again: the rerun sends every request the killed run may
have sent again whole, with the same members, under the same Idempotency-Key, so the
provider (``examples/provider.py``, 2 s of latency) answers it from its record and bills
no lookup twice. The rerun starts at once (the provider still serving the killed run's
requests: it answers 409 until they are done) or once the provider has stored its answers;
on SQLite and on Postgres. Real processes, real ``kill -9``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from typing import Any

import pytest

pytestmark = pytest.mark.scenario

ROWS = 400
WAIT_S = 120.0
PG_URL = os.environ.get("TOOLDISPATCH_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: Any, tmp_path: Any) -> Any:
    """The store the runs share: a SQLite file, or a postgresql:// URL of a fresh schema."""
    if request.param == "sqlite":
        yield str(tmp_path / "r.db")
        return
    try:
        import psycopg

        psycopg.connect(PG_URL, connect_timeout=3).close()
    except Exception as exc:  # ImportError or a connection error
        if os.environ.get("CI"):
            pytest.fail(f"Postgres at {PG_URL} unavailable ({exc})")
        pytest.skip(f"Postgres at {PG_URL} unavailable ({exc})")
    schema = f"td_test_{uuid.uuid4().hex[:12]}"
    try:
        yield f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.parametrize("rerun", ["at-once", "after-the-provider-answered"])
def test_cli_kill_9_with_batches_in_flight_rerun_pays_no_lookup_twice(
    cli: Any, provider_factory: Any, domains: list[str], tmp_path: Any, db: str, rerun: str
) -> None:
    server = provider_factory("--latency", "2")
    rows = tmp_path / "domains.txt"
    rows.write_text("".join(f"{d}\n" for d in domains[:ROWS]), encoding="utf-8")
    env = cli.env(TOOLDISPATCH_PROVIDER_URL=server.url)

    def args(out: str) -> list[Any]:
        return [
            "run",
            cli.examples / "domains_play.py",
            "--input",
            rows,
            "--db",
            db,
            "--output",
            tmp_path / out,
        ]

    with open(tmp_path / "killed.stderr", "w") as err:
        proc = subprocess.Popen(
            cli.command(*args("killed.jsonl")), cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
        try:  # killed while the provider serves batch requests of it, some answered before
            cli.poll_until(
                lambda: (
                    proc.poll() is not None
                    or (sum(server.calls()["billed"].values()) >= 100 and server.calls()["serving"] > 0)
                ),
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
    in_flight = server.calls()["serving"]
    if rerun != "at-once":
        cli.poll_until(
            lambda: server.calls()["serving"] == 0, timeout_s=WAIT_S, what="the provider to answer"
        )

    second = cli.run(*args("second.jsonl"), env=env, timeout_s=WAIT_S * 2)

    assert second.returncode == 0, second.stderr[-3000:]
    calls, stats = server.calls(), server.stats()
    twice = {item: n for item, n in calls["billed"].items() if n > 1}
    assert twice == {}, f"{len(twice)} lookups billed twice ({in_flight} requests in flight at the kill)"
    assert stats.get("idempotent_replays", 0) >= 1  # the killed run's requests, sent again, replayed
    out = cli.read_jsonl(tmp_path / "second.jsonl")
    assert [line["row"] for line in out] == domains[:ROWS]
    assert all(line["error"] is None for line in out), [line for line in out if line["error"]][:3]

    requests = stats["requests"]
    third = cli.run(*args("third.jsonl"), env=env, timeout_s=WAIT_S)
    assert third.returncode == 0, third.stderr[-3000:]
    assert server.stats()["requests"] == requests  # every receipt completed: nothing sent
