"""``tooldispatch run`` stopped by signals, holding large outputs, writing results JSON
cannot carry, and sharing a store with another run: nothing paid is lost, nothing is
paid twice, memory stays bounded. Real provider and CLI processes, real signals."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import threading
import time

import pytest

pytestmark = pytest.mark.scenario

STOP_TIMEOUT_S = 120.0
TLDS = ("fr", "de", "it", "es", "nl", "se", "pl", "jp", "com", "org")
BILLED = "receipts completed this run (calls that ran)"


def _made_up_domains(n: int) -> list[str]:
    """Domain names nobody has seen (not the shared list): host0.fr, host1.de, ..."""
    return [f"host{i}.{TLDS[i % len(TLDS)]}" for i in range(n)]


def _receipts(db) -> dict[str, tuple[int, int]]:
    """status -> (receipts, receipts under a lease that has not expired); {} before the
    store exists (read-only: never creates it)."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    except sqlite3.OperationalError:
        return {}
    try:
        rows = conn.execute(
            "select status, count(*), sum(coalesce(lease_expires_at > ?, 0)) from receipts group by status",
            (time.time(),),
        ).fetchall()
    except sqlite3.OperationalError:  # not made yet
        return {}
    finally:
        conn.close()
    return {status: (n, int(leased or 0)) for status, n, leased in rows}


def _fresh_request(server, seen: list[int]) -> bool:
    """Whether a request reached the provider since the last look and is still being
    served: with its latency of seconds, it is in flight for a while yet (a signal now
    finds a request to wait for: a first one no longer waits for anything else)."""
    calls = server.calls()
    received = sum(calls["received"].values())
    fresh = bool(seen) and received > seen[-1] and calls["serving"] > 0
    seen.append(received)
    return fresh


def _paid(log) -> int:
    return len(log.read_text().split()) if log.exists() else 0


def _start(cli, args, env, err_path, cwd):
    err = open(err_path, "w")  # noqa: SIM115 - closed by the caller's finally
    proc = subprocess.Popen(
        cli.command(*args), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err
    )
    return proc, err


