"""A receipt whose stored output cannot be read back (its text edited by hand, damaged,
written by something else) fails the calls of that receipt alone: every other key of a
bulk read or claim is answered as usual, and a forced refresh replaces it. Contract
tests, every backend; the text is changed behind the store's back, as a person with
``sqlite-utils`` or ``psql`` would."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stores import (
    ClaimDisposition,
    ClaimMode,
    Completion,
    ReceiptStatus,
    ReceiptStore,
    UnreadableOutput,
    UnreadableOutputError,
    encode_output,
)

from .conftest import (
    ME,
    ON_DISK,
    ORG,
    FakeClock,
    claim,
    get,
    key_of,
    lease_of,
    make_completed,
    make_running,
    opened,
)

BAD_TEXTS = {
    "not-json": "{not json",
    "cut-short": '{"answer": [1, 2',
    "exact-form-broken": ' {"answer": NaN',
    "python-repr": "{'answer': 42}",
}


@pytest.fixture(params=ON_DISK, ids=[backend.id for backend in ON_DISK])
def store(request: pytest.FixtureRequest, tmp_path: Path, fake_clock: FakeClock) -> Iterator[ReceiptStore]:
    """An empty store of each backend whose rows can be edited from outside it (an
    in-memory SQLite database is its own connection's alone)."""
    yield from opened(request.param, tmp_path, fake_clock)


def _edit_sqlite(store: ReceiptStore, statement: str, params: tuple[Any, ...]) -> None:
    """Run ``statement`` on the SQLite store's file through a connection of our own, as a
    person with ``sqlite-utils`` would."""
    path = store.capabilities.file_path
    assert path is not None
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(statement, params)


def overwrite_output(store: ReceiptStore, key: str, text: str) -> None:
    """Change a receipt's stored output text directly in the database."""
    sql = "UPDATE {t} SET output = {p} WHERE org_id = {p} AND key = {p}"
    schema = getattr(store, "schema", None)
    if schema is not None:  # Postgres
        import psycopg

        from .conftest import PG_URL

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(sql.format(t=f'"{schema}".receipts', p="%s"), (text, ORG, key))
        return
    _edit_sqlite(store, sql.format(t="receipts", p="?"), (text, ORG, key))


@pytest.mark.parametrize("bad", list(BAD_TEXTS))
def test_unreadable_output_fails_no_other_key_of_a_bulk_read_or_claim(store: ReceiptStore, bad: str) -> None:
    keys = [key_of(f"unreadable-{i}") for i in range(5)]
    for i, key in enumerate(keys):
        make_completed(store, key, {"answer": i})
    overwrite_output(store, keys[2], BAD_TEXTS[bad])

    receipts = store.get_many(ORG, keys)
    assert [r.output if r else None for i, r in enumerate(receipts) if i != 2] == [
        {"answer": i} for i in (0, 1, 3, 4)
    ]
    broken = receipts[2]
    assert broken is not None and broken.status is ReceiptStatus.COMPLETED
    assert type(broken.output) is UnreadableOutput and broken.output.text == BAD_TEXTS[bad]
    with pytest.raises(UnreadableOutputError):
        encode_output(broken.output)

    claims = claim(store, keys)
    assert [c.disposition for c in claims] == [ClaimDisposition.REUSED] * 5
    assert type(claims[2].receipt.output) is UnreadableOutput
    reusable = store.read_reusable(ORG, keys)  # the text as stored: its reader finds it broken
    assert {k for k in reusable if k != keys[2]} == {k for i, k in enumerate(keys) if i != 2}
    assert reusable.get(keys[2], (None, BAD_TEXTS[bad]))[1] == BAD_TEXTS[bad]


def test_unreadable_output_is_replaced_by_a_forced_refresh(store: ReceiptStore) -> None:
    key = key_of("unreadable-refresh")
    make_completed(store, key, {"answer": 1})
    overwrite_output(store, key, "{not json")
    (forced,) = claim(store, [key], ME, mode=ClaimMode.FORCE_REFRESH)
    assert forced.disposition is ClaimDisposition.CLAIMED
    lease = lease_of(forced)
    assert store.mark_running_many(ORG, [lease], ME).ok
    assert store.complete_many(ORG, [Completion(key, lease.lease_id, {"answer": 2})], ME).ok
    stored: Any = get(store, key)
    assert stored.output == {"answer": 2}


def overwrite_status(store: ReceiptStore, key: str, status: str) -> None:
    schema = getattr(store, "schema", None)
    if schema is not None:
        import psycopg

        from .conftest import PG_URL

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'UPDATE "{schema}".receipts SET status = %s WHERE key = %s', (status, key))
        return
    _edit_sqlite(store, "UPDATE receipts SET status = ? WHERE key = ?", (status, key))


