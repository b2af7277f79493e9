"""Opening a SqliteReceiptStore: permissions, bad files, schema, inspection (issue 2 section 4)."""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils

from stores import (
    BatchRecord,
    ClaimMode,
    ClaimRequest,
    Completion,
    Failure,
    FailureKind,
    LeaseRef,
    Money,
    Owner,
    SchemaVersionError,
    SqliteReceiptStore,
    StoreCorruptError,
    StoreError,
    StoreUnavailableError,
)
from stores.sqlite.schema import SCHEMA_VERSION

OWNER = Owner("run-1")
ISSUE_COLUMNS = {
    "key", "org_id", "scope", "tool_id", "status", "input_hash", "output", "error", "failure_kind",
    "lease_id", "lease_owner_run_id", "lease_owner_attempt", "lease_expires_at", "attempts",
    "created_at", "updated_at", "completed_at",
}  # fmt: skip


def requests(n: int) -> list[ClaimRequest]:
    return [ClaimRequest(f"{i:064x}", "play", "tool", "0" * 64) for i in range(n)]


def user_version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


@pytest.fixture
def umask_zero() -> Iterator[None]:
    """Run with umask 0, so only the store's own choice can make files private."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_sqlite_open_files_are_owner_only(tmp_path: Path, umask_zero: None) -> None:
    path = tmp_path / "receipts.db"
    store = SqliteReceiptStore(path)
    try:
        store.claim_many("org", requests(3), OWNER, lease_ttl_s=60)  # a write makes -wal and -shm
        files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
        assert all(f.exists() for f in files)
        assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in files} == {f.name: 0o600 for f in files}
    finally:
        store.close()


def _malformed(tmp_path: Path) -> bytes:
    path = tmp_path / "real.db"
    SqliteReceiptStore(path).close()
    data = bytearray(path.read_bytes())
    data[100:] = random.Random(1).randbytes(len(data) - 100)  # keep the header, scramble the pages
    return bytes(data)


CORRUPT = {
    "random_bytes": lambda tmp: random.Random(0).randbytes(8192),
    "text": lambda tmp: b"hello, not a database\n" * 200,
    "malformed_pages": _malformed,
}


@pytest.mark.parametrize("kind", list(CORRUPT))
def test_sqlite_open_corrupt_file_raises_corrupt_error(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "corrupt.db"
    content = CORRUPT[kind](tmp_path)
    path.write_bytes(content)
    with pytest.raises(StoreCorruptError) as info:
        SqliteReceiptStore(path)
    assert isinstance(info.value, StoreError)
    assert str(path) in str(info.value)
    assert path.read_bytes() == content  # never "repaired" or overwritten


def test_sqlite_open_newer_schema_raises_schema_version_error(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    SqliteReceiptStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(SchemaVersionError) as info:
        SqliteReceiptStore(path)
    assert isinstance(info.value, StoreError)
    assert str(path) in str(info.value) and "99" in str(info.value)
    assert user_version(path) == 99


def test_sqlite_open_newer_schema_in_plain_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "plain.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(SchemaVersionError):
        SqliteReceiptStore(path)
    assert sqlite_utils.Database(path).table_names() == []  # nothing was migrated


def test_sqlite_open_missing_directory_raises_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "dir" / "receipts.db"
    with pytest.raises(StoreUnavailableError) as info:
        SqliteReceiptStore(path)
    assert str(path) in str(info.value)
    assert not (tmp_path / "no").exists()


def test_sqlite_open_of_a_file_another_connection_locked_says_so(tmp_path: Path) -> None:
    """Another connection holds the file's lock (``BEGIN EXCLUSIVE``): the error says so,
    not "check the directory exists and is writable" (the directory is fine)."""
    path = tmp_path / "receipts.db"
    SqliteReceiptStore(path).close()
    locker = sqlite3.connect(path, isolation_level=None)
    try:
        locker.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StoreUnavailableError) as info:
            SqliteReceiptStore(path, busy_timeout_s=0.1)
    finally:
        locker.close()
    text = str(info.value)
    assert "database is locked" in text and "another connection holds a lock on the file" in text, text
    assert "check the directory exists" not in text, text
    SqliteReceiptStore(path).close()  # the lock gone, it opens


def test_sqlite_open_directory_path_raises_unavailable(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailableError) as info:
        SqliteReceiptStore(tmp_path)
    assert str(tmp_path) in str(info.value)


_UNWRITABLE_CHILD = """
import json, os, sys
from stores import SqliteReceiptStore  # import everything first: then drop privileges
directory, names, uid = (json.loads(arg) for arg in sys.argv[1:])
if uid is not None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
try:
    open(os.path.join(directory, "probe"), "w").close()
    writable = True
