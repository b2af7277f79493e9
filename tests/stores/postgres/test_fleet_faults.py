"""Many workers, one Postgres: the faults worker fleets hit (issue 11 section 1).

Each kind is tested with real concurrent processes (plain Python children, see
conftest.Children; one store and pool each) started together through a stdin barrier:

- every key claimed exactly once, and every key of every bulk claim answered, when
  the keys are new ("insert if absent, else read" under racing inserts) or expired
  (racing reclaims);
- overlapping bulk claims and fenced writes in different key orders never deadlock;
- a completion racing a reclaim of the same expired lease: exactly one wins, and a
  finished receipt is never turned back;
- four workers opening an empty database at once all start (schema creation races).
"""

from __future__ import annotations

import hashlib
import os
import signal
from collections import Counter
from typing import Any

import pytest

import stores
from stores import ClaimDisposition, ClaimRequest, Owner, ReceiptStatus

pytestmark = pytest.mark.scenario

ORG = "org-a"
KEYS = [hashlib.sha256(f"key-{i}".encode()).hexdigest() for i in range(600)]
WORKERS = 4
T0 = 1_700_000_000.0

_PRELUDE = """
import json, random, sys
from stores import ClaimRequest, Completion, LeaseRef, Owner, PostgresReceiptStore
url, schema, run_id, keys, seed, clock = (json.loads(arg) for arg in sys.argv[1:7])
rng = random.Random(seed)
def open_store():
    return PostgresReceiptStore(url, schema=schema, clock=(lambda: clock) if clock else None, max_size=2)
store = open_store() if "--open-late" not in sys.argv else None
print(json.dumps("ready"), flush=True)
sys.stdin.readline()  # the start barrier
store = store or open_store()
def reqs(chunk):
    return [ClaimRequest(k, "play", "tool", k) for k in chunk]
def errors_of(fn):
    try:
        fn()
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
"""

_CLAIMER = (
    _PRELUDE
    + """
rng.shuffle(keys)
claimed, answered, errors = [], 0, []
for start in range(0, len(keys), 50):
    chunk = keys[start:start + 50]
    try:
        claims = store.claim_many("org-a", reqs(chunk), Owner(run_id), lease_ttl_s=3600.0)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
        continue
    answered += len(claims)
    assert [c.receipt.key for c in claims] == chunk
    claimed += [c.receipt.key for c in claims if c.disposition.value == "claimed"]
store.close()
print(json.dumps({"claimed": claimed, "answered": answered, "errors": errors}), flush=True)
# stay alive until every claimer has reported: a lease whose holder process is gone is
# taken over at once by design, and that would count a key twice here
sys.stdin.readline()
"""
)

_MIXER = (
    _PRELUDE
    + """
# Overlapping bulk claims and fenced writes (on every key: most are others' leases, so
# the rows are locked and refused) in shuffled orders, many rounds. Claims take leases
# that are expired at once, so every claim of an existing key locks and rewrites it.
errors = []
for round_ in range(10):
    rng.shuffle(keys)
    err = errors_of(lambda: store.claim_many("org-a", reqs(keys), Owner(run_id), lease_ttl_s=-1.0))
    errors += [err] if err else []
    rng.shuffle(keys)
    err = errors_of(lambda: store.renew_leases(
        "org-a", [LeaseRef(k, "bogus") for k in keys], Owner(run_id), lease_ttl_s=60.0))
    errors += [err] if err else []
    rng.shuffle(keys)
    err = errors_of(lambda: store.release("org-a", [LeaseRef(k, "bogus") for k in keys], Owner(run_id)))
    errors += [err] if err else []
store.close()
print(json.dumps({"errors": errors}), flush=True)
"""
)

_COMPLETER = (
    _PRELUDE
    + """
# keys: [[key, lease_id], ...] held (expired) by run_id; complete them 10 at a time.
applied, refused = [], {}
for start in range(0, len(keys), 10):
    chunk = keys[start:start + 10]
    report = store.complete_many(
        "org-a", [Completion(k, lease, {"by": run_id}) for k, lease in chunk], Owner(run_id))
    applied += report.applied
    refused.update({k: r.reason.value for k, r in report.refused.items()})
store.close()
print(json.dumps({"applied": applied, "refused": refused}), flush=True)
"""
)

_RECLAIMER = (
    _PRELUDE
    + """
got = {}
for start in range(0, len(keys), 10):
    claims = store.claim_many("org-a", reqs(keys[start:start + 10]), Owner(run_id), lease_ttl_s=3600.0)
    got.update({c.receipt.key: c.disposition.value for c in claims})
store.close()
print(json.dumps(got), flush=True)
# stay alive until every reclaimer has reported (as the claimers do): a reclaimer whose
# process is gone leaves leases the others take over at once, by design
sys.stdin.readline()
"""
)

