"""SQLite receipt store (the embedded default), built on sqlite-utils.

One file, WAL mode, a busy timeout, ``BEGIN IMMEDIATE`` for every write. Each bulk
operation is one transaction whose statements carry all keys at once through
``json_each(?)`` (never ``executemany`` with RETURNING, which differs across Python
3.10-3.13). Under gevent the work runs on the hub's threadpool.

Group commit (:meth:`SqliteReceiptStore.write_together`): every SQLite write transaction
pays a fixed price (taking the write lock, the commit's WAL frames and index update, and
under threads a wait for the GIL after each statement) that a handful of keys cannot
spread: a fenced write of 12 keys costs ~175 µs alone here, ~15 µs a key, where 1,000
keys cost ~8.5 µs a key. Under load the receipt store actor finds many small writes
waiting in its inbox (marks running from the lifecycles, completions from the flusher)
and runs them as one transaction, each inside a savepoint of its own, so one call's
error rolls back that call alone and is answered to it alone, as if it had run by itself. Inspect a file with
the sqlite-utils CLI, for instance ``sqlite-utils rows receipts.db receipts --limit 5``
or ``sqlite-utils query receipts.db "select status, count(*) from receipts group by 1"``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import attrs
import orjson

from stores.base import FENCED_WRITES, Clock, Outcome, ReceiptStore, StoreCapabilities
from stores.claims import batch_members_wanted, plan_claims, settled_by_read
from stores.codec import encode_output
from stores.errors import StoreError
from stores.fenced import FenceItem, refusal
from stores.money import Money
from stores.rows import DEFAULT_PURGE, batch_from_row, batch_row, error_text, read_cost, receipt_from_row
from stores.rules import resolved_as_failed
from stores.sqlite.conn import bound_wal, open_connection, store_error
from stores.sqlite.offload import BlockingRunner
from stores.sqlite.schema import rollback
from stores.sqlite.sql import (
    _BATCHES_BY_KEYS,
    _BUMP_PURGE_EPOCH,
    _BY_KEYS,
    _FENCE,
    _INSERT_BATCH,
    _PURGE_BATCHES,
    _READ_AHEAD,
    _READ_AHEAD_START,
    _RESOLVE,
    _RESOLVE_FAILED_REFRESH,
    _RESTORE_COMPLETED,
    _REUSABLE,
    _REUSABLE_ONE,
    _SET_BATCH_KEY,
    _SET_COMPLETE,
    _SET_FAIL,
    _SET_RELEASE,
    _SET_RENEW,
    _SET_RUNNING,
    _SET_RUNNING_RENEW,
    _SET_UNCERTAIN,
    _SET_UNCERTAIN_LOST,
    _UPSERT_CLAIMS,
)
from stores.types import (
    BatchRecord,
    Claim,
    ClaimMode,
    ClaimRequest,
    FenceReport,
    Owner,
    Receipt,
    ReceiptStatus,
    Refusal,
    ResolveAction,
)

__all__ = ["WAL_SIZE_LIMIT_BYTES", "SqliteReceiptStore"]

T = TypeVar("T")

WAL_SIZE_LIMIT_BYTES = 64 * 1024 * 1024
"""Default bound on the WAL file once checkpoints resume (64 MiB)."""


_SET = {
    "running": (_SET_RUNNING, 1),
    "running_renew": (_SET_RUNNING_RENEW, 3),
    "renew": (_SET_RENEW, 3),
    "complete": (_SET_COMPLETE, 2),
    "fail": (_SET_FAIL, 1),
    "uncertain": (_SET_UNCERTAIN, 1),
    "release": (_SET_RELEASE, 1),
}
"""Fenced write -> (its SET clause, how many time parameters it takes: now; now, now;
now, ttl, now)."""


class SqliteReceiptStore(ReceiptStore):
    """Receipt store in one SQLite file (or ``":memory:"``).

    Args:
        path: the database file; created owner-read/write only (0600) if missing.
        clock: the store's clock, epoch seconds (injectable for tests).
        busy_timeout_s: how long a write waits for another process's lock, seconds.
        wal_size_limit_bytes: the WAL file's size once checkpoints can run again. A long
            reader (another connection holding a snapshot) makes the WAL grow past it;
            the first write after the reader ends checkpoints and truncates it
            (``PRAGMA wal_checkpoint(TRUNCATE)`` without waiting for readers), and
            ``PRAGMA journal_size_limit`` caps what a reset WAL keeps (SQLite docs, "Write-Ahead
            Logging" section 6, and the pragma's page).

    Raises:
        StoreUnavailableError: the directory is missing or not writable.
        StoreCorruptError: the file is not a SQLite database.
        SchemaVersionError: the file was written by a newer tooldispatch.
    """

    capabilities = StoreCapabilities(
        group_commit=True, claims_into_running=True, batch_records=True, bounded_waits=True
    )
    """Group commit, claims into running, batch records; each instance adds its ``file_path``."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock = time.time,
        busy_timeout_s: float = 30.0,
        wal_size_limit_bytes: int = WAL_SIZE_LIMIT_BYTES,
    ) -> None:
        self.path = os.fspath(path)
        self.clock = clock
        file_path = None if self.path == ":memory:" else self.path
        self.capabilities = attrs.evolve(type(self).capabilities, file_path=file_path)
        self.wal_size_limit_bytes = wal_size_limit_bytes
        self._wal_path = None if self.path == ":memory:" else self.path + "-wal"
        self._busy_ms = int(busy_timeout_s * 1000)
        self._run = BlockingRunner()
        self._conn: sqlite3.Connection | None = None
        self._run(self._open, busy_timeout_s)
        self._read_run = BlockingRunner()
        self._reader: sqlite3.Connection | None = None
        """A second connection for plain reads on callers' threads (:meth:`read_reusable`):
        under WAL it reads the last commit without waiting for the writer's lock or turn."""
        self._together = False
        """True while :meth:`write_together` runs its calls: each call's :meth:`_write`
        is then a savepoint of that one transaction."""
        self._undo_failed = False
        """A call of :meth:`write_together` whose savepoint could not be rolled back: the
        whole transaction must go."""

    def __repr__(self) -> str:
        return f"SqliteReceiptStore({self.path!r})"

    # -- connection -------------------------------------------------------------------

    def _open(self, busy_timeout_s: float) -> None:
        self._conn = open_connection(self.path, busy_timeout_s, self.wal_size_limit_bytes)

    def renewal_handle(self) -> SqliteReceiptStore:
        """A new store on the same file with its own connection, opened on the calling
        thread (which, under gevent, has no hub: its work then runs inline there). An
        in-memory store has one database per connection: it is shared (``self``)."""
        if self.path == ":memory:":
            return self
        return SqliteReceiptStore(
            self.path,
            clock=self.clock,
            busy_timeout_s=self._busy_ms / 1000.0,
            wal_size_limit_bytes=self.wal_size_limit_bytes,
        )

    def close(self) -> None:
        """Close the connections; later calls raise StoreError."""
        if self._conn is not None:
            self._run(self._conn.close)
            self._conn = None
        self._read_run(self._close_reader)

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    @contextlib.contextmanager
    def _write(self, wait_s: float | None = None) -> Iterator[sqlite3.Connection]:
        """A write transaction; its ``BEGIN IMMEDIATE`` waits for another connection's
        lock at most ``wait_s`` seconds (None: the busy timeout; never longer)."""
        conn = self._connection()
        if self._together:  # one call of write_together's transaction
            with self._savepoint(conn):
                yield conn
            return
        conn = self._open_for_write()
        wait_ms = self._busy_ms if wait_s is None else max(0, min(self._busy_ms, int(wait_s * 1000)))
        if wait_ms == self._busy_ms:
            conn.execute("BEGIN IMMEDIATE")
        else:
            conn.execute(f"PRAGMA busy_timeout = {wait_ms}")
            try:
                conn.execute("BEGIN IMMEDIATE")
            finally:
                conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            self._end_failed(conn)
            raise
        self._bound_wal(conn)

    def _open_for_write(self) -> sqlite3.Connection:
        """The connection, with no transaction left open by an earlier failure (a write
        never builds on one)."""
        conn = self._connection()
        if conn.in_transaction and not rollback(conn):
            conn = self._reconnect()
        return conn

    def _end_failed(self, conn: sqlite3.Connection) -> None:
        """End a failed write's transaction; if even ROLLBACK fails, the connection is
        closed (SQLite then discards the transaction) and another opened."""
        if not rollback(conn):
            self._reconnect()

    def _reconnect(self) -> sqlite3.Connection:
        with contextlib.suppress(sqlite3.Error):
            self._connection().close()
        self._open(self._busy_ms / 1000.0)
        return self._connection()

    def _bound_wal(self, conn: sqlite3.Connection) -> None:
        if self._wal_path is not None:
            bound_wal(conn, self._wal_path, self.wal_size_limit_bytes, self._busy_ms)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"{self.path}: the receipt store is closed")
        return self._conn

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return self._run(fn, *args)
        except sqlite3.Error as exc:
            raise store_error(self.path, exc) from exc

    # -- reads ------------------------------------------------------------------------

    def _rows(self, conn: sqlite3.Connection, org_id: str, keys: Iterable[str]) -> dict[str, Receipt]:
        cursor = conn.execute(_BY_KEYS, (org_id, orjson.dumps(list(keys)).decode()))
        return {row[0]: receipt_from_row(row) for row in cursor}

    def _batches(self, conn: sqlite3.Connection, org_id: str, keys: Iterable[str]) -> dict[str, BatchRecord]:
        cursor = conn.execute(_BATCHES_BY_KEYS, (org_id, orjson.dumps(list(keys)).decode()))
        return {row[0]: batch_from_row(row) for row in cursor}

    def get_many(self, org_id: str, keys: Sequence[str]) -> list[Receipt | None]:
        found = self._call(lambda: self._rows(self._connection(), org_id, keys))
        return [found.get(key) for key in keys]

    def read_reusable(
        self, org_id: str, keys: Sequence[str], *, stale_after_s: float | None = None
    ) -> dict[str, tuple[str, str, Money | None]]:
        def read(conn: sqlite3.Connection) -> dict[str, tuple[str, str, Money | None]]:
            if len(keys) == 1:
                rows = conn.execute(_REUSABLE_ONE, (org_id, keys[0]))
            else:
                rows = conn.execute(_REUSABLE, (org_id, orjson.dumps(list(keys)).decode()))
            now = self.clock()
            return {
                key: (input_hash, text, None if cost is None else read_cost(cost))
                for key, input_hash, text, at, cost in rows
                if stale_after_s is None or now - at <= stale_after_s
            }

        return self._plain_read(read)

    def read_completed_since(
        self,
        org_id: str,
        tool_id: str,
        *,
        after: tuple[float, str] | None,
        keys: Sequence[str] = (),
        limit: int,
        max_bytes: int,
    ) -> list[tuple[str, str, str, float, Money | None]] | None:
        def read(conn: sqlite3.Connection) -> list[tuple[str, str, str, float, Money | None]]:
            if after is None:
                (start,) = conn.execute(
                    _READ_AHEAD_START, (org_id, orjson.dumps(list(keys)).decode())
                ).fetchone()
                if start is None:
                    return []
                since, last = start, ""
            else:
                since, last = after
            rows, size = [], 0
            for key, input_hash, text, at, cost in conn.execute(
                _READ_AHEAD, (since, since, last, org_id, tool_id, limit)
            ):
                rows.append((key, input_hash, text, at, None if cost is None else read_cost(cost)))
                size += len(text)
                if size >= max_bytes:  # (rows are stepped one by one: the rest is never read)
                    break
            return rows

        return self._plain_read(read)

    def _plain_read(self, read: Callable[[sqlite3.Connection], T]) -> T:
        """``read(conn)`` on the reader connection, under its own lock: never behind a
        write that waits for the file's lock (another process's) or the writer's turn. An
        in-memory store has one database per connection: its reads take the writer's."""
        if self._wal_path is None:
            return self._call(lambda: read(self._connection()))  # type: ignore[no-any-return]

        def run() -> T:
            if self._conn is None:
                raise StoreError(f"{self.path}: the receipt store is closed")
            if self._reader is None:
                reader = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                reader.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
                reader.execute("PRAGMA query_only = 1")  # the file is opened (and migrated) by the writer's
                self._reader = reader
            return read(self._reader)

        try:
            return self._read_run(run)
        except sqlite3.Error as exc:
            raise store_error(self.path, exc) from exc

    # -- claims -----------------------------------------------------------------------

    def claim_many(
        self,
        org_id: str,
        requests: Sequence[ClaimRequest],
        owner: Owner,
        *,
        lease_ttl_s: float,
        mode: ClaimMode = ClaimMode.NORMAL,
        stale_after_s: float | None = None,
        running: Collection[str] = frozenset(),
        wait_s: float | None = None,
    ) -> list[Claim]:
        unique = {request.key: request for request in reversed(requests)}
        args = (org_id, list(unique.values()), owner, lease_ttl_s, mode, stale_after_s, running, wait_s)
        decided: dict[str, Claim] = self._call(self._claim, *args)
        return [decided[request.key] for request in requests]

    def _claim(
        self,
        org_id: str,
        requests: list[ClaimRequest],
        owner: Owner,
        lease_ttl_s: float,
        mode: ClaimMode,
        stale_after_s: float | None,
        running: Collection[str] = frozenset(),
        wait_s: float | None = None,
    ) -> dict[str, Claim]:
        decided: dict[str, Claim] = {}
        if mode is not ClaimMode.FORCE_REFRESH:  # settled receipts: a plain read, no lock
            existing = self._rows(self._connection(), org_id, (r.key for r in requests))
            if existing:
                decided, requests = settled_by_read(requests, existing, self.clock(), mode, stale_after_s)
                if not requests:
                    return decided
        with self._write(wait_s) as conn:
            now = self.clock()
            existing = self._rows(conn, org_id, (r.key for r in requests))
            batches: dict[str, BatchRecord] = {}
            wanted = batch_members_wanted(requests, existing)
            if wanted:  # members recorded in a batch request: taken with the whole request
                batches = self._batches(conn, org_id, wanted)
                more = {m for record in batches.values() for m in record.members if m not in existing}
                if more:
                    existing.update(self._rows(conn, org_id, more))
            plan = plan_claims(
                org_id, requests, existing, owner, now, lease_ttl_s, mode, stale_after_s, running, batches
            )
            if plan.writes:
                host, pid, started_at = plan.identity
                params = (
                    org_id,
                    owner.run_id,
                    owner.run_attempt,
                    now + lease_ttl_s,
                    now,
                    host,
                    pid,
                    started_at,
                )
                conn.execute(_UPSERT_CLAIMS, (*params, orjson.dumps(plan.writes).decode()))
            if plan.restored:
                conn.execute(_RESTORE_COMPLETED, (now, org_id, orjson.dumps(plan.restored).decode()))
            if plan.lost:
                conn.execute(_SET_UNCERTAIN_LOST, (now, orjson.dumps(plan.lost).decode(), org_id))
        if decided:
            decided.update(plan.decided)
            return decided
        return plan.decided

    # -- fenced writes ----------------------------------------------------------------

    def _fence(
        self,
        org_id: str,
        owner: Owner,
        op: str,
        items: list[FenceItem],
        refused: dict[str, Refusal],
        idempotent_status: ReceiptStatus | None = None,
        ttl_s: float | None = None,
        batches: Sequence[BatchRecord] = (),
        wait_s: float | None = None,
    ) -> FenceReport:
        keys = [item[0] for item in items]
        set_sql, arity = _SET[op]
        now = self.clock()
        set_params = (now,) if arity == 1 else (now, now) if arity == 2 else (now, ttl_s, now)

        def work() -> FenceReport:
            with self._write(wait_s) as conn:
                applied: set[str] = set()
                if items:
                    sql = _FENCE.format(set=set_sql)
                    payload = orjson.dumps(items).decode()
                    params = (payload, *set_params, org_id, owner.run_id, owner.run_attempt)
                    applied = {row[0] for row in conn.execute(sql, params)}
                missed = [item for item in items if item[0] not in applied]
                if missed:
                    stored = self._rows(conn, org_id, (item[0] for item in missed))
                    for item in missed:
                        why = refusal(stored.get(item[0]), item[1], owner, idempotent_status)
                        if why is None:
                            applied.add(item[0])
                        else:
                            refused[item[0]] = why
                for record in batches:  # recorded only when every member's lease held
                    if applied.issuperset(record.members):
                        conn.execute(_INSERT_BATCH, (org_id, *batch_row(record), now))
                        members = orjson.dumps(record.members).decode()
                        conn.execute(_SET_BATCH_KEY, (record.key, org_id, members))
            return FenceReport(tuple(k for k in keys if k in applied), refused)

        return self._call(work)  # type: ignore[no-any-return]

    # -- group commit -----------------------------------------------------------------

    def write_together(self, calls: Sequence[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> list[Outcome]:
        """Run fenced writes (``(method, args, kwargs)``, methods in
        :data:`~stores.base.FENCED_WRITES`) in one transaction, each in a savepoint.

        A subclass that overrides a fenced write runs inside that transaction: what it
        does after ``super()`` happens before the COMMIT, and a write through a second
        connection of its own would wait for the write lock this transaction holds.

        Returns:
            per call, in order, ``(value, None)`` or ``(None, error)``: the value or the
            error that call alone would have had. A call's error rolls back its own
            savepoint only; an error that ends the whole transaction (a failed commit,
            a full disk) is every call's error, since none of them took effect.

        The transaction waits for another connection's lock as long as the longest
        ``wait_s`` among the calls' keyword arguments, or the busy timeout when a call
        gives none.

        Raises:
            ValueError: a method not in :data:`~stores.base.FENCED_WRITES` (nothing is run).
        """
        for method, _, _ in calls:
            if method not in FENCED_WRITES:
                raise ValueError(f"write_together takes fenced writes only, not {method!r}")
        try:
            waits = [kwargs.get("wait_s") for _, _, kwargs in calls]
            wait_s = None if None in waits else max(w for w in waits if w is not None)
            return self._call(self._together_work, calls, wait_s)  # type: ignore[no-any-return]
        except StoreError as exc:  # the transaction as a whole failed: no call took effect
            return [(None, exc)] * len(calls)

    def _together_work(
        self, calls: Sequence[tuple[str, tuple[Any, ...], dict[str, Any]]], wait_s: float | None = None
    ) -> list[Outcome]:
        outcomes: list[Outcome] = []
        with self._write(wait_s) as conn:  # the transaction; each call's own _write a savepoint
            self._together, self._undo_failed = True, False
            try:
                for method, args, kwargs in calls:
                    try:
                        outcomes.append((getattr(self, method)(*args, **kwargs), None))
                    except Exception as exc:
                        # SQLite rolled the whole transaction back, or this call's share
                        # could not be undone alone (then none of it may be committed)
                        if not conn.in_transaction or self._undo_failed:
                            raise
                        error = store_error(self.path, exc) if isinstance(exc, sqlite3.Error) else exc
                        outcomes.append((None, error))
            finally:
                self._together = False
        return outcomes

    @contextlib.contextmanager
    def _savepoint(self, conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        """One call's share of a :meth:`write_together` transaction."""
        conn.execute("SAVEPOINT one_call")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK TO one_call")
                    conn.execute("RELEASE one_call")
                except sqlite3.Error:  # this call's share cannot be undone alone: nor kept,
                    self._undo_failed = True  # so the whole transaction goes (each call fails)
            raise
        conn.execute("RELEASE one_call")

    # -- resolve and maintenance -------------------------------------------------------

    def resolve(
        self, org_id: str, key: str, action: ResolveAction, *, output: object = None, note: str = ""
    ) -> Receipt | None:
        action = ResolveAction(action)
        params: tuple[Any, ...] = ()
        if action is ResolveAction.COMPLETE:
            text = encode_output(output)  # raises before anything changes

        def work() -> Receipt | None:
            nonlocal params
            with self._write() as conn:
                now = self.clock()
                receipt = self._rows(conn, org_id, [key]).get(key)
                if receipt is None or receipt.status is not ReceiptStatus.UNCERTAIN:
                    return receipt
                if action is ResolveAction.FAIL:
                    if receipt.completed_at is not None:  # a refresh: its last good output stands
                        cursor = conn.execute(_RESOLVE_FAILED_REFRESH, (now, org_id, key))
                        if cursor.rowcount:
                            return self._rows(conn, org_id, [key]).get(key)
                    params = (error_text(resolved_as_failed(receipt.error, note)),)
                elif action is ResolveAction.COMPLETE:
                    params = (text, now)
                conn.execute(_RESOLVE[action.value], (*params, now, org_id, key))
                return self._rows(conn, org_id, [key]).get(key)

        return self._call(work)  # type: ignore[no-any-return]

    def purge(
        self,
        *,
        older_than_s: float = 0.0,
        statuses: Iterable[ReceiptStatus] | None = None,
        org_id: str | None = None,
    ) -> int:
        wanted = [ReceiptStatus(s).value for s in (statuses if statuses is not None else DEFAULT_PURGE)]

        def work() -> int:
            with self._write() as conn:
                now = self.clock()
                cursor = conn.execute(
                    "DELETE FROM receipts WHERE updated_at <= ? "
                    "AND status IN (SELECT value FROM json_each(?)) "
                    "AND NOT coalesce(lease_expires_at > ?, 0) AND (? IS NULL OR org_id = ?)",
                    (now - older_than_s, orjson.dumps(wanted).decode(), now, org_id, org_id),
                )
                if cursor.rowcount:
                    conn.execute(_BUMP_PURGE_EPOCH)
                conn.execute(_PURGE_BATCHES, (now - older_than_s, org_id, org_id))
                return cursor.rowcount

        return self._call(work)  # type: ignore[no-any-return]

    def purge_epoch(self) -> int:
        def read() -> int:
            row = self._connection().execute("SELECT value FROM meta WHERE name = 'purge_epoch'").fetchone()
            return int(row[0]) if row else 0

        return self._call(read)  # type: ignore[no-any-return]