except PermissionError:
    writable = False
results = {}
for name in names:
    try:
        SqliteReceiptStore(os.path.join(directory, name)).close()
        results[name] = ["opened", ""]
    except Exception as exc:
        results[name] = [type(exc).__name__, str(exc)]
print(json.dumps({"uid": os.getuid(), "writable": writable, "results": results}))
"""

NOBODY = 65534


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    """A directory others can enter but not write (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="tooldispatch-ro-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        path.chmod(0o755)
        shutil.rmtree(path)


def test_sqlite_open_unwritable_directory_raises_unavailable(world_readable_dir: Path, children: Any) -> None:
    # Root bypasses permissions, so as root the child drops to "nobody" (after its
    # imports, so the interpreter need not be reachable by nobody); otherwise the
    # directory is made read-only for its owner.
    directory = world_readable_dir
    existing = directory / "existing.db"
    SqliteReceiptStore(existing).close()  # a store that exists, rw for all, in a read-only dir
    assert not Path(f"{existing}-wal").exists()
    existing.chmod(0o666)
    names = ["new.db", "existing.db"]
    as_root = os.geteuid() == 0
    if not as_root:
        directory.chmod(0o500)
    proc = children.start(_UNWRITABLE_CHILD, [str(directory), names, NOBODY if as_root else None])
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    report = json.loads(out)
    assert report["uid"] == (NOBODY if as_root else os.getuid())
    assert report["writable"] is False  # the setup really denies writes
    for name in names:
        kind, message = report["results"][name]
        assert kind == "StoreUnavailableError", (name, kind, message)
        assert str(directory / name) in message
    assert not (directory / "new.db").exists()


_OPEN_RACE_CHILD = """
import json, sys
from stores import SqliteReceiptStore
print(json.dumps("ready"), flush=True)
for line in sys.stdin:
    answers = []
    for path in json.loads(line):
        try:
            SqliteReceiptStore(path).close()
            answers.append("ok")
        except Exception as exc:
            answers.append(f"{type(exc).__name__}: {exc}")
    print(json.dumps(answers), flush=True)
"""


def test_sqlite_open_new_file_from_racing_processes(tmp_path: Path, children: Any) -> None:
    # Processes open the same NEW files at the same instant: one line to every child
    # is the start barrier, then each opens the round's files in the same order. A
    # lost race is rare per file, hence several rounds of several files.
    processes, rounds, files = 4, 5, 3
    for _ in range(processes):
        children.start(_OPEN_RACE_CHILD, [])
    assert children.gather() == ["ready"] * processes
    failures = []
    for round_ in range(rounds):
        paths = [tmp_path / f"race-{round_}-{i}.db" for i in range(files)]
        children.broadcast([str(p) for p in paths])
        failures += [a for answers in children.gather() for a in answers if a != "ok"]
        for path in paths:
            assert user_version(path) == SCHEMA_VERSION
            assert sqlite_utils.Database(path)["receipts"].exists()
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert failures == []
    assert all("locked" not in err for err in children.finish())


def test_sqlite_open_waits_for_another_opener_of_a_new_file(tmp_path: Path) -> None:
    # Another process is still creating the file (rollback journal, write lock held).
    # SQLite does not call the busy handler when switching such a file to WAL, so the
    # store must wait for the lock itself instead of failing with "database is locked".
    path = tmp_path / "receipts.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE other_opener (x)")
    other.execute("BEGIN IMMEDIATE")
    releaser = threading.Timer(0.2, other.execute, ("COMMIT",))  # the other opener's transaction
    releaser.start()
    try:
        store = SqliteReceiptStore(path, busy_timeout_s=30)
        store.close()
    finally:
        releaser.join()
        other.close()
    assert user_version(path) == SCHEMA_VERSION
    assert sqlite_utils.Database(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_sqlite_file_is_inspectable_with_sqlite_utils(tmp_path: Path) -> None:
    path = tmp_path / "receipts.db"
    store = SqliteReceiptStore(path)
    try:
        claims = store.claim_many("org", requests(3), OWNER, lease_ttl_s=60)
        first = claims[0].receipt
        assert store.complete_many("org", [Completion(first.key, first.lease_id or "", {"ok": 1})], OWNER).ok
        db = sqlite_utils.Database(path)
        table = db.table("receipts")
        assert table.count == 3
        assert set(table.columns_dict) >= ISSUE_COLUMNS
        assert table.pks == ["org_id", "key"]
        assert user_version(path) == SCHEMA_VERSION
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        row = table.get(("org", first.key))
        assert json.loads(row["output"]) == {"ok": 1} and row["status"] == "completed"
        cli = subprocess.run(
            [sys.executable, "-m", "sqlite_utils", "query", str(path),
             "select status, count(*) as n from receipts group by status order by status"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert json.loads(cli.stdout) == [{"status": "completed", "n": 1}, {"status": "queued", "n": 2}]
    finally:
        store.close()


@pytest.mark.parametrize("where", ["file", "memory"])
def test_sqlite_closed_store_raises_store_error(tmp_path: Path, where: str) -> None:
    store = SqliteReceiptStore(tmp_path / "r.db" if where == "file" else ":memory:")
    (claim,) = store.claim_many("org", requests(1), OWNER, lease_ttl_s=60)
    lease = LeaseRef(claim.receipt.key, claim.receipt.lease_id or "")
    store.close()
    store.close()  # closing twice is harmless
    calls: dict[str, Callable[[], object]] = {
        "claim_many": lambda: store.claim_many("org", requests(1), OWNER, lease_ttl_s=60),
        "mark_running_many": lambda: store.mark_running_many("org", [lease], OWNER),
        "renew_leases": lambda: store.renew_leases("org", [lease], OWNER, lease_ttl_s=60),
        "complete_many": lambda: store.complete_many(
            "org", [Completion(lease.key, lease.lease_id, 1)], OWNER
        ),
        "fail_many": lambda: store.fail_many(
            "org", [Failure(lease.key, lease.lease_id, "e", FailureKind.TIMEOUT)], OWNER
        ),
        "release": lambda: store.release("org", [lease], OWNER),
        "get_many": lambda: store.get_many("org", [lease.key]),
        "purge": lambda: store.purge(),
    }
    for name, call in calls.items():
        with pytest.raises(StoreError, match="closed"):
            call()
        assert name


def test_sqlite_store_reopens_with_its_receipts(tmp_path: Path) -> None:
    path = tmp_path / "receipts.db"
    with SqliteReceiptStore(path) as store:
        (claim,) = store.claim_many("org", requests(1), OWNER, lease_ttl_s=60)
    with SqliteReceiptStore(path) as again:
        assert again.get_many("org", [claim.receipt.key]) == [claim.receipt]
    assert user_version(path) == SCHEMA_VERSION


def test_sqlite_open_migrates_a_version_1_file_keeping_its_receipts(tmp_path: Path) -> None:
    """A file written before issue 9 (schema 1) opens as schema 2: receipts kept, generation 1,
    lease owner identity empty, purge epoch 0; its completed outputs are reused."""
    from stores.sqlite.schema import create_v1

    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path, isolation_level=None)
    create_v1(sqlite_utils.Database(conn))
    conn.execute("PRAGMA user_version = 1")
    conn.execute(
        "INSERT INTO receipts (key, org_id, scope, tool_id, status, input_hash, output, lease_id, "
        "lease_owner_run_id, lease_owner_attempt, attempts, created_at, updated_at, completed_at) "
        "VALUES (?, 'org', 'play', 'tool', 'completed', ?, '{\"v\":1}', 'l1', 'run-0', 1, 1, 1.0, 1.0, 1.0)",
        ("a" * 64, "0" * 64),
    )
    conn.close()
    with SqliteReceiptStore(path) as store:
        (receipt,) = store.get_many("org", ["a" * 64])
        assert receipt is not None and receipt.output == {"v": 1}
        assert (receipt.generation, receipt.lease_owner_host, receipt.lease_owner_pid) == (1, None, None)
        assert store.purge_epoch() == 0
        (claim,) = store.claim_many(
            "org", [ClaimRequest("a" * 64, "play", "tool", "0" * 64)], OWNER, lease_ttl_s=5
        )
        assert claim.disposition.value == "reused"
    assert user_version(path) == SCHEMA_VERSION == 5


def test_sqlite_open_migrates_a_version_2_file_and_receipts_then_keep_their_input(tmp_path: Path) -> None:
    """A file written before receipts kept their inputs (schema 2) opens as schema 5: its
    receipts are kept and read with no input recorded; a claim writing one records it."""
    from stores.sqlite.schema import add_v2, create_v1

    path = tmp_path / "v2.db"
    conn = sqlite3.connect(path, isolation_level=None)
    db = sqlite_utils.Database(conn)
    create_v1(db)
    add_v2(db)
    conn.execute("PRAGMA user_version = 2")
    conn.execute(
        "INSERT INTO receipts (key, org_id, scope, tool_id, status, input_hash, error, failure_kind, "
        "attempts, created_at, updated_at, generation) "
        "VALUES (?, 'org', 'play', 'tool', 'failed', ?, 'boom', 'transient', 1, 1.0, 1.0, 1)",
        ("b" * 64, "0" * 64),
    )
    conn.close()
    with SqliteReceiptStore(path) as store:
        (old,) = store.get_many("org", ["b" * 64])
        assert old is not None and old.status.value == "failed" and old.input_text is None
        (claim,) = store.claim_many(
            "org",
            [ClaimRequest("b" * 64, "play", "tool", "0" * 64, input_text='{"domain":"lemonde.fr"}')],
            OWNER,
            lease_ttl_s=5,
            mode=ClaimMode.RETRY_FAILED,
        )
        assert claim.disposition.value == "claimed"
        assert store.get_many("org", ["b" * 64])[0].input_text == '{"domain":"lemonde.fr"}'  # type: ignore[union-attr]
    assert user_version(path) == SCHEMA_VERSION == 5


@pytest.mark.parametrize("version", [2, 3])
def test_sqlite_open_migrates_an_older_file_to_batch_records_keeping_its_receipts(
    tmp_path: Path, version: int
) -> None:
    """A file written before issue 26 (schema 2, or 3 with receipts' inputs) opens as
    schema 5: ``receipts.batch_key`` and table ``batches`` are added, its receipts kept
    (a running one is taken over as before, alone, its input kept), and batch requests
    are recorded from then on."""
    from stores.sqlite.schema import add_v2, add_v3, create_v1

    path = tmp_path / f"v{version}.db"
    conn = sqlite3.connect(path, isolation_level=None)
    db = sqlite_utils.Database(conn)
    create_v1(db)
    add_v2(db)
    if version == 3:
        add_v3(db)
    conn.execute(f"PRAGMA user_version = {version}")
    conn.execute(
        "INSERT INTO receipts (key, org_id, scope, tool_id, status, input_hash, lease_id, "
        "lease_owner_run_id, lease_owner_attempt, lease_expires_at, attempts, created_at, updated_at, "
        "generation) VALUES ('k1', 'org', 'play', 'tool', 'running', 'h', 'l1', 'dead', 1, 1.0, 1, 1, 1, 3)"
    )
    if version == 3:
        conn.execute("UPDATE receipts SET input_text = '\"a.fr\"'")
    conn.close()
    with SqliteReceiptStore(path) as store:
        (claim,) = store.claim_many("org", [ClaimRequest("k1", "play", "tool", "h")], OWNER, lease_ttl_s=30)
        assert claim.disposition.value == "claimed" and claim.batch is None
        assert (claim.receipt.generation, claim.receipt.batch_key) == (3, None)
        assert claim.receipt.input_text == ('"a.fr"' if version == 3 else None)
        (more,) = store.claim_many("org", [ClaimRequest("k2", "play", "tool", "h")], OWNER, lease_ttl_s=30)
        leases = [LeaseRef(c.receipt.key, c.receipt.lease_id or "") for c in (claim, more)]
        record = BatchRecord(key="b1", tool_id="tool", members=("k1", "k2"), inputs=("1", "2"))
        assert store.mark_running_many("org", leases, OWNER, batches=[record]).ok
        assert [r.batch_key for r in store.get_many("org", ["k1", "k2"])] == ["b1", "b1"]  # type: ignore[union-attr]
    assert user_version(path) == SCHEMA_VERSION == 5
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT batch_key, tool_id FROM batches").fetchall() == [("b1", "tool")]


def test_sqlite_open_migrates_a_version_4_file_adding_cost_keeping_its_receipts(tmp_path: Path) -> None:
    """A file written before receipts kept what their calls cost (schema 4) opens as schema
    5: ``receipts.cost`` is added, NULL in every receipt already there (read as None), the
    receipts otherwise as they were; a completion from then on records its cost."""
    from stores.sqlite.schema import add_v2, add_v3, add_v4, create_v1

    path = tmp_path / "v4.db"
    conn = sqlite3.connect(path, isolation_level=None)
    db = sqlite_utils.Database(conn)
    for step in (create_v1, add_v2, add_v3, add_v4):
        step(db)
    conn.execute("PRAGMA user_version = 4")
    conn.execute(
        "INSERT INTO receipts (key, org_id, scope, tool_id, status, input_hash, output, attempts, "
        "created_at, updated_at, completed_at, generation, input_text, batch_key) VALUES "
        "('k1', 'org', 'play', 'tool', 'completed', 'h', '{\"v\":1}', 1, 1.0, 2.0, 2.0, 3, '\"a\"', 'b1')"
    )
    conn.close()
    with SqliteReceiptStore(path) as store:
        (old,) = store.get_many("org", ["k1"])
        assert old is not None and old.cost is None
        assert (old.status.value, old.output, old.completed_at) == ("completed", {"v": 1}, 2.0)
        assert old.generation == 3
        assert (old.input_text, old.batch_key) == ('"a"', "b1")
        (claim,) = store.claim_many("org", [ClaimRequest("k2", "play", "tool", "h")], OWNER, lease_ttl_s=30)
        lease = claim.receipt.lease_id or ""
        paid = Money(Decimal("0.0025"), "USD")
        assert store.complete_many("org", [Completion("k2", lease, {"v": 2}, cost=paid)], OWNER).ok
        assert [r.cost for r in store.get_many("org", ["k1", "k2"])] == [None, paid]  # type: ignore[union-attr]
    assert user_version(path) == SCHEMA_VERSION == 5
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT key, cost FROM receipts ORDER BY key").fetchall()
    assert rows == [("k1", None), ("k2", "0.0025 USD")]
