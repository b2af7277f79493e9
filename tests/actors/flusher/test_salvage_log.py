"""Salvage log tests on real files: permissions, round-trips, replay into a real SQLite store."""

from __future__ import annotations

import os
import stat
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any
from unittest import mock

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.flusher.held import request_entries
from actors.flusher.salvage import REPLAY_OWNER, SalvageEntry, SalvageLog, salvage_entry
from actors.messages import FlushCompletions
from stores import MAX_OUTPUT_BYTES, Money, SqliteReceiptStore
from stores.codec import encode_json
from stores.types import (
    ClaimMode,
    ClaimRequest,
    Completion,
    Failure,
    FailureKind,
    LeaseRef,
    Owner,
    ReceiptStatus,
)

ORG = "acme"
SCOPE = "enrich"
TOOL = "verify_email"
START = 1_700_000_000.0


def _entry(key: str, output: Any, *, org_id: str = ORG, attempts: int = 4) -> SalvageEntry:
    return salvage_entry(
        key=key,
        org_id=org_id,
        scope=SCOPE,
        tool_id=TOOL,
        input_hash=f"hash-{key}",
        output=output,
        attempts=attempts,
        first_error_at=START - 30.0,
        error="StoreError: disk I/O error",
    )


class _Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> _Clock:
    return _Clock()


@pytest.fixture
def store(tmp_path: Path, clock: _Clock) -> Any:
    with SqliteReceiptStore(tmp_path / "receipts.db", clock=clock) as opened:
        yield opened


def _claim(store: Any, key: str, owner: Owner, *, ttl_s: float = 60.0, org_id: str = ORG) -> LeaseRef:
    (claim,) = store.claim_many(
        org_id, [ClaimRequest(key, SCOPE, TOOL, f"hash-{key}")], owner, lease_ttl_s=ttl_s
    )
    assert claim.receipt.lease_id is not None
    lease = LeaseRef(key, claim.receipt.lease_id)
    assert store.mark_running_many(org_id, [lease], owner).ok
    return lease


# -- the file -------------------------------------------------------------------------


def test_salvage_log_file_is_owner_only(tmp_path: Path) -> None:
    log = SalvageLog(tmp_path / "salvage.jsonl")
    assert log.append([_entry("k1", {"ok": True})]) == 1
    assert stat.S_IMODE(os.stat(log.path).st_mode) == 0o600


def test_salvage_log_missing_file_has_no_entries(tmp_path: Path) -> None:
    log = SalvageLog(tmp_path / "nothing.jsonl")
    assert log.entries() == []
    assert log.append([]) == 0
    assert not os.path.exists(log.path)  # an empty append creates nothing


def test_salvage_log_torn_line_is_kept_and_does_not_hide_the_others(tmp_path: Path, store: Any) -> None:
    path = tmp_path / "salvage.jsonl"
    log = SalvageLog(path)
    log.append([_entry("before", {"n": 1})])

    with open(path, "ab") as fh:  # a crash mid-append leaves half a line, no newline
        fh.write(encode_json(_entry("torn", {"n": 2})).encode()[:40])
    log.append([_entry("after", {"n": 3})])  # must not be glued onto the torn line

    assert [e.receipt_key for e in log.entries()] == ["before", "after"]
    assert log.unreadable() == 1

    report = log.replay(store)

    assert (report.completed, report.kept, report.unreadable) == (2, 0, 1)
    assert [r.status for r in store.get_many(ORG, ["before", "after"])] == [ReceiptStatus.COMPLETED] * 2
    assert log.entries() == [] and log.unreadable() == 1  # left in the file for an operator
    assert b"torn" in path.read_bytes()


def test_salvage_log_round_trips_unicode_and_nested_outputs(tmp_path: Path) -> None:
    log = SalvageLog(tmp_path / "salvage.jsonl")
    first = [
        _entry(
            "k1", {"name": "Zoë Ünal ☃ 𝄞", "tags": ["naïve", "日本語"], "nested": {"a": [1, 2.5, None, True]}}
        ),
        _entry("k2", [{"deep": [[{"x": "y"}]]}, "ok"]),
    ]
    second = [_entry("k3", None), _entry("k4", "just a string"), _entry("k5", 42)]
    assert log.append(first) == 2
    assert log.append(second) == 3  # appends, never truncates
    assert log.entries() == first + second
    lines = Path(log.path).read_text(encoding="utf-8").splitlines()
    assert len(lines) == 5
    assert "☃" in lines[0]  # stored as UTF-8 text, one JSON object per line


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