@pytest.mark.parametrize("mode", list(ClaimMode))
def test_unknown_status_reads_as_uncertain_and_fails_no_other_key(
    store: ReceiptStore, mode: ClaimMode
) -> None:
    """A status this code does not know (``done``, set by hand) is neither re-run nor reused
    silently, in any claim mode: it reads as uncertain, with an error saying why and how
    to decide it, and the other keys of the claim are answered as usual."""
    keys = [key_of(f"unknown-status-{i}") for i in range(4)]
    for i, key in enumerate(keys):
        make_completed(store, key, {"answer": i})
    overwrite_status(store, keys[1], "done")

    receipts = store.get_many(ORG, keys)
    odd = receipts[1]
    assert odd is not None and odd.status is ReceiptStatus.UNCERTAIN
    assert "'done'" in (odd.error or "") and "receipts resolve" in (odd.error or "")
    claims = claim(store, keys, mode=mode)
    assert claims[1].disposition is ClaimDisposition.UNCERTAIN
    others = [c.disposition for i, c in enumerate(claims) if i != 1]
    expected = ClaimDisposition.CLAIMED if mode is ClaimMode.FORCE_REFRESH else ClaimDisposition.REUSED
    assert others == [expected] * 3

    resolved = store.resolve(ORG, keys[1], "rerun", note="set by hand")
    assert resolved is not None and resolved.status is ReceiptStatus.COMPLETED  # it had an output
    assert claim(store, [keys[1]])[0].disposition is ClaimDisposition.REUSED


def edit_columns(store: ReceiptStore, key: str, assignments: str) -> None:
    """``UPDATE ... SET assignments`` on one receipt, behind the store's back."""
    sql = f"UPDATE {{t}} SET {assignments} WHERE org_id = {{p}} AND key = {{p}}"
    schema = getattr(store, "schema", None)
    if schema is not None:  # Postgres
        import psycopg

        from .conftest import PG_URL

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(sql.format(t=f'"{schema}".receipts', p="%s"), (ORG, key))
        return
    _edit_sqlite(store, sql.format(t="receipts", p="?"), (ORG, key))


ODD_COSTS = {
    "words": "'a lot'",
    "negative": "'-1 USD'",
    "no-currency": "'0.25'",
    "long-code": "'1 DOLLARS'",
    "integer": "42",  # SQLite keeps it a number
    "blob": "x'01'",
}


@pytest.mark.parametrize("odd", list(ODD_COSTS))
def test_a_cost_that_is_not_money_reads_as_none(store: ReceiptStore, odd: str) -> None:
    """A cost text set by hand that is not an amount of money reads as None (unknown):
    the receipt and the other keys of the read are answered as usual."""
    if odd in ("integer", "blob"):
        _sqlite_only(store)
    keys = [key_of(f"odd-cost-{i}") for i in range(3)]
    for i, key in enumerate(keys):
        make_completed(store, key, {"answer": i})
    edit_columns(store, keys[1], f"cost = {ODD_COSTS[odd]}")
    read = store.get_many(ORG, keys)
    assert [(r.status, r.output, r.cost) for r in read] == [  # type: ignore[union-attr]
        (ReceiptStatus.COMPLETED, {"answer": i}, None) for i in range(3)
    ]
    assert [c.disposition for c in claim(store, keys)] == [ClaimDisposition.REUSED] * 3


