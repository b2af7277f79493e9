"""Races between store handles of their own, as workers have: each racer its own
connection (a SQLite store instance on the same file, a Postgres store on the same
schema), started together at a barrier. One store instance shared by the racers would
run their calls one after another (SQLite: its one connection is serialised; that is
what the instance's lock is for), so it can never show what two transactions do to
each other: these can. Every key gets exactly one winner per race and every request an
answer, whatever the order the racers take the keys in.

Threads here; greenlets under gevent (SQLite work runs on the hub's threads, Postgres
waits cooperatively on its sockets, so the racers' statements overlap in the database
either way).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from stores import (
    ClaimDisposition,
    ClaimMode,
    Completion,
    Failure,
    FailureKind,
    LeaseRef,
    Owner,
    ReceiptStatus,
    ReceiptStore,
    RefusalReason,
    SqliteReceiptStore,
)
from stores.sqlite.offload import gevent_active

from .conftest import BACKENDS, ORG, TTL_S, Backend, FakeClock, claim, key_of, lease_of, require_backend

RACERS = 6
ROUNDS = 5
"""Races per test, each on keys of its own: a broken store loses some races by chance,
and five in a row (on these machines) leave it no chance to pass."""
CHUNK = 20
CLAIMED = ClaimDisposition.CLAIMED


def keys_of(round_: int) -> list[str]:
    return [key_of(f"race-{round_}-{i}") for i in range(120)]


@attrs.frozen
class Handles:
    """Store handles on one database, each with its own connection."""

    open: Callable[[], ReceiptStore]
    clock: FakeClock


def _reopen(backend: Backend, first: ReceiptStore, tmp_path: Path, clock: FakeClock) -> ReceiptStore:
    if backend.id == "sqlite-file":
        return SqliteReceiptStore(tmp_path / "receipts.db", clock=clock)
    from stores import PostgresReceiptStore

    from .conftest import PG_URL

    return PostgresReceiptStore(PG_URL, schema=first.schema, clock=clock, max_size=1)  # type: ignore[attr-defined]


SHARED = [b for b in BACKENDS if b.id in ("sqlite-file", "postgres")]
"""Backends whose data a second handle can open (an in-memory SQLite store cannot)."""


@pytest.fixture(params=SHARED, ids=[b.id for b in SHARED])
def handles(request: pytest.FixtureRequest, tmp_path: Path, fake_clock: FakeClock) -> Iterator[Handles]:
    backend: Backend = request.param
    require_backend(backend)
    first = backend.make(tmp_path, fake_clock)
    opened = [first]

    def open_() -> ReceiptStore:
        store = _reopen(backend, first, tmp_path, fake_clock)
        opened.append(store)
        return store

    try:
        yield Handles(open_, fake_clock)
    finally:
        for store in opened:
            store.close()
        backend.drop(first)


def race(jobs: list[Callable[[], Any]]) -> list[Any]:
    """Run the jobs at once (threads, or greenlets under gevent); their results in order."""
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(jobs))

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=60)
            results[i] = jobs[i]()
        except BaseException as exc:  # reported below
            errors.append(exc)

    if gevent_active():
        import gevent

        greenlets = [gevent.spawn(run, i) for i in range(len(jobs))]
        assert len(gevent.joinall(greenlets, timeout=120)) == len(jobs)
    else:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
            assert not thread.is_alive()
    assert errors == [], errors
    return results


def _claim_all(
    store: ReceiptStore, owner: Owner, keys: list[str], seed: int, mode: ClaimMode = ClaimMode.NORMAL
) -> dict[str, Any]:
    """Claim every key, in chunks, in an order of this racer's own: key -> disposition."""
    keys = keys[:]
    random.Random(seed).shuffle(keys)
    out = {}
    for start in range(0, len(keys), CHUNK):
        chunk = keys[start : start + CHUNK]
        for key, result in zip(chunk, claim(store, chunk, owner, mode=mode), strict=True):
            out[key] = result.disposition
    return out


def _owners() -> list[Owner]:
    return [Owner(f"racer-{i}", 1) for i in range(RACERS)]


def _one_winner_each(
    answers: list[dict[str, Any]], owners: list[Owner], store: ReceiptStore, keys: list[str]
) -> dict[str, str]:
    """Every key claimed by exactly one racer, who holds its lease in the store."""
    winners: dict[str, str] = {}
    for owner, got in zip(owners, answers, strict=True):
        assert set(got) == set(keys), "a request got no answer"
        for key, disposition in got.items():
            if disposition is CLAIMED:
                assert key not in winners, f"{key} claimed by {winners[key]} and {owner.run_id}"
                winners[key] = owner.run_id
    assert set(winners) == set(keys), f"{len(keys) - len(winners)} keys claimed by nobody"
    for receipt in store.get_many(ORG, keys):
        assert receipt is not None and receipt.lease_owner_run_id == winners[receipt.key]
    return winners


def _claimers(stores: list[ReceiptStore], owners: list[Owner], keys: list[str], mode: ClaimMode) -> list[Any]:
    return [
        lambda s=s, o=o, i=i: _claim_all(s, o, keys, i, mode)
        for i, (s, o) in enumerate(zip(stores, owners, strict=True))
    ]


