"""Many claimers, one SQLite file: each key is claimed exactly once (issue 2 section 5).

Processes are plain Python children (see conftest.Children). In the plain run the
in-process claimers are threads; in the gevent run they are greenlets, and the store
must keep its SQLite work off the hub.
"""

from __future__ import annotations

import functools
import hashlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stores import ClaimDisposition, ClaimRequest, Owner, ReceiptStatus, SqliteReceiptStore
from stores.sqlite.offload import gevent_active

ORG = "org-a"
KEYS = [hashlib.sha256(f"key-{i}".encode()).hexdigest() for i in range(1000)]
BATCH = 50
LEASE_TTL_S = 3600.0

_CLAIMER = """
import json, random, sys
from stores import ClaimRequest, Owner, SqliteReceiptStore
path, run_id, keys, batch, seed = (json.loads(arg) for arg in sys.argv[1:])
random.Random(seed).shuffle(keys)
store = SqliteReceiptStore(path)
print(json.dumps("ready"), flush=True)
sys.stdin.readline()  # the start barrier
claimed, others, errors = [], 0, []
for start in range(0, len(keys), batch):
    chunk = keys[start:start + batch]
    try:
        claims = store.claim_many(
            "org-a", [ClaimRequest(k, "play", "tool", k) for k in chunk], Owner(run_id), lease_ttl_s=3600.0
        )
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
        continue
    for claim in claims:
        if claim.disposition.value == "claimed":
            claimed.append(claim.receipt.key)
        else:
            others += 1
store.close()
print(json.dumps({"claimed": claimed, "others": others, "errors": errors}), flush=True)
sys.stdin.readline()  # stay alive until the parent has every answer: a lease whose
# holder process is gone is taken over at once, which is not what this test races
"""


def requests(keys: list[str]) -> list[ClaimRequest]:
    return [ClaimRequest(k, "play", "tool", k) for k in keys]


def seed_expired_leases(path: Path) -> None:
    """Claim every key under a lease that expired an hour ago (by the real clock)."""
    with SqliteReceiptStore(path, clock=lambda: time.time() - 2 * LEASE_TTL_S) as past:
        claims = past.claim_many(ORG, requests(KEYS), Owner("run-crashed"), lease_ttl_s=LEASE_TTL_S)
    assert all(c.disposition is ClaimDisposition.CLAIMED for c in claims)


def assert_claimed_once(path: Path, claimed_by: dict[str, list[str]], attempts: int) -> None:
    """Every key claimed by exactly one claimer, and the file agrees on who holds it."""
    counts = Counter(key for keys in claimed_by.values() for key in keys)
    assert set(counts) == set(KEYS)
    assert [k for k, n in counts.items() if n != 1] == []
    holder = {key: run for run, keys in claimed_by.items() for key in keys}
    with SqliteReceiptStore(path) as store:
        receipts = store.get_many(ORG, KEYS)
    for receipt in receipts:
        assert receipt is not None
        assert receipt.status is ReceiptStatus.QUEUED
        assert receipt.lease_owner_run_id == holder[receipt.key]
        assert receipt.attempts == attempts


@pytest.mark.parametrize("start", ["new", "expired"])
def test_concurrency_processes_claim_each_key_once(tmp_path: Path, children: Any, start: str) -> None:
    path = tmp_path / "receipts.db"
    SqliteReceiptStore(path).close()
    if start == "expired":
        seed_expired_leases(path)  # every claim is now a racing reclaim (compare-and-set)
    runs = [f"proc-{i}" for i in range(4)]
    for i, run in enumerate(runs):
        children.start(_CLAIMER, [str(path), run, KEYS, BATCH, i])
    assert children.gather() == ["ready"] * len(runs)
    children.broadcast("go")
    reports = dict(zip(runs, children.gather(), strict=True))
    stderr = children.finish()

    assert {run: r["errors"] for run, r in reports.items()} == {run: [] for run in runs}
    assert [e for e in stderr if "locked" in e or "Traceback" in e] == []
    for report in reports.values():
        assert len(report["claimed"]) + report["others"] == len(KEYS)
    assert_claimed_once(path, {run: r["claimed"] for run, r in reports.items()}, 1 if start == "new" else 2)