_entries = st.lists(
    st.builds(
        SalvageEntry,
        receipt_key=st.text(min_size=1, max_size=12),
        org_id=st.just(ORG),
        scope=st.text(max_size=8),
        tool_id=st.just(TOOL),
        input_hash=st.text(max_size=8),
        output=_json,
        completion_attempts=st.integers(1, 10),
        first_error_at=st.floats(0, 2e9),
        error=st.text(max_size=40),
    ),
    max_size=3,
)


def test_salvage_log_round_trip_property() -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch.object(os, "fsync"),
    ):  # durability is not the point here
        path = os.path.join(tmp, "salvage.jsonl")

        @settings(max_examples=30, deadline=None)
        @given(batches=st.lists(_entries, max_size=2))
        def round_trip(batches: list[list[SalvageEntry]]) -> None:
            if os.path.exists(path):
                os.remove(path)
            log = SalvageLog(path)
            for batch in batches:
                assert log.append(batch) == len(batch)
            assert log.entries() == [entry for batch in batches for entry in batch]

        round_trip()


# -- replay ---------------------------------------------------------------------------


def test_salvage_replay_completes_a_key_with_no_receipt(tmp_path: Path, store: Any) -> None:
    log = SalvageLog(tmp_path / "salvage.jsonl")
    output = {"valid": True, "name": "Zoë"}
    log.append([_entry("fresh", output)])
    report = log.replay(store)
    assert (report.completed, report.already_completed, report.kept) == (1, 0, 0)
    (receipt,) = store.get_many(ORG, ["fresh"])
    assert receipt.status is ReceiptStatus.COMPLETED
    assert receipt.output == output
    assert receipt.input_hash == "hash-fresh"
    assert receipt.scope == SCOPE and receipt.tool_id == TOOL
    assert log.entries() == []


def test_salvage_replay_drops_a_key_completed_by_someone_else(tmp_path: Path, store: Any) -> None:
    other = Owner("run-2", 1)
    lease = _claim(store, "done", other)
    assert store.complete_many(ORG, [Completion("done", lease.lease_id, {"by": "run-2"})], other).ok
    log = SalvageLog(tmp_path / "salvage.jsonl")
    log.append([_entry("done", {"by": "salvage"})])
    report = log.replay(store)
    assert (report.completed, report.already_completed, report.kept) == (0, 1, 0)
    (receipt,) = store.get_many(ORG, ["done"])
    assert receipt.output == {"by": "run-2"}  # the stored output is left alone
    assert log.entries() == []


def _refresh(store: Any, key: str, owner: Owner, *, ttl_s: float = 5.0) -> Any:
    (claim,) = store.claim_many(
        ORG,
        [ClaimRequest(key, SCOPE, TOOL, f"hash-{key}")],
        owner,
        lease_ttl_s=ttl_s,
        mode=ClaimMode.FORCE_REFRESH,
    )
    assert store.mark_running_many(ORG, [LeaseRef(key, claim.receipt.lease_id)], owner).ok
    return claim.receipt


def _refresh_lost(store: Any, clock: _Clock, key: str) -> Any:
    """``key`` completed with {"v": "old"}; then a forced refresh claimed it (a new
    generation), its write failed and its lease lapsed; a normal claim put the old output
    back. Returns the refresh's claim (its generation, the completed_at it replaces)."""
    first = Owner("run-1", 1)
    lease = _claim(store, key, first)
    assert store.complete_many(ORG, [Completion(key, lease.lease_id, {"v": "old"})], first).ok
    refresh = _refresh(store, key, Owner("run-2", 1))
    clock.now += 6.0
    (back,) = store.claim_many(
        ORG, [ClaimRequest(key, SCOPE, TOOL, f"hash-{key}")], Owner("run-3", 1), lease_ttl_s=5.0
    )
    assert back.receipt.status is ReceiptStatus.COMPLETED and back.receipt.output == {"v": "old"}
    return refresh


def _salvaged(refresh: Any, key: str, output: Any, skew_s: float = 0.0, clock: Any = None) -> SalvageEntry:
    entry = attrs.evolve(_entry(key, output), generation=refresh.generation, replaces=refresh.completed_at)
    return attrs.evolve(entry, first_error_at=clock.now + skew_s) if clock is not None else entry


