"""``tooldispatch run`` aborted by a second signal (issue 26, defect 4): rows whose calls
the abort cancelled unsent are not done, so they are neither written as failures nor
counted; the report is printed all the same, the last line says what the output holds,
and a rerun completes exactly the rows that are missing. When a row does not end in
time, the abort prints its own short report before it exits.

Real processes (the CLI, ``examples/provider.py``), real signals, SQLite files.
"""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess

import pytest

pytestmark = pytest.mark.scenario

STOP_TIMEOUT_S = 120.0
TLDS = ("fr", "de", "it", "es", "nl", "se", "pl", "jp", "com", "org")
BILLED = "receipts completed this run (calls that ran)"
CUT = "rows cut short by the abort (not written)"


def _made_up_domains(n: int) -> list[str]:
    return [f"host{i}.{TLDS[i % len(TLDS)]}" for i in range(n)]


def _start(cli, args, env, err_path, cwd):
    err = open(err_path, "w")  # noqa: SIM115 - closed by _finish
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


def _completed(db) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute("select count(*) from receipts where status = 'completed'").fetchone()[0]


def _fresh_request(server, seen: list[int]) -> bool:
    """Whether a request reached the provider since the last look and is still being
    served: with its latency of seconds, it is in flight for a while yet (a signal now
    finds a request to wait for: a first one no longer waits for anything else)."""
    calls = server.calls()
    received = sum(calls["received"].values())
    fresh = bool(seen) and received > seen[-1] and calls["serving"] > 0
    seen.append(received)
    return fresh


def _last_progress_rows(text: str) -> int:
    """Rows done as the last progress line counted them."""
    counts = re.findall(r"^progress: rows (\d+)/", text, flags=re.MULTILINE)
    assert counts, text[-3000:]
    return int(counts[-1])


@pytest.mark.parametrize("runtime", ["threads", "gevent"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cli_two_quick_signals_write_no_cancelled_row_report_and_a_rerun_completes_it(
    cli, provider_factory, tmp_path, runtime, sig
):
    domains = _made_up_domains(1500)
    rows = tmp_path / "domains.txt"
    rows.write_text("".join(f"{d}\n" for d in domains), encoding="utf-8")
    server = provider_factory("--latency", "3")  # the abort comes while requests are in flight
    db, out, err_path = tmp_path / "r.db", tmp_path / "out.jsonl", tmp_path / "first.stderr"
    args = ("run", cli.examples / "domains_play.py", "--input", rows, "--db", db, "--output", out)
    args += ("--runtime", runtime)
    env = cli.env(TOOLDISPATCH_PROVIDER_URL=server.url)

    proc, err = _start(cli, args, env, err_path, tmp_path)
    try:
        seen: list[int] = []
        cli.poll_until(
            lambda: proc.poll() is not None
            or (server.stats().get("items", 0) >= 300 and _fresh_request(server, seen)),
            timeout_s=STOP_TIMEOUT_S, what="the provider to serve the first lookups, and a request in flight",
        )  # fmt: skip
        assert proc.poll() is None, err_path.read_text()
        proc.send_signal(sig)
        threading_wait(0.1)  # the second signal, 0.1 s later: calls are queued, unsent
        proc.send_signal(sig)
    finally:
        code = _finish(proc, err)
    first = err_path.read_text()

    assert code == 130, first[-3000:]
    assert "Traceback" not in first, first[-3000:]
    written = cli.read_jsonl(out)
    assert 0 < len(written) < len(domains)
    assert [line["error"] for line in written if line["error"]] == []  # no row written as a failure
    assert len({line["index"] for line in written}) == len(written)
    report = cli.report(first)  # the report, aborted or not
    assert report["status"].startswith("aborted"), report
    assert report["rows"] == f"{len(written)} ({len(written)} ok, 0 failed)"
    assert int(report.get(CUT, "0").split()[0]) > 0, report  # the abort did cut rows short
    assert _last_progress_rows(first) == len(written)  # the cut rows were not counted done
    last = first.strip().splitlines()[-1]
    assert last.startswith("aborted: receipts not yet sent were released; "), last
    assert f"{out} holds only the {len(written)} rows finished before the abort" in last
    billed_first = int(report[BILLED])

    second = cli.run(*args, env=env)

    assert second.returncode == 0, second.stderr[-3000:]
    lines = cli.read_jsonl(out)
    assert [line["index"] for line in lines] == list(range(len(domains)))
    assert [line["error"] for line in lines if line["error"]] == []
    unique = _completed(db)
    assert billed_first + int(cli.report(second.stderr)[BILLED]) == unique  # only the missing calls paid
    assert server.stats()["items"] == unique  # over both runs, each lookup paid once


HANG_PLAY = """
import os, threading

from actors import Tool

LOG = os.environ["PAID_LOG"]
hung = threading.Event()


class LookupFailed(Exception):
    pass


def lookup(input, ctx):
    threading.Event().wait(0.05)
    with open(LOG, "a") as log:
        log.write(input["k"] + "\\n")
    return {"k": input["k"]}


tools = [Tool(tool_id="lookup", fn=lookup)]


def play(row, ctx):
    if row == "row5":  # never ends by itself: not a dispatcher call, the abort cannot end it
        threading.Event().wait(600)
    try:
        return ctx.tool("lookup", {"k": row})
    except Exception as exc:  # a play that wraps what its calls raise
        raise LookupFailed(f"lookup of {row} failed") from exc
"""


def test_cli_abort_with_a_row_that_never_ends_prints_its_own_short_report(cli, tmp_path):
    play, rows, db = tmp_path / "hang_play.py", tmp_path / "rows.txt", tmp_path / "r.db"
    play.write_text(HANG_PLAY, encoding="utf-8")
    rows.write_text("".join(f"row{i}\n" for i in range(400)), encoding="utf-8")
    out, paid, err_path = tmp_path / "o.jsonl", tmp_path / "paid.log", tmp_path / "run.stderr"
    args = ("run", play, "--input", rows, "--output", out, "--db", db, "--concurrency", "16")
    env = cli.env(PAID_LOG=str(paid))
    proc, err = _start(cli, args, env, err_path, tmp_path)
    try:
        cli.poll_until(
            lambda: proc.poll() is not None or (paid.exists() and len(paid.read_text().split()) >= 40),
            timeout_s=STOP_TIMEOUT_S, what="the first calls to be paid",
        )  # fmt: skip
        proc.send_signal(signal.SIGINT)
        threading_wait(0.1)
        proc.send_signal(signal.SIGINT)
    finally:
        code = _finish(proc, err)
    text = err_path.read_text()

    assert code == 130, text[-3000:]
    report = cli.report(text)  # printed by the abort itself: row5 never ended
    assert report["status"].startswith("aborted"), text[-3000:]
    written = cli.read_jsonl(out)
    assert [line["error"] for line in written if line["error"]] == []  # none cut short, none hung
    assert "row5" not in {line["row"] for line in written}
    last = text.strip().splitlines()[-1]
    assert f"{out} holds only the {len(written)} rows finished before the abort" in last, last


def threading_wait(seconds: float) -> None:
    """Let ``seconds`` pass (an Event that nobody sets: gevent-friendly)."""
    import threading

    threading.Event().wait(seconds)