def _claim_all(store: SqliteReceiptStore, run_id: str, seed: int) -> list[str]:
    keys = KEYS[:]
    random.Random(seed).shuffle(keys)
    claimed = []
    for start in range(0, len(keys), BATCH):
        claims = store.claim_many(
            ORG, requests(keys[start : start + BATCH]), Owner(run_id), lease_ttl_s=LEASE_TTL_S
        )
        claimed += [c.receipt.key for c in claims if c.disposition is ClaimDisposition.CLAIMED]
    return claimed


def _race_in_process(path: Path, shared: bool, spawn: Callable[[list[Callable[[], None]]], None]) -> None:
    workers = 8
    stores = [SqliteReceiptStore(path)] if shared else [SqliteReceiptStore(path) for _ in range(workers)]
    claimed_by: dict[str, list[str]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(workers)

    def worker(i: int) -> None:
        try:
            barrier.wait(timeout=60)
            claimed_by[f"worker-{i}"] = _claim_all(stores[i % len(stores)], f"worker-{i}", i)
        except BaseException as exc:  # reported below
            errors.append(exc)

    try:
        spawn([functools.partial(worker, i) for i in range(workers)])
    finally:
        for store in stores:
            store.close()
    assert errors == []
    assert len(claimed_by) == workers
    assert_claimed_once(path, claimed_by, 1)


def _threads(jobs: list[Callable[[], None]]) -> None:
    threads = [threading.Thread(target=job) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive()


def _greenlets(jobs: list[Callable[[], None]]) -> None:
    import gevent

    greenlets = [gevent.spawn(job) for job in jobs]
    done = gevent.joinall(greenlets, timeout=120)
    assert len(done) == len(jobs)


@pytest.mark.skipif(gevent_active(), reason="plain-threads run only (the gevent run uses greenlets)")
@pytest.mark.parametrize("shared", [True, False], ids=["one-store", "store-per-thread"])
def test_concurrency_threads_claim_each_key_once(tmp_path: Path, shared: bool) -> None:
    _race_in_process(tmp_path / "receipts.db", shared, _threads)


@pytest.mark.skipif(not gevent_active(), reason="needs a gevent monkey-patched run")
@pytest.mark.parametrize("shared", [True, False], ids=["one-store", "store-per-greenlet"])
def test_concurrency_greenlets_claim_each_key_once(tmp_path: Path, shared: bool) -> None:
    _race_in_process(tmp_path / "receipts.db", shared, _greenlets)


@pytest.mark.skipif(not gevent_active(), reason="needs a gevent monkey-patched run")
def test_concurrency_store_work_never_blocks_the_hub(tmp_path: Path) -> None:
    # The store's clock is read inside its transaction. This clock blocks its OS
    # thread until a greenlet on the hub releases it: if the SQLite work ran on the
    # hub, that greenlet could never run and the clock would time out.
    import gevent
    from gevent import monkey

    gate = monkey.get_original("_thread", "allocate_lock")()
    gate.acquire()
    opened: list[bool] = []

    def gated_clock() -> float:
        opened.append(gate.acquire(timeout=10))
        return time.time()

    with SqliteReceiptStore(tmp_path / "receipts.db", clock=gated_clock) as store:
        releaser = gevent.spawn(gate.release)
        (claim,) = store.claim_many(ORG, requests(KEYS[:1]), Owner("run-1"), lease_ttl_s=LEASE_TTL_S)
        releaser.join(timeout=10)
    assert opened == [True]
    assert claim.disposition is ClaimDisposition.CLAIMED