def test_completed_receipt_without_times_fails_no_other_key_of_a_stale_claim(store: ReceiptStore) -> None:
    keys = [key_of(f"no-times-{i}") for i in range(4)]
    for i, key in enumerate(keys):
        make_completed(store, key, {"answer": i})
    edit_columns(store, keys[1], "completed_at = NULL, updated_at = NULL")
    try:
        claims = claim(store, keys, stale_after_s=3600.0)
    except Exception as exc:
        pytest.fail(f"one receipt without times failed the whole claim: {type(exc).__name__}: {exc}")
    assert [c.disposition for i, c in enumerate(claims) if i != 1] == [ClaimDisposition.REUSED] * 3


def test_running_receipt_with_a_nan_lease_fails_no_other_key(store: ReceiptStore) -> None:
    if getattr(store, "schema", None) is None:
        pytest.skip("SQLite stores NaN as NULL")
    keys = [key_of(f"nan-lease-{i}") for i in range(4)]
    for i, key in enumerate(keys):
        make_completed(store, key, {"answer": i})
    odd = key_of("nan-lease-odd")
    make_running(store, odd)
    edit_columns(store, odd, "lease_expires_at = 'NaN'")
    try:
        claims = claim(store, [*keys, odd])
    except Exception as exc:
        pytest.fail(f"one NaN lease failed the whole claim: {type(exc).__name__}: {exc}")
    assert [c.disposition for c in claims[:4]] == [ClaimDisposition.REUSED] * 4


def test_running_receipt_with_a_text_lease_fails_no_other_key(store: ReceiptStore) -> None:
    if getattr(store, "schema", None) is not None:
        pytest.skip("Postgres types the column")
    keys = [key_of(f"text-lease-{i}") for i in range(4)]
    odd = key_of("text-lease-odd")
    make_running(store, odd)
    edit_columns(store, odd, "lease_expires_at = '2026-12-02 10:00:00'")
    try:
        claims = claim(store, [*keys, odd])
    except Exception as exc:
        pytest.fail(f"one text lease failed the whole claim: {type(exc).__name__}: {exc}")
    assert [c.disposition for c in claims[:4]] == [ClaimDisposition.CLAIMED] * 4


def test_a_receipt_uncertain_for_a_column_it_cannot_read_is_resolved_claimable(store: ReceiptStore) -> None:
    odd = key_of("resolve-odd-lease")
    make_running(store, odd)
    bad = "'NaN'" if getattr(store, "schema", None) is not None else "'2026-12-02 10:00:00'"
    edit_columns(store, odd, f"lease_expires_at = {bad}")
    (claimed,) = claim(store, [odd])
    assert claimed.disposition is ClaimDisposition.UNCERTAIN
    assert "lease_expires_at" in (claimed.receipt.error or "")
    resolved = store.resolve(ORG, odd, "rerun", note="by hand")
    assert resolved is not None and resolved.status is ReceiptStatus.PENDING
    assert claim(store, [odd])[0].disposition is ClaimDisposition.CLAIMED


def _sqlite_only(store: ReceiptStore) -> None:
    if getattr(store, "schema", None) is not None:
        pytest.skip("Postgres types the column")


ODD_GENERATIONS = {"text": "'abc'", "fraction": "2.5", "blob": "x'01'", "huge": "1e30"}


@pytest.mark.parametrize("action", ["rerun", "fail"])
@pytest.mark.parametrize("odd", list(ODD_GENERATIONS))
def test_a_receipt_uncertain_for_its_generation_is_resolved_readable(
    store: ReceiptStore, odd: str, action: str
) -> None:
    """Resolve left a generation it cannot read as it was, so the receipt read uncertain
    again right after (breaker round 3): it now starts again at 1."""
    _sqlite_only(store)
    key = key_of(f"odd-generation-{odd}")
    make_completed(store, key, {"answer": 1})
    edit_columns(store, key, f"generation = {ODD_GENERATIONS[odd]}")
    assert get(store, key).status is ReceiptStatus.UNCERTAIN
    resolved = store.resolve(ORG, key, action, note="by hand")
    assert resolved is not None and resolved.status is not ReceiptStatus.UNCERTAIN
    assert get(store, key).status is (ReceiptStatus.COMPLETED if action == "rerun" else ReceiptStatus.FAILED)
    expected = ClaimDisposition.REUSED if action == "rerun" else ClaimDisposition.CLAIMED
    assert claim(store, [key], mode=ClaimMode.RETRY_FAILED)[0].disposition is expected


