"""The CLI reads what the last run salvaged before it decides a receipt (issue 26): a
run that ended while the store could not take its completions left the paid outputs in
the salvage file and their receipts ``running`` under its lease. ``tooldispatch run``
after that lease expired completes them from the file (the tool is not called again,
no row meets an uncertain outcome), and ``receipts resolve`` replays the file before it
decides. Real files, real subprocesses."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.scenario

PLAY = """
import os
from actors import Tool

LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "charged.log")

def charge(input, ctx):
    with open(LOG, "a") as log:
        log.write(str(input["n"]) + "\\n")
    return {"charged": input["n"], "by": "a second call"}

tools = [Tool(tool_id="charge", fn=charge)]  # not retry-safe

def play(row, ctx):
    return ctx.tool("charge", {"n": int(row)})
"""

ORG, SCOPE = "default", "charge_play"
TTL_S = 0.3


def _salvaged_run(tmp_path: Path, n: int) -> tuple[Path, str, str]:
    """What a run stopped during a store outage leaves: the receipt of ``charge({"n": n})``
    running under its lease (which then expires), its paid output in the salvage file.
    Returns (db, key, lease id)."""
    from actors.flusher.salvage import SalvageLog, salvage_entry
    from stores import ClaimRequest, LeaseRef, Owner, SqliteReceiptStore
    from stores.keys import key_and_input_hash

    db = tmp_path / "receipts.db"
    key, input_hash = key_and_input_hash(
        org_id=ORG, scope=SCOPE, tool_id="charge", input={"n": n}, version="1"
    )
    owner = Owner("first-run", 1)
    with SqliteReceiptStore(db) as store:
        (claim,) = store.claim_many(
            ORG, [ClaimRequest(key, SCOPE, "charge", input_hash)], owner, lease_ttl_s=TTL_S
        )
        lease_id = claim.receipt.lease_id
        assert lease_id is not None
        assert store.mark_running_many(ORG, [LeaseRef(key, lease_id)], owner).ok
    SalvageLog(f"{db}.salvage.jsonl").append([
        salvage_entry(
            key=key, org_id=ORG, scope=SCOPE, tool_id="charge", input_hash=input_hash,
            output={"charged": n, "by": "the first run"}, attempts=3, first_error_at=None,
            error="StoreUnavailableError: the receipt store went away", lease_id=lease_id,
        )
    ])  # fmt: skip
    deadline = time.monotonic() + 30.0  # the first run's lease expires (by the store's clock)
    while (_receipt(db, key).lease_expires_at or 0.0) >= time.time():
        assert time.monotonic() < deadline, "the first run's lease never expired"
        time.sleep(0.02)
    return db, key, lease_id


def _receipt(db: Path, key: str) -> Any:
    from stores import SqliteReceiptStore

    with SqliteReceiptStore(db) as store:
        (receipt,) = store.get_many(ORG, [key])
    return receipt


def test_cli_run_completes_salvaged_receipts_from_the_file_before_claiming(cli: Any, tmp_path: Path) -> None:
    play = tmp_path / "charge_play.py"
    play.write_text(PLAY, encoding="utf-8")
    rows = tmp_path / "rows.txt"
    rows.write_text("7\n", encoding="utf-8")
    db, key, _ = _salvaged_run(tmp_path, 7)
    out = tmp_path / "out.jsonl"
    done = cli.run("run", play, "--input", rows, "--db", db, "--output", out)
    assert done.returncode == 0, done.stderr
    (line,) = [json.loads(text) for text in out.read_text().splitlines()]
    assert line["error"] is None and line["result"] == {"charged": 7, "by": "the first run"}
    assert not (tmp_path / "charged.log").exists()  # never paid again
    receipt = _receipt(db, key)
    assert receipt.status.value == "completed" and receipt.output == {"charged": 7, "by": "the first run"}


def test_cli_resolve_completes_an_uncertain_receipt_from_its_salvaged_output(
    cli: Any, tmp_path: Path
) -> None:
    """A worker that could not see the salvage file (another host) judged the receipt
    uncertain; the operator's resolve finds the paid output in the file first."""
    from stores import ClaimRequest, Owner, SqliteReceiptStore
    from stores.keys import key_and_input_hash

    db, key, lease_id = _salvaged_run(tmp_path, 8)
    _, input_hash = key_and_input_hash(org_id=ORG, scope=SCOPE, tool_id="charge", input={"n": 8}, version="1")
    with SqliteReceiptStore(db) as store:  # the other worker
        (claim,) = store.claim_many(
            ORG, [ClaimRequest(key, SCOPE, "charge", input_hash, retry_safe=False)], Owner("elsewhere", 1),
            lease_ttl_s=60.0,
        )  # fmt: skip
    assert claim.receipt.status.value == "uncertain" and claim.receipt.lease_id == lease_id
    resolved = cli.run("receipts", "resolve", key[:12], "--db", db, "--rerun")
    assert resolved.returncode == 0, resolved.stderr
    assert "salvage file" in resolved.stdout and "nothing to resolve" in resolved.stdout
    receipt = _receipt(db, key)
    assert receipt.status.value == "completed" and receipt.output == {"charged": 8, "by": "the first run"}
    missing = cli.run("receipts", "resolve", key[:12], "--db", db, "--rerun", "--salvage", tmp_path / "none")
    assert missing.returncode == 2 and "no salvage file" in missing.stderr
