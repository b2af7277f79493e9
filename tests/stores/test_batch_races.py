"""Processes racing to take over the batch requests of a crashed sender (issue 26): each
recorded request is taken whole by exactly one claimer, whatever members each claim asks
for and in whatever order, and none is made ``uncertain`` by the race (SQLite and
Postgres, real processes started together through a stdin barrier, see conftest.Children).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from stores import BatchRecord, ClaimRequest, LeaseRef, Owner, open_store

from .conftest import BACKENDS, PG_URL, drop_pg_schema, new_pg_schema, require_backend

pytestmark = pytest.mark.scenario

ORG = "org-a"
BATCHES = 30
SIZE = 10
WORKERS = 4

_CLAIMER = """
import json, random, sys
from stores import ClaimRequest, Owner, open_store
target, schema, run_id, keys, seed = (json.loads(arg) for arg in sys.argv[1:6])
store = open_store(target, schema=schema) if schema else open_store(target)
rng = random.Random(seed)
print(json.dumps("ready"), flush=True)
sys.stdin.readline()  # the start barrier
rng.shuffle(keys)
taken, answers, errors = [], [], []
for start in range(0, len(keys), 7):
    chunk = keys[start:start + 7]
    try:
        claims = store.claim_many("org-a", [ClaimRequest(k, "play", "tool", k) for k in chunk],
                                  Owner(run_id), lease_ttl_s=3600.0)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
        continue
    for c in claims:
        answers.append(c.disposition.value)
        if c.disposition.value == "claimed":
            taken.append([m.receipt.key for m in c.members] or [c.receipt.key])
store.close()
print(json.dumps({"taken": taken, "answers": answers, "errors": errors}), flush=True)
sys.stdin.readline()  # alive until all reported: a gone holder's leases are taken at once
"""


def _keys() -> list[list[str]]:
    return [[hashlib.sha256(f"b{b}-m{m}".encode()).hexdigest() for m in range(SIZE)] for b in range(BATCHES)]


# The racing all happens in the children: plain, unpatched Python processes in either suite
# run, so a shared run starts them in the threads suite run only (tests/conftest.py).
@pytest.mark.parametrize("runtime", ["threads"])
@pytest.mark.parametrize("backend", ["sqlite-file", "postgres"])
def test_racing_takeovers_take_each_recorded_request_whole_once(
    backend: str, tmp_path: Path, children: Any, runtime: str
) -> None:
    require_backend(next(b for b in BACKENDS if b.id == backend))
    schema = new_pg_schema() if backend == "postgres" else None
    target = PG_URL if schema else str(tmp_path / "r.db")
    store = open_store(target, schema=schema) if schema else open_store(target)
    batches = _keys()
    try:
        crashed = Owner("crashed", 1)
        for i, members in enumerate(batches):  # sent, then the sender died: leases run out
            claims = store.claim_many(
                ORG, [ClaimRequest(k, "play", "tool", k) for k in members], crashed, lease_ttl_s=-1.0
            )
            record = BatchRecord(
                key=f"batch-{i}", tool_id="tool", members=tuple(members), inputs=tuple("{}" for _ in members)
            )
            leases = [LeaseRef(c.receipt.key, c.receipt.lease_id or "") for c in claims]
            assert store.mark_running_many(ORG, leases, crashed, batches=[record]).ok
        every = [k for members in batches for k in members]
        for i in range(WORKERS):
            children.start(_CLAIMER, [target, schema, f"proc-{i}", every, i])
        assert children.gather() == ["ready"] * WORKERS
        children.broadcast("go")
        reports = children.gather()
        children.broadcast("done")
        children.finish()

        assert [r["errors"] for r in reports] == [[]] * WORKERS
        assert all(set(r["answers"]) <= {"claimed", "running"} for r in reports)  # none uncertain
        by_proc = [{tuple(t) for t in r["taken"]} for r in reports]
        taken = Counter(t for requests in by_proc for t in requests)
        assert sorted(taken) == sorted(tuple(m) for m in batches)  # each whole, in its order
        assert set(taken.values()) == {1}  # by one claimer
    finally:
        store.close()
        if schema:
            drop_pg_schema(schema)
