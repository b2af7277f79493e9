"""The run report's figures are what they say, for this run alone, and equal the example
provider's own counters (``examples/provider.py`` in its own process, the CLI in its
own): requests sent and answered 429, lookups answered (what the provider bills, a
lookup it answered with an error included), the time pacing held calls back (never
more than the wall time), the cuts this run's 429s made (a shared pacer keeps its
learner's count in Redis for an hour: a later run without a 429 shows none), and the
progress line's calls (not rows)."""

from __future__ import annotations

import os
import re
import uuid

import pytest

pytestmark = pytest.mark.scenario

REDIS_URL = os.environ.get("TOOLDISPATCH_TEST_REDIS", "redis://127.0.0.1:6379/0")
PROVIDER = "local-provider"
BAD = ("localhost", "nodots", "intranet")
"""Rows the provider answers with an error (422: not a domain name): billed, and failed."""


def _rows(tmp_path, n: int, start: int = 0, bad: tuple[str, ...] = ()):
    rows = tmp_path / f"rows-{start}-{n}.txt"
    names = [f"site{i}.example.fr" if i % 3 else f"site{i}.example.com" for i in range(start, start + n)]
    rows.write_text("".join(f"{name}\n" for name in [*names, *bad]), encoding="utf-8")
    return rows


def _run(cli, tmp_path, rows, provider, *extra):
    # COLUMNS: wide enough that no cell wraps (an error row's label and example are long,
    # and a wrapped cell reads as two rows)
    env = cli.env(TOOLDISPATCH_PROVIDER_URL=provider.url, TOOLDISPATCH_BATCH="0", COLUMNS="400")
    done = cli.run("run", cli.examples / "domains_play.py", "--input", rows, "--db", tmp_path / "r.db",
                   *extra, env=env)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr[-4000:]
    assert "Traceback" not in done.stderr
    return done


def _held_s(cell: str) -> float:
    found = re.search(r"calls held back ([\d.]+) s", cell)
    assert found is not None, cell
    return float(found.group(1))


def _wall_s(report: dict[str, str]) -> float:
    """The run's wall time, to the 0.1 s the held-back time is printed to (rounding is
    monotone: held <= wall stays true of the printed figures only when both are rounded
    alike; 2.96 s held in a 2.99 s run prints as 3.0 s)."""
    return round(float(report["wall time"].split()[0]), 1)


def _cuts(cell: str) -> int:
    found = re.search(r"cut (\d+) times? by this run's 429s", cell)
    return int(found.group(1)) if found else 0


def test_cli_report_figures_equal_the_providers_own_counts(cli, provider_factory, tmp_path):
    limited = provider_factory("--rate", "10", "--burst", "2")  # slow start from 20/s meets 429s
    done = _run(cli, tmp_path, _rows(tmp_path, 60, bad=BAD), limited)

    served = limited.stats()
    report = cli.report(done.stderr)
    assert served.get("rate_limited", 0) > 0, served  # the run met the provider's limit
    seen = served["requests"] + served["rate_limited"]
    assert report[f"requests sent to {PROVIDER}"] == f"{seen} ({served['rate_limited']} answered 429)"
    # what the provider billed: every lookup it answered, those it answered with an error too
    assert report[f"lookups {PROVIDER} answered (billable)"] == str(served["items"])
    assert report["rows"] == f"{60 + len(BAD)} (60 ok, {len(BAD)} failed)"
    ran = int(report["receipts completed this run (calls that ran)"])
    assert ran == served["items"] - len(BAD)  # completed receipts are not what was billed
    per_tool = cli.tools_report(done.stderr)
    assert sum(c["lookups answered (billable)"] for c in per_tool.values()) == served["items"]
    assert per_tool["inspect_domain"]["lookups answered (billable)"] == served["requests:/v1/domain"]
    assert sum(c["requests sent"] for c in per_tool.values()) == seen
    assert sum(c["answers replayed (not billed)"] for c in per_tool.values()) == 0
    assert not any("billed" in label and "not billed" not in label for c in per_tool.values() for label in c)
    # pacing: the time calls were held back is wall time, not waits added up
    cell = report[f"pacing of {PROVIDER}"]
    wall = _wall_s(report)
    assert 0.0 < _held_s(cell) <= wall, (cell, wall)
    assert 1 <= _cuts(cell) <= served["rate_limited"], cell
    # the progress line counts calls, and says so
    last = [line for line in done.stderr.splitlines() if line.startswith("progress: rows")][-1]
    calls = re.search(r"\| calls: (\d+) ran, (\d+) reused, (\d+) joined, (\d+) failed \|", last)
    assert calls is not None, last
    assert int(calls.group(1)) == ran
    assert int(calls.group(4)) == int(report["calls failed"]) == len(BAD)
    # the requests, as the report counts them: those sent again and those answered 429 among them
    sent = re.search(r"\| requests sent (\d+) \((\d+) sent again, (\d+) answered 429\) \|", last)
    assert sent is not None, last
    assert int(sent.group(1)) == seen and int(sent.group(3)) == served["rate_limited"], last
    assert int(sent.group(2)) == int(report["retries (requests sent again)"]), last
    assert "lookups billed" not in done.stderr


@pytest.fixture
def pacer_prefix():
    """A unique Redis key prefix ending in ':' (as a user may write it); its keys are
    deleted afterwards."""
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3, decode_responses=True)
        client.ping()
    except Exception as exc:  # ImportError or a connection error
        if os.environ.get("CI"):
            pytest.fail(f"Redis at {REDIS_URL} unavailable ({exc})")
        pytest.skip(f"Redis at {REDIS_URL} unavailable ({exc}); start it or set TOOLDISPATCH_TEST_REDIS")
    stem = f"td-report-{uuid.uuid4().hex[:12]}"
    try:
        yield client, stem
    finally:
        for key in client.scan_iter(match=f"{stem}*"):
            client.delete(key)
        client.close()


def test_cli_report_with_a_shared_pacer_counts_this_runs_cuts_only(
    cli, provider_factory, tmp_path, pacer_prefix
):
    client, stem = pacer_prefix
    pacer = f"{REDIS_URL}?prefix={stem}:"
    limited = provider_factory("--rate", "10", "--burst", "2")
    first = _run(cli, tmp_path, _rows(tmp_path, 60), limited, "--pacer", pacer)
    one = cli.report(first.stderr)
    limited_first = limited.stats()["rate_limited"]
    assert limited_first > 0
    assert 1 <= _cuts(one[f"pacing of {PROVIDER}"]) <= limited_first

    # another run, on other rows, against a provider of the same name that refuses nothing:
    # the learner's state (its cuts with it) is still in Redis, this run's cuts are none
    free = provider_factory()
    second = _run(cli, tmp_path, _rows(tmp_path, 30, start=1000), free, "--pacer", pacer)
    two = cli.report(second.stderr)
    served = free.stats()
    assert served.get("rate_limited", 0) == 0
    assert two[f"requests sent to {PROVIDER}"] == f"{served['requests']} (0 answered 429)"
    assert two[f"lookups {PROVIDER} answered (billable)"] == str(served["items"])
    cell = two[f"pacing of {PROVIDER}"]
    assert _cuts(cell) == 0 and "cut" not in cell, cell
    assert 0.0 <= _held_s(cell) <= _wall_s(two), (cell, two["wall time"])
    assert client.hget(f"{stem}:{{default/{PROVIDER}}}:state", "cuts") not in (
        None,
        "0",
    )  # kept in Redis
    keys = list(client.scan_iter(match=f"{stem}*"))
    assert keys and all(k.startswith(f"{stem}:{{") for k in keys), keys  # one ':' after the prefix
