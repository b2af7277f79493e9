"""``tooldispatch run`` end to end: the real domain list, a real provider process, real
SQLite receipts; a live run, a free rerun, and an interrupted run that resumes."""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.scenario

HALF_RUN_TIMEOUT_S = 120.0
BILLED = "receipts completed this run (calls that ran)"


def _receipt_counts(db: Path) -> dict[tuple[str, str], int]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "select tool_id, status, count(*) from receipts group by tool_id, status"
        ).fetchall()
    return {(tool, status): n for tool, status, n in rows}


def _check_output(lines: list[dict[str, Any]], domains: list[str]) -> int:
    """Assert one line per domain, in input order, each with its result; return the
    number of distinct countries looked up (the ``country`` tool's unique calls)."""
    assert len(lines) == len(domains)
    countries = set()
    for i, (line, domain) in enumerate(zip(lines, domains, strict=True)):
        assert line["index"] == i
        assert line["row"] == domain
        assert line["error"] is None, line
        assert line["result"]["domain"] == domain.lower()
        assert line["result"]["tld"] == domain.lower().rsplit(".", 1)[-1]
        if line["result"]["country"] is not None:
            countries.add(line["result"]["country"])
    return len(countries)


def test_cli_run_domains_first_run_live_second_run_cached(cli, provider, domains, tmp_path):
    db, out = tmp_path / "receipts.db", tmp_path / "domains.out.jsonl"
    args = ("run", cli.examples / "domains_play.py", "--input", cli.domains_file, "--db", db, "--output", out)
    env = cli.env(TOOLDISPATCH_PROVIDER_URL=provider.url)
    assert len(domains) == 10_000

    first = cli.run(*args, env=env)

    assert first.returncode == 0, first.stderr[-4000:]
    assert "Traceback" not in first.stderr
    assert "tooldispatch run report" in first.stderr
    countries = _check_output(cli.read_jsonl(out), domains)
    assert countries > 0
    unique_calls = len(set(domains)) + countries
    assert _receipt_counts(db) == {
        ("inspect_domain", "completed"): len(set(domains)),
        ("country", "completed"): countries,
    }
    served = provider.stats()
    assert served["requests"] > 0
    assert served["items"] == unique_calls  # every unique call paid exactly once
    assert served["requests"] * 20 <= len(domains), served  # batched: far fewer requests than rows
    assert served.get("rate_limited", 0) == 0
    report = cli.report(first.stderr)
    assert report["rows"] == "10000 (10000 ok, 0 failed)"
    # the headline answers the paying user: requests sent, lookups billed, reuse
    assert report["requests sent to local-provider"] == f"{served['requests']} (0 answered 429)"
    # how the provider was paced, as stats()["pacing"] says (the README promises it here)
    assert re.match(r"(stated|aimd|slow_start|plateau|probe): [\d.]+/s", report["pacing of local-provider"])
    assert int(report[BILLED]) == unique_calls == served["items"]
    assert report["reused from earlier runs"] == "0 receipts (0 calls)"
    assert report["calls failed"] == "0"
    per_tool = cli.tools_report(first.stderr)
    assert per_tool["inspect_domain"]["calls"] == len(domains)
    for tool, counts in per_tool.items():  # each call is billed, joined or reused, once
        parts = (
            "ran (receipt completed; local: runs)",
            "joined in flight",
            "reused this run",
            "reused, earlier runs",
            "failed",
        )
        assert counts["calls"] == sum(counts[p] for p in parts), tool
        assert counts["failed"] == counts["429s"] == 0, tool
    assert per_tool["inspect_domain"]["ran (receipt completed; local: runs)"] == len(set(domains))
    assert per_tool["country"]["ran (receipt completed; local: runs)"] == countries
    requests = per_tool["inspect_domain"]["requests sent"] + per_tool["country"]["requests sent"]
    assert requests == served["requests"]

    provider.reset()
    second = cli.run(*args, env=env)

    assert second.returncode == 0, second.stderr[-4000:]
    assert provider.stats().get("requests", 0) == 0
    report = cli.report(second.stderr)
    assert report["rows"] == "10000 (10000 ok, 0 failed)"
    assert report["requests sent to local-provider"] == "0 (0 answered 429)"
    assert report[BILLED] == "0"
    reused, calls = re.fullmatch(
        r"(\d+) receipts \((\d+) calls\)", report["reused from earlier runs"]
    ).groups()
    assert int(reused) == unique_calls and int(calls) >= len(domains)
    for tool, counts in cli.tools_report(second.stderr).items():
        assert counts["reused, earlier runs"] + counts["reused this run"] == counts["calls"] > 0, tool
        assert counts["ran (receipt completed; local: runs)"] == counts["requests sent"] == 0, tool
    assert _check_output(cli.read_jsonl(out), domains) == countries