_OPENER = (
    _PRELUDE
    + """
answered = [len(store.claim_many("org-a", reqs(keys), Owner(run_id), lease_ttl_s=3600.0))]
store.close()
for n in range(1, 5):  # four more empty schemas, raced in step
    more = PostgresReceiptStore(url, schema=f"{schema}_{n}", max_size=1)
    answered.append(len(more.claim_many("org-a", reqs(keys), Owner(run_id), lease_ttl_s=3600.0)))
    more.close()
print(json.dumps({"answered": answered}), flush=True)
"""
)


def run_children(children: Any, script: str | None, argvs: list[Any]) -> list[Any]:
    """Start one child per argv (or per (script, argv) when ``script`` is None), release
    them together, return their reports in start order."""
    for argv in argvs:
        children.start(*((script, argv) if script is not None else argv))
    assert children.gather() == ["ready"] * len(argvs)
    children.broadcast("go")
    reports = children.gather()
    stderr = children.finish()
    assert [e for e in stderr if "Traceback" in e] == []
    return reports


ONLY_CHILDREN = pytest.mark.parametrize("runtime", ["threads"])
"""For a test whose racing all happens in its children: plain, unpatched Python processes
(``children``) in either suite run, so a shared run starts them in the threads suite run
only (tests/conftest.py); the gevent run would start the same processes the same way again."""


def open_store(pg_url: str, schema: str, clock: float | None = None) -> Any:
    return stores.PostgresReceiptStore(pg_url, schema=schema, clock=(lambda: clock) if clock else None)


@ONLY_CHILDREN
@pytest.mark.parametrize("start", ["new", "expired"])
def test_pg_processes_claim_each_key_once(
    pg_url: str, pg_schema: str, children: Any, start: str, runtime: str
) -> None:
    with open_store(pg_url, pg_schema) as store:
        if start == "expired":  # every claim is a racing reclaim; lease expired on the server's clock
            store.claim_many(
                ORG, [ClaimRequest(k, "play", "tool", k) for k in KEYS], Owner("crashed"), lease_ttl_s=-1
            )
    runs = [f"proc-{i}" for i in range(WORKERS)]
    reports = run_children(
        children, _CLAIMER, [[pg_url, pg_schema, run, KEYS, i, None] for i, run in enumerate(runs)]
    )

    assert [r["errors"] for r in reports] == [[]] * WORKERS
    assert [r["answered"] for r in reports] == [len(KEYS)] * WORKERS  # every key got a disposition
    counts = Counter(k for r in reports for k in r["claimed"])
    assert set(counts) == set(KEYS)
    assert [k for k, n in counts.items() if n != 1] == []
    holder = {k: run for run, r in zip(runs, reports, strict=True) for k in r["claimed"]}
    with open_store(pg_url, pg_schema) as store:
        for receipt in store.get_many(ORG, KEYS):
            assert receipt is not None and receipt.status is ReceiptStatus.QUEUED
            assert receipt.lease_owner_run_id == holder[receipt.key]
            assert receipt.attempts == (1 if start == "new" else 2)


@ONLY_CHILDREN
def test_pg_overlapping_bulk_writes_in_different_orders_never_deadlock(
    pg_url: str, pg_schema: str, children: Any, runtime: str
) -> None:
    keys = KEYS[:300]
    with open_store(pg_url, pg_schema) as store:  # half the keys exist (new ones are inserted, racing)
        store.claim_many(
            ORG, [ClaimRequest(k, "play", "tool", k) for k in keys[::2]], Owner("old"), lease_ttl_s=-1
        )
    argvs = [[pg_url, pg_schema, f"proc-{i}", keys, i, None] for i in range(WORKERS)]
    reports = run_children(children, _MIXER, argvs)
    assert [r["errors"] for r in reports] == [[]] * WORKERS