@pytest.mark.parametrize("skew_s", [0.0, -3600.0, 3600.0])
def test_salvage_replay_puts_back_a_refresh_newer_than_the_stored_output(
    tmp_path: Path, store: Any, clock: _Clock, skew_s: float
) -> None:
    """A forced refresh was paid for, its write failed and was salvaged, and the receipt
    went back to its older output. Replay stores the refresh (before: dropped as
    "already completed"), whatever the worker's clock says."""
    refresh = _refresh_lost(store, clock, "old")
    log = SalvageLog(tmp_path / "salvage.jsonl")
    log.append([_salvaged(refresh, "old", {"v": "refreshed"}, skew_s, clock)])
    report = log.replay(store)
    assert (report.completed, report.already_completed, report.kept) == (1, 0, 0)
    (receipt,) = store.get_many(ORG, ["old"])
    assert receipt.status is ReceiptStatus.COMPLETED and receipt.output == {"v": "refreshed"}
    assert receipt.lease_expires_at is None
    assert log.entries() == []


def test_salvage_replay_puts_back_a_refresh_after_a_later_refresh_failed_too(
    tmp_path: Path, store: Any, clock: _Clock
) -> None:
    """Refresh 2 was paid and salvaged; refresh 3 then failed at the provider: the
    receipt still holds the output refresh 2 replaces, so refresh 2 goes in."""
    refresh = _refresh_lost(store, clock, "k")
    third = _refresh(store, "k", Owner("run-4", 1))
    failed = Failure("k", third.lease_id, "503", FailureKind.TRANSIENT)
    assert store.fail_many(ORG, [failed], Owner("run-4", 1)).ok
    log = SalvageLog(tmp_path / "salvage.jsonl")
    log.append([_salvaged(refresh, "k", {"v": "refresh 2"})])
    assert log.replay(store).completed == 1
    assert store.get_many(ORG, ["k"])[0].output == {"v": "refresh 2"}


@pytest.mark.parametrize("skew_s", [0.0, -3600.0, 3600.0])
def test_salvage_replay_never_puts_an_older_output_over_a_newer_one(
    tmp_path: Path, store: Any, clock: _Clock, skew_s: float
) -> None:
    """Refresh 2 was salvaged; refresh 3 then succeeded, and refresh 4 failed and went
    back to refresh 3's output: refresh 2 is older and is dropped, as are entries of a
    normal call (nothing replaced) or from an older file, whatever the clocks say."""
    refresh = _refresh_lost(store, clock, "old")
    third = _refresh(store, "old", Owner("run-4", 1))
    clock.now += 1.0
    assert store.complete_many(
        ORG, [Completion("old", third.lease_id, {"v": "refresh 3"})], Owner("run-4", 1)
    ).ok
    fourth = _refresh(store, "old", Owner("run-5", 1))
    assert store.fail_many(
        ORG, [Failure("old", fourth.lease_id, "503", FailureKind.TRANSIENT)], Owner("run-5", 1)
    ).ok
    log = SalvageLog(tmp_path / "salvage.jsonl")
    log.append([
        _salvaged(refresh, "old", {"v": "refresh 2"}, skew_s, clock),
        attrs.evolve(_entry("old", {"v": "no replaces"}), first_error_at=clock.now + skew_s),
    ])  # fmt: skip
    report = log.replay(store)
    assert (report.completed, report.kept) == (0, 0)
    (receipt,) = store.get_many(ORG, ["old"])
    assert receipt.output == {"v": "refresh 3"}


def test_salvage_replay_of_several_entries_for_one_key_keeps_the_latest_generation(
    tmp_path: Path, store: Any, clock: _Clock
) -> None:
    """The newest paid output of a call wins, wherever it sits in the file (an entry
    salvaged at stop can land before an older one still on the flusher's ladder)."""
    refresh = _refresh_lost(store, clock, "dup")
    log = SalvageLog(tmp_path / "salvage.jsonl")
    log.append([_salvaged(refresh, "dup", {"v": "refreshed"})])
    older = attrs.evolve(_salvaged(refresh, "dup", {"v": "older"}), generation=refresh.generation - 1)
    log.append([older])
    report = log.replay(store)
    # the older entry is superseded, not "already completed" (it was counted so)
    assert (report.completed, report.already_completed, report.kept, report.superseded) == (1, 0, 0, 1)
    (receipt,) = store.get_many(ORG, ["dup"])
    assert receipt.output == {"v": "refreshed"}


