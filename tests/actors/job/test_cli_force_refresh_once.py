"""``tooldispatch run --force-refresh`` pays for each distinct call once per run: the
example play looks up the country of many domains (a few country codes, each asked by
many rows, rows arriving long after the first lookup of their code is done); after a
plain run, a forced run bills every domain and every country code exactly once at the
provider (``examples/provider.py``, real HTTP), and its output carries the fresh answers.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest

pytestmark = pytest.mark.scenario

ROWS = 400
WAIT_S = 240.0


def test_cli_force_refresh_bills_each_call_once_per_run(
    cli: Any, provider_factory: Any, domains: list[str], tmp_path: Any
) -> None:
    server = provider_factory("--latency", "0.5")
    rows = tmp_path / "domains.txt"
    rows.write_text("".join(f"{d}\n" for d in domains[:ROWS]), encoding="utf-8")
    env = cli.env(TOOLDISPATCH_PROVIDER_URL=server.url)
    db = tmp_path / "r.db"

    def run(out: str, *extra: str) -> Any:
        done = cli.run(
            "run", cli.examples / "domains_play.py", "--input", rows, "--db", db, "--output",
            tmp_path / out, *extra, env=env, timeout_s=WAIT_S,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    run("plain.jsonl")
    server.reset()
    run("forced.jsonl", "--force-refresh")

    billed = server.calls()["billed"]
    per_endpoint = collections.Counter(item.split(" ", 1)[0] for item in billed)
    assert per_endpoint["/v1/country"] >= 3, billed  # several codes, each asked by many rows
    twice = {item: n for item, n in billed.items() if n != 1}
    assert twice == {}, f"billed more than once in one forced run: {twice}"
    assert per_endpoint["/v1/domain"] == ROWS
    out = cli.read_jsonl(tmp_path / "forced.jsonl")
    assert [line["row"] for line in out] == domains[:ROWS]
    assert all(line["error"] is None for line in out), [line for line in out if line["error"]][:3]

    server.reset()  # a second forced run refreshes again: once more each
    run("again.jsonl", "--force-refresh")
    assert set(server.calls()["billed"].values()) == {1}