def test_cli_run_interrupted_resumes_paying_only_for_the_rest(cli, provider_factory, domains, tmp_path):
    # A subset and some provider latency, so that half way is a moment one can hit.
    subset = domains[:3000]
    rows = tmp_path / "domains-3000.txt"
    rows.write_text("".join(f"{d}\n" for d in subset), encoding="utf-8")
    server = provider_factory("--latency", "0.1")
    db, out, err = tmp_path / "receipts.db", tmp_path / "out.jsonl", tmp_path / "first.stderr"
    args = ("run", cli.examples / "domains_play.py", "--input", rows, "--db", db, "--output", out)
    env = cli.env(TOOLDISPATCH_PROVIDER_URL=server.url)

    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            cli.command(*args),
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            cli.poll_until(
                lambda: proc.poll() is not None or server.stats().get("items", 0) >= len(subset) // 2,
                timeout_s=HALF_RUN_TIMEOUT_S,
                what="the provider to serve half the lookups",
            )
            assert proc.poll() is None, f"the run ended before it could be interrupted:\n{err.read_text()}"
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=HALF_RUN_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    first_err = err.read_text()
    assert code == 130, first_err[-4000:]
    assert any(line.startswith("interrupted") for line in first_err.splitlines()), first_err[-4000:]
    assert "Traceback" not in first_err
    report = cli.report(first_err)
    assert report["status"].startswith("interrupted")
    done_first = len(cli.read_jsonl(out))
    assert 0 < done_first < len(subset)
    paid_first = server.stats()["items"]
    done_first_billed = int(report[BILLED])
    assert done_first_billed == paid_first  # every lookup paid for is counted, and stored
    # the report and a last line say what the output holds and how to complete it
    assert report["output"] == f"{out}: only the {done_first} rows finished (see the last line)"
    last = first_err.strip().splitlines()[-1]
    assert last.startswith(f"interrupted: {out} holds only the {done_first} rows"), last
    assert "run the same command again" in last

    second = cli.run(*args, env=env)

    assert second.returncode == 0, second.stderr[-4000:]
    countries = _check_output(cli.read_jsonl(out), subset)
    unique_calls = len(set(subset)) + countries
    assert _receipt_counts(db) == {
        ("inspect_domain", "completed"): len(set(subset)),
        ("country", "completed"): countries,
    }
    assert paid_first < unique_calls
    # In-flight calls finished and were stored at the interrupt: over both runs the
    # provider served each unique lookup exactly once.
    assert server.stats()["items"] == unique_calls
    report = cli.report(second.stderr)
    assert int(report["reused from earlier runs"].split()[0]) == done_first_billed
    assert report["rows"] == f"{len(subset)} ({len(subset)} ok, 0 failed)"


GEVENT_PLAY = """
import os
import sys

from actors.http import http_tool

BASE = os.environ["TOOLDISPATCH_PROVIDER_URL"]
tools = [http_tool("inspect_domain", f"{BASE}/v1/domain", batch_url=f"{BASE}/v1/domain/batch",
                   max_batch_size=100, provider="local-provider")]


def play(row, ctx):
    monkey = sys.modules.get("gevent.monkey")
    info = ctx.tool("inspect_domain", {"domain": row})
    return {"tld": info["tld"], "gevent": bool(monkey and monkey.is_module_patched("threading"))}
"""


def test_cli_run_gevent_runtime(cli, provider, domains, tmp_path):
    play = tmp_path / "gevent_play.py"
    play.write_text(GEVENT_PLAY, encoding="utf-8")
    subset = domains[:300]
    rows = tmp_path / "domains-300.txt"
    rows.write_text("".join(f"{d}\n" for d in subset), encoding="utf-8")
    out = tmp_path / "out.jsonl"

    done = cli.run(
        "run", play, "--input", rows, "--db", tmp_path / "r.db", "--output", out, "--runtime", "gevent",
        env=cli.env(TOOLDISPATCH_PROVIDER_URL=provider.url),
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-4000:]
    lines = cli.read_jsonl(out)
    assert [line["row"] for line in lines] == subset
    assert all(line["error"] is None and line["result"]["gevent"] is True for line in lines)
    report = cli.report(done.stderr)
    assert report["rows"] == "300 (300 ok, 0 failed)"
    assert provider.stats()["items"] == len(set(subset))


def test_cli_requests_sent_counts_every_request_the_provider_saw(cli, provider_factory, tmp_path):
    # requests answered 429 and sent again are requests the provider saw (before, only the
    # first attempt of each call was counted: 100 shown, 102 served)
    limited = provider_factory("--rate", "10", "--burst", "2")
    rows = tmp_path / "rows.txt"
    rows.write_text("".join(f"site{n}.fr\n" for n in range(40)), encoding="utf-8")
    env = cli.env(
        TOOLDISPATCH_PROVIDER_URL=limited.url, TOOLDISPATCH_PROVIDER_RPS="20", TOOLDISPATCH_BATCH="0"
    )
    done = cli.run(
        "run", cli.examples / "domains_play.py", "--input", rows, "--db", tmp_path / "r.db", env=env
    )
    assert done.returncode == 0, done.stderr[-4000:]
    served = limited.stats()
    assert served.get("rate_limited", 0) > 0  # the stated 20/s is twice what it allows
    seen = served["requests"] + served["rate_limited"]
    report = cli.report(done.stderr)
    assert report["requests sent to local-provider"] == f"{seen} ({served['rate_limited']} answered 429)"
    per_tool = cli.tools_report(done.stderr)
    assert sum(c["requests sent"] for c in per_tool.values()) == seen