@ONLY_CHILDREN
def test_pg_completion_racing_reclaim_has_one_winner(
    pg_url: str, pg_schema: str, children: Any, runtime: str
) -> None:
    keys = KEYS[:400]
    with open_store(pg_url, pg_schema, clock=T0) as store:
        claims = store.claim_many(
            ORG, [ClaimRequest(k, "play", "tool", k) for k in keys], Owner("slow"), lease_ttl_s=30
        )
        held = [[c.receipt.key, c.receipt.lease_id] for c in claims]
        store.mark_running_many(ORG, [stores.LeaseRef(k, lease) for k, lease in held], Owner("slow"))
    later = T0 + 60  # the slow owner's leases have expired: it completes while others reclaim
    procs: list[Any] = [(_COMPLETER, [pg_url, pg_schema, "slow", held, 0, later])]
    procs += [
        (_RECLAIMER, [pg_url, pg_schema, f"reclaimer-{i}", keys[::-1] if i % 2 else keys, i, later])
        for i in range(3)
    ]
    completer, *reclaimers = run_children(children, None, procs)

    applied = set(completer["applied"])
    with open_store(pg_url, pg_schema, clock=later) as store:
        final = dict(zip(keys, store.get_many(ORG, keys), strict=True))
    outcomes = Counter()
    for key in keys:
        claimers = [i for i, r in enumerate(reclaimers) if r[key] == "claimed"]
        assert (key in applied) + len(claimers) == 1, (key, key in applied, claimers)
        assert {r[key] for r in reclaimers} <= {"claimed", "reused", "running"}
        receipt = final[key]
        assert receipt is not None
        if key in applied:
            assert (receipt.status, receipt.output) == (ReceiptStatus.COMPLETED, {"by": "slow"})
            assert {r[key] for r in reclaimers} == {"reused"}
            outcomes["completed"] += 1
        else:
            assert completer["refused"][key] == "lease_lost"
            assert receipt.status is ReceiptStatus.QUEUED
            assert receipt.lease_owner_run_id == f"reclaimer-{claimers[0]}"
            outcomes["reclaimed"] += 1
    assert sum(outcomes.values()) == len(keys)


@ONLY_CHILDREN
def test_pg_workers_starting_at_once_on_empty_database_all_start(
    pg_url: str, pg_schema: str, children: Any, runtime: str
) -> None:
    argvs = [[pg_url, pg_schema, f"proc-{i}", KEYS[:10], i, None, "--open-late"] for i in range(WORKERS)]
    try:
        reports = run_children(children, _OPENER, argvs)
    finally:
        import psycopg

        with psycopg.connect(pg_url, autocommit=True) as conn:
            for n in range(1, 5):
                conn.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}_{n}" CASCADE')
    assert reports == [{"answered": [10] * 5}] * WORKERS


_HOLDER = """
import json, sys
from stores import ClaimRequest, LeaseRef, Owner, PostgresReceiptStore
url, schema, keys = (json.loads(arg) for arg in sys.argv[1:])
store = PostgresReceiptStore(url, schema=schema, max_size=1)
owner = Owner("run-child")
wanted = [ClaimRequest(k, "play", "tool", k) for k in keys]
claims = store.claim_many("org-a", wanted, owner, lease_ttl_s=3600.0)
store.mark_running_many("org-a", [LeaseRef(c.receipt.key, c.receipt.lease_id) for c in claims[:1]], owner)
print(json.dumps([c.disposition.value for c in claims]), flush=True)
sys.stdin.readline()  # hold the leases until told (or killed)
"""


@pytest.mark.parametrize("retry_safe", [True, False], ids=["retry-safe", "not-retry-safe"])
def test_pg_lease_of_sigkilled_process_on_this_host_is_taken_over_at_once(
    pg_url: str, pg_schema: str, children: Any, retry_safe: bool
) -> None:
    keys = KEYS[:3]
    wanted = [ClaimRequest(k, "play", "tool", k, retry_safe=retry_safe) for k in keys]
    child = children.start(_HOLDER, [pg_url, pg_schema, keys])
    assert children.receive(child) == ["claimed"] * len(keys)
    with open_store(pg_url, pg_schema) as store:
        held = store.get_many(ORG, keys)
        assert all(r is not None and r.lease_owner_pid == child.pid for r in held)
        alive = store.claim_many(ORG, wanted, Owner("run-next"), lease_ttl_s=60.0)
        assert [c.disposition for c in alive] == [ClaimDisposition.RUNNING] * len(keys)  # never taken
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        taken = store.claim_many(ORG, wanted, Owner("run-next"), lease_ttl_s=60.0)
        after = store.get_many(ORG, keys)
    # The first key was marked running: not retry-safe, its request may have gone out.
    first = ClaimDisposition.CLAIMED if retry_safe else ClaimDisposition.UNCERTAIN
    assert [c.disposition for c in taken] == [first, ClaimDisposition.CLAIMED, ClaimDisposition.CLAIMED]
    assert [c.receipt for c in taken] == after
    for before, claim in zip(held, taken, strict=True):
        assert before is not None
        assert claim.receipt.generation == before.generation == 1  # same provider idempotency key
    assert after[0] is not None
    assert after[0].status is (ReceiptStatus.QUEUED if retry_safe else ReceiptStatus.UNCERTAIN)