def test_races_new_keys_are_claimed_once_in_any_order(handles: Handles) -> None:
    owners = _owners()
    stores = [handles.open() for _ in owners]
    for round_ in range(ROUNDS):
        keys = keys_of(round_)
        answers = race(_claimers(stores, owners, keys, ClaimMode.NORMAL))
        _one_winner_each(answers, owners, stores[0], keys)
        for got in answers:  # the losers were told another live owner runs it
            assert set(got.values()) <= {CLAIMED, ClaimDisposition.RUNNING}


def test_races_expired_leases_are_reclaimed_once(handles: Handles) -> None:
    seed = handles.open()
    owners = _owners()
    stores = [handles.open() for _ in owners]
    for round_ in range(ROUNDS):
        keys = keys_of(round_)
        claim(seed, keys, Owner("run-crashed"))
        handles.clock.advance(TTL_S + 1)
        _one_winner_each(race(_claimers(stores, owners, keys, ClaimMode.NORMAL)), owners, seed, keys)
        assert {r.attempts for r in seed.get_many(ORG, keys) if r is not None} == {2}


@pytest.mark.parametrize("mode", [ClaimMode.FORCE_REFRESH, ClaimMode.RETRY_FAILED])
def test_races_a_rerun_of_settled_receipts_is_claimed_once(handles: Handles, mode: ClaimMode) -> None:
    seed = handles.open()
    first = Owner("run-first")
    owners = _owners()
    stores = [handles.open() for _ in owners]
    for round_ in range(ROUNDS):
        keys = keys_of(round_)
        leases = [lease_of(c) for c in claim(seed, keys, first)]
        if mode is ClaimMode.FORCE_REFRESH:
            completions = [Completion(lease.key, lease.lease_id, {"old": lease.key}) for lease in leases]
            assert seed.complete_many(ORG, completions, first).ok
        else:
            failures = [Failure(lease.key, lease.lease_id, "503", FailureKind.TRANSIENT) for lease in leases]
            assert seed.fail_many(ORG, failures, first).ok
        _one_winner_each(race(_claimers(stores, owners, keys, mode)), owners, seed, keys)
        if mode is ClaimMode.FORCE_REFRESH:  # the old output is kept until a new one is stored
            assert all(r is not None and r.output == {"old": r.key} for r in seed.get_many(ORG, keys))


@pytest.mark.parametrize("write", ["complete", "renew", "mark_running"])
def test_races_the_late_owners_write_or_a_reclaim_wins_never_both(handles: Handles, write: str) -> None:
    """The owner's lease ran out (nobody took it yet): its late write and other workers'
    reclaims race. Per key, either the write lands and nobody claims, or one reclaim wins
    and the write is refused as lease lost."""
    late = Owner("run-late")
    mine = handles.open()
    owners = _owners()[: RACERS - 1]
    stores = [handles.open() for _ in owners]
    for round_ in range(ROUNDS):
        keys = keys_of(round_)
        leases = [lease_of(c) for c in claim(mine, keys, late)]
        if write != "mark_running":
            assert mine.mark_running_many(ORG, leases, late).ok
        handles.clock.advance(TTL_S + 1)
        jobs: list[Callable[[], Any]] = [lambda leases=leases: _write_all(mine, late, leases, write)]
        applied, *answers = race(jobs + _claimers(stores, owners, keys, ClaimMode.NORMAL))
        stored = {r.key: r for r in mine.get_many(ORG, keys) if r is not None}
        for key in keys:
            claimers = [o.run_id for o, got in zip(owners, answers, strict=True) if got[key] is CLAIMED]
            if applied[key]:
                assert claimers == [], f"{key}: the late {write} landed and {claimers} claimed it too"
                if write == "complete":
                    assert stored[key].status is ReceiptStatus.COMPLETED and stored[key].output == {
                        "late": key
                    }
                else:
                    assert stored[key].lease_owner_run_id == late.run_id
            else:
                assert len(claimers) == 1, f"{key}: refused as lost, yet claimed by {claimers}"
                assert stored[key].lease_owner_run_id == claimers[0]


def _write_all(store: ReceiptStore, owner: Owner, leases: list[LeaseRef], write: str) -> dict[str, bool]:
    """The late owner's ``write`` of every lease, in chunks: key -> whether it applied."""
    order = leases[:]
    random.Random(99).shuffle(order)
    applied: dict[str, bool] = {}
    for start in range(0, len(order), CHUNK):
        chunk = order[start : start + CHUNK]
        if write == "complete":
            outputs = [Completion(x.key, x.lease_id, {"late": x.key}) for x in chunk]
            report = store.complete_many(ORG, outputs, owner)
        elif write == "renew":
            report = store.renew_leases(ORG, chunk, owner, lease_ttl_s=TTL_S)
        else:
            report = store.mark_running_many(ORG, chunk, owner, lease_ttl_s=TTL_S)
        for lease in chunk:
            refusal = report.refused.get(lease.key)
            assert refusal is None or refusal.reason is RefusalReason.LEASE_LOST, refusal
            applied[lease.key] = refusal is None
    return applied
