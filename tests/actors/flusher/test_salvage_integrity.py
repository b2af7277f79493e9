"""Salvage keeps every paid answer (issue 9): exact outputs, outputs no store can hold,
and entries appended or replayed by several processes at once."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import stores
from actors.flusher.salvage import SalvageLog, salvage_entry
from stores import ClaimRequest, Owner, ReceiptStatus, SqliteReceiptStore

pytestmark = pytest.mark.scenario

ORG = "acme"
REPO_ROOT = Path(stores.__file__).resolve().parent.parent
CHILD_TIMEOUT_S = 120.0


def _entry(key: str, output: Any) -> Any:
    return salvage_entry(
        key=key, org_id=ORG, scope="play", tool_id="tool", input_hash=f"hash-{key}", output=output,
        attempts=4, first_error_at=1_700_000_000.0, error="StoreError: disk I/O error",
    )  # fmt: skip


EXACT = {
    "lone_surrogate": {"snippet": "caf\ud83d"},
    "big_int": [2**64, -(2**80)],
    "nan_inf": {"x": float("nan"), "y": float("-inf")},
}


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # nan and big ints by text


@pytest.mark.parametrize("name", list(EXACT))
def test_salvage_keeps_exact_outputs_and_replays_them(tmp_path: Path, name: str) -> None:
    log = SalvageLog(tmp_path / "salvage.jsonl")
    entry = _entry(f"k-{name}", EXACT[name])
    assert entry.output_form == "json"
    assert log.append([entry]) == 1
    (read,) = log.entries()
    assert _same(read.output, EXACT[name])
    with SqliteReceiptStore(tmp_path / "r.db") as store:
        assert log.replay(store).completed == 1
        (receipt,) = store.get_many(ORG, [entry.receipt_key])
        assert receipt is not None and receipt.status is ReceiptStatus.COMPLETED
        assert _same(receipt.output, EXACT[name])


def _deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "output",
    [{1, 2}, {"raw": b"\x00"}, _deep(5000), {"n": 10**5000}],
    ids=["set", "bytes", "depth-5000", "int-5001-digits"],
)
def test_salvage_keeps_unstorable_outputs_described_and_never_replays_them(
    tmp_path: Path, output: Any
) -> None:
    log = SalvageLog(tmp_path / "salvage.jsonl")
    entry = _entry("unstorable", output)
    assert entry.output_form == "described" and entry.output_problem
    assert log.append([entry]) == 1
    assert log.entries() == [entry]
    with SqliteReceiptStore(tmp_path / "r.db") as store:
        report = log.replay(store)
        assert (report.completed, report.kept) == (0, 1)
        assert store.get_many(ORG, ["unstorable"]) == [None]
    assert log.entries() == [entry]


_WORKER = """
import json, sys
from actors.flusher.salvage import SalvageLog, salvage_entry
from stores import SqliteReceiptStore
role, salvage_path, db_path, keys = (json.loads(a) for a in sys.argv[1:])
log = SalvageLog(salvage_path)
print(json.dumps("ready"), flush=True)
sys.stdin.readline()
if role == "append":
    for key in keys:
        log.append([salvage_entry(key=key, org_id="acme", scope="play", tool_id="tool",
                                  input_hash="h-" + key, output={"paid": key}, attempts=1,
                                  first_error_at=1.0, error="e")])
else:
    with SqliteReceiptStore(db_path) as store:
        for _ in range(len(keys)):
            log.replay(store)
print(json.dumps("done"), flush=True)
"""


def _start(script: Path, *args: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, str(script), *(json.dumps(a) for a in args)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def test_salvage_two_replaying_processes_and_an_appender_lose_nothing(tmp_path: Path) -> None:
    salvage, db = tmp_path / "salvage.jsonl", tmp_path / "r.db"
    keys = [hashlib.sha256(f"paid-{i}".encode()).hexdigest() for i in range(150)]
    with SqliteReceiptStore(db) as store:  # every key under this (live) process's lease:
        holder = Owner("run-holder")  # replays keep the entries, so all must stay in the file
        wanted = [ClaimRequest(k, "play", "tool", "h-" + k) for k in keys]
        assert all(
            c.disposition.value == "claimed" for c in store.claim_many(ORG, wanted, holder, lease_ttl_s=3600)
        )
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    procs = [
        _start(script, "append", str(salvage), str(db), keys),
        _start(script, "replay", str(salvage), str(db), keys[:60]),
        _start(script, "replay", str(salvage), str(db), keys[:60]),
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and json.loads(proc.stdout.readline()) == "ready"
        for proc in procs:  # the start barrier
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            out, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
            assert proc.returncode == 0, err
            assert json.loads(out) == "done"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    log = SalvageLog(salvage)
    found = sorted(e.receipt_key for e in log.entries())
    assert found == sorted(keys), f"{len(set(keys) - set(found))} entries lost"
    assert log.unreadable() == 0