@pytest.mark.parametrize("bad", ["not json", "\x00\x01", '{"cut": '])
def test_salvage_replay_puts_back_an_output_over_a_stored_one_nobody_can_read(
    tmp_path: Path, store: Any, bad: str
) -> None:
    """The receipt is completed, but its stored output cannot be read back (changed by
    hand, damaged): the salvaged entry holds the only readable copy of a paid result. It
    was dropped as "already completed"; it now replaces the unreadable one."""
    import sqlite3

    from stores.codec import UnreadableOutput

    other = Owner("run-2", 1)
    lease = _claim(store, "k", other)
    assert store.complete_many(ORG, [Completion("k", lease.lease_id, {"v": "stored"})], other).ok
    with sqlite3.connect(tmp_path / "receipts.db") as conn:
        conn.execute("UPDATE receipts SET output = ? WHERE key = 'k'", (bad,))
    (broken,) = store.get_many(ORG, ["k"])
    assert type(broken.output) is UnreadableOutput
    log = SalvageLog(tmp_path / "salvage.jsonl")
    log.append([_entry("k", {"v": "salvaged"})])
    report = log.replay(store)
    assert (report.completed, report.already_completed, report.kept) == (1, 0, 0)
    (receipt,) = store.get_many(ORG, ["k"])
    assert receipt.status is ReceiptStatus.COMPLETED and receipt.output == {"v": "salvaged"}
    assert log.entries() == []


def test_salvage_replay_keeps_a_key_under_another_owners_live_lease(tmp_path: Path, store: Any) -> None:
    other = Owner("run-2", 1)
    lease = _claim(store, "busy", other, ttl_s=60.0)
    log = SalvageLog(tmp_path / "salvage.jsonl")
    kept = _entry("busy", {"by": "salvage"})
    log.append([kept])
    report = log.replay(store)
    assert (report.completed, report.already_completed, report.kept) == (0, 0, 1)
    (receipt,) = store.get_many(ORG, ["busy"])
    assert receipt.status is ReceiptStatus.RUNNING
    assert receipt.lease_id == lease.lease_id  # the live lease was not stolen
    assert receipt.owner == other
    assert log.entries() == [kept]


def test_salvage_replay_reclaims_an_expired_lease(tmp_path: Path, store: Any, clock: _Clock) -> None:
    _claim(store, "stale", Owner("run-dead", 1), ttl_s=5.0)
    clock.now += 6.0  # the owner died; its lease expired
    log = SalvageLog(tmp_path / "salvage.jsonl")
    log.append([_entry("stale", {"v": 1})])
    report = log.replay(store)
    assert (report.completed, report.kept) == (1, 0)
    (receipt,) = store.get_many(ORG, ["stale"])
    assert receipt.status is ReceiptStatus.COMPLETED and receipt.output == {"v": 1}


def test_salvage_replay_completes_a_failed_receipt(tmp_path: Path, store: Any) -> None:
    other = Owner("run-2", 1)
    lease = _claim(store, "failed", other)
    failure = Failure("failed", lease.lease_id, "lease lost mid-call", FailureKind.TRANSIENT)
    assert store.fail_many(ORG, [failure], other).ok
    log = SalvageLog(tmp_path / "salvage.jsonl")
    log.append([_entry("failed", {"v": 2})])
    assert log.replay(store).completed == 1
    (receipt,) = store.get_many(ORG, ["failed"])
    assert receipt.status is ReceiptStatus.COMPLETED and receipt.output == {"v": 2}