def _finish(proc, err):
    try:
        return proc.wait(timeout=STOP_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()


@pytest.mark.parametrize("runtime", ["threads", "gevent"])
def test_cli_sigterm_is_a_first_ctrl_c_report_flushed_output_and_a_free_resume(
    cli, provider_factory, tmp_path, runtime
):
    domains = _made_up_domains(3000)
    rows = tmp_path / "domains.txt"
    rows.write_text("".join(f"{d}\n" for d in domains), encoding="utf-8")
    server = provider_factory("--latency", "0.1")
    db, out, err_path = tmp_path / "r.db", tmp_path / "out.jsonl", tmp_path / "first.stderr"
    args = ("run", cli.examples / "domains_play.py", "--input", rows, "--db", db, "--output", out)
    args += ("--runtime", runtime)
    env = cli.env(TOOLDISPATCH_PROVIDER_URL=server.url)

    proc, err = _start(cli, args, env, err_path, tmp_path)
    try:
        cli.poll_until(
            lambda: proc.poll() is not None or server.stats().get("items", 0) >= len(domains) // 3,
            timeout_s=STOP_TIMEOUT_S,
            what="the provider to serve a third of the lookups",
        )
        assert proc.poll() is None, err_path.read_text()
        proc.send_signal(signal.SIGTERM)
    finally:
        code = _finish(proc, err)
    first = err_path.read_text()
    # a request still being served counts once it is answered: read the bill after that
    cli.poll_until(
        lambda: server.calls()["serving"] == 0, timeout_s=STOP_TIMEOUT_S, what="the provider to idle"
    )

    assert code == 130, first[-3000:]
    assert "interrupted (SIGTERM)" in first
    report = cli.report(first)
    assert report["status"].startswith("interrupted")
    written = cli.read_jsonl(out)
    assert 0 < len(written) < len(domains)
    assert first.strip().splitlines()[-1].startswith(f"interrupted: {out} holds only the {len(written)} rows")
    assert int(report[BILLED]) == server.stats()["items"]  # every lookup paid for was stored
    # nothing left queued or running: a receipt is a paid result stored, or a call claimed
    # but refused before it was sent (a batch the signal came between claim and send),
    # released to pending with no lease, for the resume to claim
    receipts = _receipts(db)
    assert receipts["completed"] == (int(report[BILLED]), 0), receipts
    assert set(receipts) <= {"completed", "pending"}, receipts
    assert receipts.get("pending", (0, 0))[1] == 0, receipts

    second = cli.run(*args, env=env)

    assert second.returncode == 0, second.stderr[-3000:]
    assert len(cli.read_jsonl(out)) == len(domains)
    with sqlite3.connect(db) as conn:
        unique = conn.execute("select count(*) from receipts where status = 'completed'").fetchone()[0]
    assert server.stats()["items"] == unique  # over both runs, each lookup paid once
    # a pending receipt was never sent: the resume replays no request the provider had served
    assert server.stats().get("replayed_items", 0) == 0, server.stats()


@pytest.mark.parametrize("runtime", ["threads", "gevent"])
def test_cli_second_signal_aborts_at_once_after_releasing_every_unsent_receipt(
    cli, provider_factory, tmp_path, runtime
):
    domains = _made_up_domains(120)
    rows = tmp_path / "domains.txt"
    rows.write_text("".join(f"{d}\n" for d in domains), encoding="utf-8")
    # requests take 3 s: the abort comes while some are in flight (the first signal
    # refuses every call not yet sent, and then waits only for those)
    server = provider_factory("--rate", "4", "--burst", "1", "--latency", "3")
    db, err_path = tmp_path / "r.db", tmp_path / "run.stderr"
    args = (
        "run",
        cli.examples / "domains_play.py",
        "--input",
        rows,
        "--db",
        db,
        "--output",
        tmp_path / "o.jsonl",
    )
    args += ("--runtime", runtime)
    # one request per call, paced at the provider's 4/s: most receipts wait, claimed, to be sent
    env = cli.env(TOOLDISPATCH_PROVIDER_URL=server.url, TOOLDISPATCH_BATCH="0", TOOLDISPATCH_PROVIDER_RPS="4")

    proc, err = _start(cli, args, env, err_path, tmp_path)
    try:
        seen: list[int] = []
        cli.poll_until(
            lambda: (
                proc.poll() is not None
                or (server.stats().get("requests", 0) >= 2 and _fresh_request(server, seen))
            ),
            timeout_s=STOP_TIMEOUT_S,
            what="the first requests, and one in flight",
        )
        # read before the first signal: that one releases them already (it refuses every call
        # not yet sent); the abort must leave none of them claimed either
        held = _receipts(db).get("queued", (0, 0))[1]
        proc.send_signal(signal.SIGTERM)
        cli.poll_until(
            lambda: proc.poll() is not None or "interrupted (SIGTERM)" in err_path.read_text(),
            timeout_s=STOP_TIMEOUT_S,
            what="the first signal to be handled",
        )
        assert proc.poll() is None, err_path.read_text()
        proc.send_signal(signal.SIGTERM)
    finally:
        code = _finish(proc, err)
    text = err_path.read_text()

    assert code == 130, text[-3000:]
    assert "aborted: receipts not yet sent were released" in text
    assert "Traceback" not in text, text[-3000:]  # gevent: a thread started in the hub raised
    after = _receipts(db)
    assert held > 0  # there were claimed, unsent receipts to release
    assert after.get("queued", (0, 0)) == (0, 0), after  # released, not left under a lease
    sent = after.get("running", (0, 0))[0] + after.get("completed", (0, 0))[0]
    assert sent <= server.stats().get("requests", 0), (after, server.stats())


BIG_PLAY = """
import threading

from actors import Tool

ROWS = {rows}
others_done = threading.Event()
lock = threading.Lock()
finished = [0]


def big(input, ctx):
    return {{"n": input["n"], "blob": "x" * (1 << 20)}}


tools = [Tool(tool_id="big", fn=big, durable=False)]


def play(row, ctx):
    n = int(row)
    if n == 0:  # the slow row: it ends only once every later row has finished
        assert others_done.wait(120), "the other rows did not finish"
        return {{"n": 0}}
    result = ctx.tool("big", {{"n": n}})
    with lock:
        finished[0] += 1
        if finished[0] == ROWS - 1:
            others_done.set()
    return result
"""


def test_cli_output_buffer_is_bounded_by_bytes_behind_one_slow_row(cli, tmp_path):
    rows_n = 64  # 63 outputs of 1 MiB finish while row 0 runs
    play = tmp_path / "big_play.py"
    play.write_text(BIG_PLAY.format(rows=rows_n), encoding="utf-8")
    rows = tmp_path / "numbers.txt"
    rows.write_text("".join(f"{n}\n" for n in range(rows_n)), encoding="utf-8")
    out = tmp_path / "out.jsonl"

    done = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db", "--output", out)

    assert done.returncode == 0, done.stderr[-3000:]
    held = cli.report(done.stderr)["rows waiting for an earlier row"]
    figures = re.fullmatch(r"([\d.]+) MiB in memory at most, ([\d.]+) MiB on disk", held)
    assert figures, held
    memory_mib, disk_mib = map(float, figures.groups())
    assert memory_mib <= 16.0  # the stated bound
    assert disk_mib >= 1.0  # the rest waited on disk (how much depends on when row 0 ends)
    with open(out, "rb") as fh:
        indexes = [json.loads(line)["index"] for line in fh]
    assert indexes == list(range(rows_n))  # still in input order
    assert not list(tmp_path.glob(".tooldispatch-spill-*"))


ODD_PLAY = """
from actors import Tool

tools = [Tool(tool_id="echo", fn=lambda input, ctx: input, durable=False)]


def play(row, ctx):
    ctx.tool("echo", {"row": row})
    if row == "big":
        return {"n": 2 ** 70}
    if row == "cut":
        return {"snippet": "caf\\ud83d"}
    if row == "set":
        return {"tags": {1, 2}}
    return {"row": row}
"""


def test_cli_a_result_that_cannot_be_written_fails_its_row_alone(cli, tmp_path):
    play = tmp_path / "odd_play.py"
    play.write_text(ODD_PLAY, encoding="utf-8")
    rows = tmp_path / "rows.txt"
    rows.write_text("a\nbig\ncut\nset\nz\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"

    done = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db", "--output", out)

    assert done.returncode == 1, done.stderr[-3000:]  # one row failed; the run went on
    lines = cli.read_jsonl(out)
    assert [line["index"] for line in lines] == [0, 1, 2, 3, 4]
    assert lines[1]["result"] == {"n": 2**70}  # written exactly
    assert lines[2]["result"] == {"snippet": "caf\ud83d"}  # the lone surrogate kept, escaped
    assert lines[3]["result"] is None and lines[3]["error"].startswith("ResultNotWritableError")
    assert lines[4]["result"] == {"row": "z"}
    assert cli.report(done.stderr)["rows"] == "5 (4 ok, 1 failed)"


def test_cli_waits_on_another_live_run_are_shown(cli, provider_factory, tmp_path):
    domains = _made_up_domains(200)
    rows = tmp_path / "domains.txt"
    rows.write_text("".join(f"{d}\n" for d in domains), encoding="utf-8")
    # the first run's requests take 5 s, so the second run's waits on them span at least
    # one plain progress line (one every 2 s); with 2 s, a loaded machine could start the
    # second run late enough that no line fell inside its waits
    server = provider_factory("--latency", "5")
    db = tmp_path / "r.db"
    env = cli.env(TOOLDISPATCH_PROVIDER_URL=server.url)
    play = cli.examples / "domains_play.py"

    first, err = _start(cli, ("run", play, "--input", rows, "--db", db), env, tmp_path / "a.stderr", tmp_path)
    try:
        cli.poll_until(
            lambda: first.poll() is not None or _receipts(db).get("running", (0, 0))[1] > 0,
            timeout_s=STOP_TIMEOUT_S,
            what="the first run to hold running receipts",
        )
        second = cli.run("run", play, "--input", rows, "--db", db, env=env)
    finally:
        _finish(first, err)

    assert second.returncode == 0, second.stderr[-3000:]
    report = cli.report(second.stderr)
    # a missing row is a failure, never a skip: it would hide a regression (issue 9, 4b(c))
    assert "waited on another run (calls)" in report, f"no owner-wait row in the report: {report}"
    assert int(report["waited on another run (calls)"]) > 0
    assert "waiting on another run" in second.stderr  # in the progress line


PAID_PLAY = """
import fcntl, os, threading

from actors import Tool

LOG = os.environ["PAID_LOG"]


def fn(input, ctx):
    threading.Event().wait(0.2)  # the provider's latency
    with open(LOG, "a") as log:  # paid: the provider ran it
        fcntl.flock(log, fcntl.LOCK_EX)
        log.write(input["k"] + "\\n")
    return {"k": input["k"]}


tools = [Tool(tool_id="paid", fn=fn)]


def play(row, ctx):
    return ctx.tool("paid", {"k": row})
"""


def _in_flight(seen: dict[str, tuple[int, int]]) -> int:
    """Receipts running under a live lease: their calls are sent (or about to be) and will be
    paid, whatever the store does. A claimed receipt still ``queued`` is not counted: it waits
    for a write (marking it running) before it is sent."""
    return seen.get("running", (0, 0))[1]


def _lock_with_calls_in_flight(cli, proc, db, locker, at_least: int) -> int:
    """Take the receipt file's write lock (``BEGIN IMMEDIATE``, held by ``locker``) at a moment
    when ``at_least`` calls are claimed and unfinished; return how many results will have
    been paid once they all finish (completed receipts + those in flight). No claim or
    completion commits while the lock is held, so that number is fixed when it is read."""
    for _ in range(50):
        cli.poll_until(
            lambda: proc.poll() is not None or _in_flight(_receipts(db)) >= at_least,
            timeout_s=STOP_TIMEOUT_S, what=f"{at_least} calls in flight",
        )  # fmt: skip
        locker.execute("BEGIN IMMEDIATE")
        seen = _receipts(db)
        in_flight = _in_flight(seen)
        if in_flight >= at_least or proc.poll() is not None:
            return seen.get("completed", (0, 0))[0] + in_flight
        locker.execute("ROLLBACK")  # the calls finished meanwhile: try again
    raise AssertionError(f"never {at_least} calls in flight when the lock was taken")


def _assert_every_paid_result_kept(paid_log, db) -> None:
    """Every result the provider was paid for (its log) is stored or in the salvage file."""
    paid = set(paid_log.read_text().split())
    with sqlite3.connect(db) as conn:
        outputs = conn.execute("select output from receipts where status = 'completed'").fetchall()
    stored = {json.loads(o)["k"] for (o,) in outputs}
    salvage = db.parent / (db.name + ".salvage.jsonl")
    lines = salvage.read_text().splitlines() if salvage.exists() else []
    kept = {json.loads(line)["output"]["k"] for line in lines if line.strip()}
    assert paid <= stored | kept, f"paid and lost: {sorted(paid - stored - kept)[:10]} ({len(paid)} paid)"


def test_cli_second_signal_while_the_store_is_locked_keeps_every_paid_result(cli, tmp_path):
    """Another process holds the receipt file's write lock, so results wait to be stored;
    two signals abort the run. Every result the provider was paid for must be stored or in
    the salvage file when the process has exited (the stop's own bound comes before the
    abort's). The lock is taken while calls are in flight, and the signals come once each
    of them was paid, so their results are all waiting on the lock."""
    play, rows, db = tmp_path / "paid_play.py", tmp_path / "rows.txt", tmp_path / "r.db"
    play.write_text(PAID_PLAY, encoding="utf-8")
    rows.write_text("".join(f"row{i}\n" for i in range(300)), encoding="utf-8")
    paid_log, err_path = tmp_path / "paid.log", tmp_path / "run.stderr"
    env = cli.env(PAID_LOG=str(paid_log))
    args = ("run", play, "--input", rows, "--output", tmp_path / "o.jsonl", "--db", db, "--concurrency", "8")
    proc, err = _start(cli, args, env, err_path, tmp_path)
    locker = None
    try:
        cli.poll_until(
            lambda: proc.poll() is not None or _receipts(db).get("completed", (0, 0))[0] >= 16,
            timeout_s=STOP_TIMEOUT_S, what="the first results to be stored",
        )  # fmt: skip
        locker = sqlite3.connect(db, isolation_level=None, timeout=30, check_same_thread=False)
        held = _lock_with_calls_in_flight(cli, proc, db, locker, at_least=4)  # another worker's long write
        # every call claimed before the lock is paid, and its result waits on the lock
        cli.poll_until(
            lambda: proc.poll() is not None or len(paid_log.read_text().split()) >= held,
            timeout_s=STOP_TIMEOUT_S, what="results paid while the store is locked",
        )  # fmt: skip
        proc.send_signal(signal.SIGINT)
        cli.poll_until(
            lambda: proc.poll() is not None or "interrupted" in err_path.read_text(),
            timeout_s=STOP_TIMEOUT_S, what="the first signal to be handled",
        )  # fmt: skip
        proc.send_signal(signal.SIGINT)
        code = _finish(proc, err)
    finally:
        if proc.poll() is None:
            proc.kill()
        if locker is not None:
            locker.execute("ROLLBACK")
            locker.close()
    text = err_path.read_text()
    assert code == 130, text[-3000:]
    _assert_every_paid_result_kept(paid_log, db)


SLOW_PAID_PLAY = PAID_PLAY.replace(
    "threading.Event().wait(0.2)",
    'threading.Event().wait(0.05 if input["k"] in ("row0", "row1", "row2", "row3") else 1.0)',
).replace('Tool(tool_id="paid", fn=fn)', 'Tool(tool_id="paid", fn=fn, timeout_s=1.5)')


def test_cli_second_signal_while_the_run_is_already_stopping_keeps_every_paid_result(cli, tmp_path):
    """Four rows' results are stored; then another process locks the receipt file, and the
    other eight calls are paid (at 1 s) while their writes wait on it. Their callers are
    answered at the 1.5 s timeout, the rows end and the run is in its own final stop (a
    60 s bound) when two signals abort it. The abort's stop found a stop under way and
    returned at once, and the process exited with the held results lost (breaker); it now
    waits for that stop within its own bound, and salvages what is still held."""
    play, rows, db = tmp_path / "paid_play.py", tmp_path / "rows.txt", tmp_path / "r.db"
    assert SLOW_PAID_PLAY != PAID_PLAY and "timeout_s=1.5" in SLOW_PAID_PLAY
    play.write_text(SLOW_PAID_PLAY, encoding="utf-8")
    rows.write_text("".join(f"row{i}\n" for i in range(12)), encoding="utf-8")
    paid_log, err_path = tmp_path / "paid.log", tmp_path / "run.stderr"
    env = cli.env(PAID_LOG=str(paid_log))
    args = ("run", play, "--input", rows, "--output", tmp_path / "o.jsonl", "--db", db, "--concurrency", "12")
    proc, err = _start(cli, args, env, err_path, tmp_path)
    locker = None
    try:
        cli.poll_until(
            lambda: proc.poll() is not None or _receipts(db).get("completed", (0, 0))[0] >= 4,
            timeout_s=STOP_TIMEOUT_S, what="the fast rows' results to be stored",
        )  # fmt: skip
        locker = sqlite3.connect(db, isolation_level=None, timeout=30, check_same_thread=False)
        locker.execute("BEGIN IMMEDIATE")
        stored_before = _receipts(db).get("completed", (0, 0))[0]
        cli.poll_until(
            lambda: proc.poll() is not None or _paid(paid_log) == 12,
            timeout_s=STOP_TIMEOUT_S, what="every row to be paid",
        )  # fmt: skip
        threading.Event().wait(2.0)  # the callers' 1.5 s timeouts pass: the rows end, the stop begins
        assert proc.poll() is None, err_path.read_text()[-2000:]
        proc.send_signal(signal.SIGINT)
        threading.Event().wait(0.5)
        proc.send_signal(signal.SIGINT)
        code = _finish(proc, err)
    finally:
        if proc.poll() is None:
            proc.kill()
        if locker is not None:
            locker.execute("ROLLBACK")
            locker.close()
    assert stored_before < 12  # some paid results were waiting on the lock
    assert code in (1, 130), err_path.read_text()[-3000:]
    _assert_every_paid_result_kept(paid_log, db)