@pytest.mark.parametrize("odd", ["completed_at = 'yesterday'", "completed_at = x'00'", "output = NULL"])
def test_a_rerun_resolve_never_makes_a_completed_receipt_of_no_readable_output(
    store: ReceiptStore, odd: str
) -> None:
    """An uncertain receipt whose completion time or output is not one a reader takes:
    resolved --rerun, it goes again (pending); it was made ``completed`` with no output,
    and the next claim reused nothing as the call's result."""
    if odd != "output = NULL":
        _sqlite_only(store)
    key = key_of(f"no-output-{odd}")
    make_completed(store, key, {"answer": 1})
    edit_columns(store, key, f"{odd}, status = 'done'")
    resolved = store.resolve(ORG, key, "rerun", note="by hand")
    assert resolved is not None and resolved.status is ReceiptStatus.PENDING
    assert claim(store, [key])[0].disposition is ClaimDisposition.CLAIMED


@pytest.mark.parametrize(
    "odd",
    ["completed_at = NULL, updated_at = NULL", "completed_at = 'yesterday'", "completed_at = x'00'",
     "output = x'7b7d'", "output = NULL", "input_hash = x'00'"],
)  # fmt: skip
def test_a_receipt_with_odd_columns_fails_no_other_key_of_a_plain_reusable_read(
    store: ReceiptStore, odd: str
) -> None:
    """The cold rerun's plain read (``read_reusable``): a text or missing completion time
    failed the whole bulk read with a TypeError (breaker round 3). That key is left to a
    claim, which reports it for that call alone; the others are read as usual."""
    if "x'" in odd or "'yesterday'" in odd:
        _sqlite_only(store)
    keys = [key_of(f"plain-read-{i}") for i in range(3)]
    for i, key in enumerate(keys):
        make_completed(store, key, {"answer": i})
    edit_columns(store, keys[1], odd)
    try:
        found = store.read_reusable(ORG, keys, stale_after_s=3600.0)
    except Exception as exc:
        pytest.fail(f"one odd receipt failed the whole read: {type(exc).__name__}: {exc}")
    assert set(found) == {keys[0], keys[2]}
    assert set(store.read_reusable(ORG, keys)) <= set(keys)  # no age asked: never raises either
    # a lone call's read (one key: a statement of its own) leaves it to the claim too
    assert store.read_reusable(ORG, keys[1:2], stale_after_s=3600.0) == {}
    assert set(store.read_reusable(ORG, keys[:1], stale_after_s=3600.0)) == {keys[0]}


ODD_LEASES = {  # backend -> the expiry set by hand (absent: the column cannot hold it)
    "far-future": {"sqlite": "1e12", "postgres": "1e12"},
    "text": {"sqlite": "'soon'"},
    "blob": {"sqlite": "x'00'"},
    "infinity": {"sqlite": "9e999", "postgres": "'Infinity'"},
    "nan": {"postgres": "'NaN'"},
}


@pytest.mark.parametrize("action", ["fail", "complete"])
@pytest.mark.parametrize("odd", list(ODD_LEASES))
def test_a_receipt_resolved_failed_or_completed_holds_no_lease_a_purge_keeps(
    store: ReceiptStore, odd: str, action: str
) -> None:
    """Resolve --fail (and a reconcile hook's complete) left the lease expiry as it was:
    a far one kept the decided receipt under a lease, and one that is not a number (read
    as none) kept it from every purge, which compares the column (a text, a BLOB, NaN
    or Infinity sorts after every time)."""
    backend = "postgres" if getattr(store, "schema", None) is not None else "sqlite"
    if backend not in ODD_LEASES[odd]:
        pytest.skip(f"the {backend} column cannot hold it")
    key = key_of(f"odd-lease-{odd}")
    make_running(store, key)
    edit_columns(store, key, f"lease_expires_at = {ODD_LEASES[odd][backend]}, status = 'done'")
    assert get(store, key).status is ReceiptStatus.UNCERTAIN  # type: ignore[union-attr]

    resolved = store.resolve(ORG, key, action, output={"answer": 1}, note="by hand")

    assert resolved is not None and resolved.status is not ReceiptStatus.UNCERTAIN
    assert resolved.lease_expires_at is None
    assert store.purge() == 1
    assert get(store, key) is None