def test_salvage_replay_mixed_counts_and_rewrites_only_kept_entries(tmp_path: Path, store: Any) -> None:
    other = Owner("run-2", 1)
    done = _claim(store, "done", other)
    store.complete_many(ORG, [Completion("done", done.lease_id, "theirs")], other)
    _claim(store, "busy", other)
    _claim(store, "busy-globex", other, org_id="globex")
    log = SalvageLog(tmp_path / "salvage.jsonl")
    busy = _entry("busy", "ours-busy")
    busy_globex = _entry("busy-globex", "ours-globex", org_id="globex")
    log.append([_entry("new-1", "ours-1"), _entry("done", "ours-done"), busy])
    log.append([_entry("new-2", {"n": [1, 2]}), busy_globex, _entry("new-3", "globex-3", org_id="globex")])
    report = log.replay(store)
    assert (report.completed, report.already_completed, report.kept) == (3, 1, 2)
    assert sorted(e.receipt_key for e in log.entries()) == ["busy", "busy-globex"]
    assert set(map(repr, log.entries())) == {repr(busy), repr(busy_globex)}
    assert stat.S_IMODE(os.stat(log.path).st_mode) == 0o600
    new_1, new_2 = store.get_many(ORG, ["new-1", "new-2"])
    assert (new_1.output, new_2.output) == ("ours-1", {"n": [1, 2]})
    (globex_3,) = store.get_many("globex", ["new-3"])
    assert globex_3.output == "globex-3"
    assert store.get_many(ORG, ["new-3"]) == [None]  # never written into another org
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_salvage_replay_leaves_no_replay_lease_behind(tmp_path: Path, store: Any) -> None:
    log = SalvageLog(tmp_path / "salvage.jsonl")
    log.append([_entry("k", 1)])
    log.replay(store)
    (receipt,) = store.get_many(ORG, ["k"])
    assert receipt.lease_id is None or receipt.owner == REPLAY_OWNER
    assert receipt.status is ReceiptStatus.COMPLETED
    # a later run reuses the replayed output instead of calling the provider again
    (claim,) = store.claim_many(
        ORG,
        [ClaimRequest("k", SCOPE, TOOL, "hash-k")],
        Owner("run-3", 1),
        lease_ttl_s=60.0,
        mode=ClaimMode.NORMAL,
    )
    assert claim.disposition.value == "reused"
    assert claim.receipt.output == 1


def test_salvage_replay_twice_is_idempotent(tmp_path: Path, store: Any) -> None:
    log = SalvageLog(tmp_path / "salvage.jsonl")
    log.append([_entry("k", {"v": 1})])
    assert log.replay(store).completed == 1
    log.append([_entry("k", {"v": "again"})])  # salvaged twice (e.g. a retried flush)
    report = log.replay(store)
    assert (report.completed, report.already_completed, report.kept) == (0, 1, 0)
    assert store.get_many(ORG, ["k"])[0].output == {"v": 1}


def test_salvage_entry_without_lease_id_still_reads(tmp_path: Path) -> None:
    # files written before entries carried a lease id
    path = tmp_path / "salvage.jsonl"
    path.write_text(
        '{"receipt_key":"k","org_id":"acme","scope":"enrich","tool_id":"t","input_hash":"h",'
        '"output":{"v":1},"completion_attempts":2,"first_error_at":1.5,"error":"boom"}\n',
        encoding="utf-8",
    )
    (entry,) = SalvageLog(path).entries()
    assert entry.lease_id is None and entry.output == {"v": 1} and entry.completion_attempts == 2


def test_salvage_keeps_what_a_call_cost_through_the_file_and_its_replay(tmp_path: Path, store: Any) -> None:
    """A salvaged completion's cost is written to the file (Money's text form) and by the
    replay to the receipt, whichever way it is replayed (under the lease it was salvaged
    from, or claimed anew); a line of an older file, without a cost, replays with none."""
    run = Owner("run-1", 1)
    paid, other = Money(Decimal("0.00250"), "USD"), Money(Decimal("3"), "EUR")
    lease = _claim(store, "held", run)
    flush = FlushCompletions(
        org_id=ORG, owner=run, entries=(Completion("held", lease.lease_id, {"v": 1}, cost=paid),),
        tool_id=TOOL, input_hashes={"held": "hash-held"}, reply=None,
    )  # fmt: skip
    log = SalvageLog(tmp_path / "salvage.jsonl")
    log.append([*request_entries(flush, SCOPE, "store down"), _entry_costing("fresh", other)])
    text = Path(log.path).read_text(encoding="utf-8")
    assert '"cost":"0.00250 USD"' in text and '"cost":"3 EUR"' in text
    with open(log.path, "a", encoding="utf-8") as fh:  # written before entries carried a cost
        fh.write(
            '{"receipt_key":"old","org_id":"acme","scope":"enrich","tool_id":"verify_email",'
            '"input_hash":"hash-old","output":{"v":3},"completion_attempts":2,"first_error_at":1.5,'
            '"error":"boom"}\n'
        )
    assert [e.cost for e in log.entries()] == ["0.00250 USD", "3 EUR", None]
    assert log.replay(store).completed == 3
    held, fresh, old = store.get_many(ORG, ["held", "fresh", "old"])
    assert (held.output, held.cost, str(held.cost)) == ({"v": 1}, paid, "0.00250 USD")
    assert (fresh.output, fresh.cost) == ({"v": 2}, other)
    assert (old.status, old.output, old.cost) == (ReceiptStatus.COMPLETED, {"v": 3}, None)


def _entry_costing(key: str, cost: Money) -> SalvageEntry:
    return salvage_entry(
        key=key, org_id=ORG, scope=SCOPE, tool_id=TOOL, input_hash=f"hash-{key}", output={"v": 2},
        attempts=1, first_error_at=START, error="StoreError: disk I/O error", cost=cost,
    )  # fmt: skip


def test_salvage_replay_completes_under_the_lease_it_was_salvaged_from(tmp_path: Path, store: Any) -> None:
    run = Owner("run-1", 1)
    lease = _claim(store, "ours", run, ttl_s=60.0)  # still live: the write failed, not the lease
    log = SalvageLog(tmp_path / "salvage.jsonl")
    log.append([attrs.evolve(_entry("ours", {"v": "late"}), lease_id=lease.lease_id)])
    report = log.replay(store)
    assert (report.completed, report.kept) == (1, 0)
    (receipt,) = store.get_many(ORG, ["ours"])
    assert receipt.status is ReceiptStatus.COMPLETED and receipt.output == {"v": "late"}
    assert log.entries() == []


def test_salvage_replay_keeps_an_entry_whose_lease_was_taken_by_a_live_owner(
    tmp_path: Path, store: Any, clock: _Clock
) -> None:
    old = _claim(store, "taken", Owner("run-1", 1), ttl_s=5.0)
    clock.now += 6.0
    new = _claim(store, "taken", Owner("run-2", 1), ttl_s=60.0)  # reclaimed, now live
    log = SalvageLog(tmp_path / "salvage.jsonl")
    log.append([attrs.evolve(_entry("taken", "stale output"), lease_id=old.lease_id)])
    report = log.replay(store)
    assert (report.completed, report.kept) == (0, 1)
    (receipt,) = store.get_many(ORG, ["taken"])
    assert receipt.lease_id == new.lease_id and receipt.status is ReceiptStatus.RUNNING


class _AppendsDuringReplay:
    """A store whose first read lets another process append to the salvage file."""

    def __init__(self, store: Any, path: str, line: str) -> None:
        self._store, self._path, self._line = store, path, line

    def get_many(self, org_id: str, keys: Any) -> Any:
        if self._line:
            fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)  # as another process would
            try:
                os.write(fd, self._line.encode("utf-8"))
            finally:
                os.close(fd)
            self._line = ""
        return self._store.get_many(org_id, keys)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_salvage_replay_keeps_entries_appended_while_it_ran(tmp_path: Path, store: Any) -> None:
    log = SalvageLog(tmp_path / "salvage.jsonl")
    log.append([_entry("first", 1)])
    late = _entry("late", {"paid": "for"})
    racing = _AppendsDuringReplay(store, log.path, encode_json(late) + "\n")
    report = log.replay(racing)
    assert report.completed == 1
    assert log.entries() == [late]  # not lost by the rewrite
    assert log.replay(store).completed == 1
    assert store.get_many(ORG, ["late"])[0].output == {"paid": "for"}


def test_salvage_logs_on_one_path_share_one_lock(tmp_path: Path) -> None:
    # two DispatchSystems on one store file share the default salvage file: one's
    # replay must not interleave with the other's append
    first = SalvageLog(tmp_path / "salvage.jsonl")
    second = SalvageLog(str(tmp_path / "." / "salvage.jsonl"))
    assert first.lock is second.lock
    assert SalvageLog(tmp_path / "other.jsonl").lock is not first.lock


# -- what a claim asks of the file before it judges a receipt (issue 26) ----------------


def test_salvage_salvaged_names_the_keys_held_and_sees_appends_and_replays(
    tmp_path: Path, store: Any
) -> None:
    log = SalvageLog(tmp_path / "salvage.jsonl")
    assert log.salvaged(ORG, ["a", "b"]) == set()  # no file yet
    log.append([_entry("a", 1), _entry("c", 3, org_id="globex")])
    assert log.salvaged(ORG, ["a", "b", "c"]) == {"a"}  # by org
    # another process (or another system in this one) appends: seen at the next look
    SalvageLog(tmp_path / "salvage.jsonl").append([_entry("b", 2)])
    assert log.salvaged(ORG, ["a", "b"]) == {"a", "b"}
    log.append([attrs.evolve(_entry("d", "described"), output_form="described")])
    assert log.salvaged(ORG, ["d"]) == set()  # kept for an operator: never replayed
    SalvageLog(tmp_path / "salvage.jsonl").replay(store)  # replayed elsewhere: gone
    assert log.salvaged(ORG, ["a", "b", "d"]) == set()


def test_salvage_replay_completes_a_receipt_judged_uncertain_for_its_own_lease(
    tmp_path: Path, store: Any, clock: _Clock
) -> None:
    """A worker that could not see the salvage file judged the receipt after its lease
    expired (not retry-safe: uncertain); the entry is the outcome it was uncertain of."""
    lease = _claim(store, "paid", Owner("run-1", 1), ttl_s=5.0)
    clock.now += 6.0
    (judged,) = store.claim_many(
        ORG, [ClaimRequest("paid", SCOPE, TOOL, "hash-paid", retry_safe=False)], Owner("run-2", 1),
        lease_ttl_s=60.0,
    )  # fmt: skip
    assert judged.receipt.status is ReceiptStatus.UNCERTAIN and judged.receipt.lease_id == lease.lease_id
    log = SalvageLog(tmp_path / "salvage.jsonl")
    log.append([attrs.evolve(_entry("paid", {"v": "paid"}), lease_id=lease.lease_id)])
    report = log.replay(store)
    assert (report.completed, report.kept) == (1, 0)
    (receipt,) = store.get_many(ORG, ["paid"])
    assert receipt.status is ReceiptStatus.COMPLETED and receipt.output == {"v": "paid"}


def test_salvage_replay_leaves_an_uncertain_receipt_of_another_lease_alone(
    tmp_path: Path, store: Any, clock: _Clock
) -> None:
    old = _claim(store, "other", Owner("run-1", 1), ttl_s=5.0)
    clock.now += 6.0
    _claim(store, "other", Owner("run-2", 1), ttl_s=5.0)  # a later execution, itself lost
    clock.now += 6.0
    store.claim_many(
        ORG, [ClaimRequest("other", SCOPE, TOOL, "hash-other", retry_safe=False)], Owner("run-3", 1),
        lease_ttl_s=60.0,
    )  # fmt: skip
    log = SalvageLog(tmp_path / "salvage.jsonl")
    log.append([attrs.evolve(_entry("other", "first run's"), lease_id=old.lease_id)])
    assert log.replay(store).kept == 1  # uncertain about run-2's call: the operator decides
    assert store.get_many(ORG, ["other"])[0].status is ReceiptStatus.UNCERTAIN


def test_salvage_replay_leaves_an_output_over_the_cap_and_its_failed_receipt_alone(
    tmp_path: Path, store: Any
) -> None:
    """The store refused the output (over 32 MiB) and the receipt was recorded failed:
    a replay (run before every claim of the key) must not make it claimable again."""
    run = Owner("run-1", 1)
    lease = _claim(store, "huge", run)
    failure = Failure("huge", lease.lease_id, "over the output cap", FailureKind.OUTPUT_TOO_LARGE)
    assert store.fail_many(ORG, [failure], run).ok
    log = SalvageLog(tmp_path / "salvage.jsonl")
    big = {"blob": "x" * (MAX_OUTPUT_BYTES + 1)}
    log.append([attrs.evolve(_entry("huge", big), lease_id=lease.lease_id)])
    assert log.salvaged(ORG, ["huge"]) == set()
    report = log.replay(store)
    assert (report.completed, report.kept) == (0, 1)
    (receipt,) = store.get_many(ORG, ["huge"])
    assert receipt.status is ReceiptStatus.FAILED and receipt.failure_kind is FailureKind.OUTPUT_TOO_LARGE
    assert [e.receipt_key for e in log.entries()] == ["huge"]  # kept for an operator
