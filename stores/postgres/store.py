"""Postgres receipt store (psycopg 3 + psycopg_pool), for many workers on many hosts.

Same contract as :class:`stores.base.ReceiptStore`; the SQL and its rules are in
:mod:`stores.postgres.sql`. What differs from SQLite:

- Lease expiry, staleness and purge ages are judged by the DATABASE clock (``now()``)
  inside the statement that decides, so a worker whose clock is off can never steal a
  live lease. ``clock`` exists only as a test hook (the contract suite's FakeClock).
- Each bulk call is one statement over arrays: one round trip whatever its size.
- A connection pool serves every thread or greenlet; connections idle for a while are
  checked before use, so after the database restarts the pool reconnects by itself.
  A connection that drops mid-call raises :class:`~stores.errors.StoreUnavailableError`
  (the caller's completion ladder and salvage handle it); the next call gets a fresh one.
- :meth:`change_feed` hears other workers' writes by LISTEN/NOTIFY (see
  :mod:`stores.postgres.listen`).

psycopg is imported when a store is made, never when :mod:`stores` is imported, so a
gevent process that patches first gets psycopg's cooperative waiting.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import attrs

from stores.base import PLAIN_READ_WAIT_S, Clock, ReceiptStore, StoreCapabilities
from stores.claims import ClaimPlan, already_taken, batch_members_wanted, plan_claims
from stores.codec import encode_output
from stores.dispositions import decide_disposition, keeps_batch, serves_last_good
from stores.errors import StoreError
from stores.fenced import FenceItem, refusal
from stores.money import Money
from stores.postgres.claims import read_settled
from stores.postgres.conn import PgConnections, is_postgres_url, split_schema
from stores.postgres.listen import channel_name
from stores.postgres.schema import quote_ident
from stores.postgres.sql import Statements
from stores.rows import DEFAULT_PURGE, batch_from_row, batch_row, error_text, read_cost, receipt_from_row
from stores.rules import (
    IN_FLIGHT,
    LOST_WHILE_RUNNING,
    holder_gone,
    owner_identity,
    resolved_as_failed,
)
from stores.types import (
    BatchRecord,
    Claim,
    ClaimDisposition,
    ClaimMode,
    ClaimRequest,
    FenceReport,
    Owner,
    Receipt,
    ReceiptStatus,
    Refusal,
    ResolveAction,
)

__all__ = ["PostgresReceiptStore", "is_postgres_url", "split_schema"]

_RACED_RETRIES = 8
_WRITTEN = {
    "claimed": ClaimDisposition.CLAIMED,
    "restored": ClaimDisposition.REUSED,
}
"""What the claim statement did to a row, as the claim's answer (a row it recorded
``uncertain`` is answered by the table, as the receipt now stands: its last good output
may answer an ordinary claim)."""
_LEAVES_IN_FLIGHT = (ClaimDisposition.RUNNING, ClaimDisposition.BLOCKED_ACTIVE_LEASE)


def _left(until: float | None) -> float | None:
    """Seconds left until ``until`` (monotonic; None: no bound), never below zero."""
    return None if until is None else max(0.0, until - time.monotonic())


RECORDS_MAX_BYTES = 64 * 1024 * 1024
"""Most batch-record text (``members``, characters) one insert statement carries: the
records go in one array parameter, and Postgres holds any value, an array too, to 1 GB
(a batch is held to ``BatchStrategy.max_batch_bytes`` of input, but many are marked at
once)."""


def _by_bytes(rows: list[tuple[str, str, str]], budget: int) -> list[list[tuple[str, str, str]]]:
    """``rows`` (batch key, tool, members text) in order, cut into runs whose members
    texts sum to at most ``budget`` characters (a longer one alone)."""
    out: list[list[tuple[str, str, str]]] = []
    run: list[tuple[str, str, str]] = []
    held = 0
    for row in rows:
        if run and held + len(row[2]) > budget:
            out.append(run)
            run, held = [], 0
        run.append(row)
        held += len(row[2])
    if run:
        out.append(run)
    return out


class PostgresReceiptStore(ReceiptStore):
    """Receipt store in a Postgres database (one schema).

    Args:
        url: libpq connection string or ``postgresql://`` URL; a ``schema=NAME`` query
            parameter picks the schema (``postgresql://host/db?schema=fleet_a``).
        schema: the Postgres schema holding the tables (created if missing); default
            the URL's ``schema`` parameter, else ``tooldispatch``.
        clock: TEST HOOK ONLY: a fake "now" (epoch seconds) sent into every statement.
            None (the default) means the database server's clock.
        min_size: connections kept open.
        max_size: most connections at once; size it for the drain (claims, mark
            running, heartbeats, bulk completions and up to 25 recovery reads).
        connect_timeout_s: how long to wait for a connection, seconds.
        application_name: what ``pg_stat_activity`` shows for the store's connections
            (default ``tooldispatch:SCHEMA``; the listener adds ``:listen``).
        lock_timeout_s: how long a statement waits for a lock another session holds
            (``LOCK TABLE``, ``ALTER TABLE``, ``VACUUM FULL``), seconds, as SQLite's
            ``busy_timeout_s``; a claim waits no longer than its callers' ``timeout_s``.

    Raises:
        StoreUnavailableError: the server cannot be reached (or refused us).
        SchemaVersionError: the schema was written by a newer tooldispatch.
        ValueError: a schema name over 63 bytes (Postgres would cut it).
    """

    capabilities = StoreCapabilities(claims_into_running=True, batch_records=True, bounded_waits=True)
    """Claims into running, batch records; each instance adds ``parallel_calls`` (half its
    ``max_size``, 1 to 4)."""

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        clock: Clock | None = None,
        min_size: int = 1,
        max_size: int = 8,
        connect_timeout_s: float = 10.0,
        application_name: str | None = None,
        lock_timeout_s: float = 30.0,
    ) -> None:
        lanes = max(1, min(4, max_size // 2))
        self.capabilities = attrs.evolve(type(self).capabilities, parallel_calls=lanes)
        url, url_schema = split_schema(url)
        schema = schema or url_schema or "tooldispatch"
        self.url = url
        self.schema = schema
        self.clock = clock if clock is not None else time.time
        self._fake_clock = clock
        self._channel = channel_name(schema)
        self._sql = Statements(quote_ident(schema), self._channel)
        self._listener: Any = None
        self._listener_lock = threading.Lock()
        self._conns = PgConnections(
            url,
            schema,
            min_size=min_size,
            max_size=max_size,
            connect_timeout_s=connect_timeout_s,
            application_name=application_name or f"tooldispatch:{schema}",
            lock_timeout_s=lock_timeout_s,
        )
        self._where = self._conns.where

    def __repr__(self) -> str:
        return f"PostgresReceiptStore({self._where!r}, schema={self.schema!r})"

    # -- connections -------------------------------------------------------------------

    def _now(self) -> float | None:
        return self._fake_clock() if self._fake_clock is not None else None

    def _execute(self, query: str, params: Any) -> list[tuple[Any, ...]]:
        return self._conns.execute(query, params)

    def renewal_handle(self) -> PostgresReceiptStore:
        """A copy of this store on one connection of its own (see :mod:`stores.postgres.renewal`)."""
        from stores.postgres.renewal import renewal_copy

        return renewal_copy(self)  # type: ignore[no-any-return]

    def close(self) -> None:
        """Close the pool and the listener; later calls raise StoreError."""
        if self._listener is not None:
            self._listener.close()
        self._conns.close()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Run a read-only inspection query (``%s`` placeholders) in the store's schema.

        For operators' tools (the CLI's ``receipts`` commands): rows as dicts.

        Raises:
            StoreError: the query failed (StoreUnavailableError: no connection).
        """
        return self._conns.query(self.schema, sql, params)

    # -- reads ------------------------------------------------------------------------

    def get_many(self, org_id: str, keys: Sequence[str]) -> list[Receipt | None]:
        rows = self._execute(self._sql.by_keys, (org_id, list(keys)))
        found = {row[0]: receipt_from_row(row) for row in rows}
        return [found.get(key) for key in keys]

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
        # settled receipts: answered by one plain read (no lock); the rest are claimed
        until = None if wait_s is None else time.monotonic() + wait_s
        decided, pending = read_settled(self, org_id, list(unique.values()), mode, stale_after_s, wait_s)
        gone: set[str] = set()  # lease ids whose holder's process is known to be gone
        for _ in range(_RACED_RETRIES):
            batched: list[ClaimRequest] = []
            decided.update(
                self._claim(
                    org_id, pending, owner, lease_ttl_s, mode, stale_after_s, gone, running, batched, until
                )
            )
            if batched:  # recorded in a batch request: taken with the whole request, or not at all
                decided.update(
                    self._claim_batches(org_id, batched, owner, lease_ttl_s, mode, stale_after_s, until)
                )
            # Keys another transaction inserted after this statement's snapshot (or
            # deleted under it) got no answer, nor did live leases of dead holders on
            # this host: ask again for them alone (those leases now count as expired).
            pending = [r for r in pending if r.key not in decided]
            if not pending:
                return [decided[request.key] for request in requests]
        raise StoreError(f"{self._where}: {len(pending)} keys kept changing under {_RACED_RETRIES} claims")

    def read_settled(
        self, org_id: str, requests: Sequence[ClaimRequest], *, mode: ClaimMode = ClaimMode.NORMAL,
        stale_after_s: float | None = None,
    ) -> tuple[dict[str, Claim], list[ClaimRequest]]:  # fmt: skip
        return read_settled(self, org_id, list(requests), mode, stale_after_s)  # the database's clock

    def read_reusable(
        self, org_id: str, keys: Sequence[str], *, stale_after_s: float | None = None
    ) -> dict[str, tuple[str, str, Money | None]]:
        """As :meth:`ReceiptStore.read_reusable`: the stored output text as it is, one
        statement, ages judged by the database's clock (no receipt built, no re-encoding),
        waiting at most :data:`~stores.base.PLAIN_READ_WAIT_S` for a connection or a lock."""
        params = {"org": org_id, "keys": list(dict.fromkeys(keys)), "now": self._now()}
        rows = self._conns.read_now(self._sql.reusable, params, PLAIN_READ_WAIT_S)
        return {
            key: (input_hash, text, None if cost is None else read_cost(cost))
            for key, input_hash, text, age, cost in rows
            if stale_after_s is None or age <= stale_after_s
        }

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
        if after is None:
            start = {"org": org_id, "keys": list(keys)}
            ((since,),) = self._conns.read_now(self._sql.read_ahead_start, start, PLAIN_READ_WAIT_S)
            if since is None:
                return []
            last = ""
        else:
            since, last = after
        params = {
            "org": org_id,
            "tool": tool_id,
            "since": since,
            "last": last,
            "limit": limit,
            "bytes": max_bytes,
        }
        rows = self._conns.read_now(self._sql.read_ahead, params, PLAIN_READ_WAIT_S)
        return [(k, h, text, at, None if cost is None else read_cost(cost)) for k, h, text, at, cost in rows]

    def _claim(
        self,
        org_id: str,
        requests: list[ClaimRequest],
        owner: Owner,
        lease_ttl_s: float,
        mode: ClaimMode,
        stale_after_s: float | None,
        gone: set[str],
        running: Collection[str] = frozenset(),
        batched: list[ClaimRequest] | None = None,
        until: float | None = None,
    ) -> dict[str, Claim]:
        """One claim statement; the keys it leaves to a whole batch request's claim
        (:meth:`_claim_batches`) go to ``batched`` (their requests), unanswered. ``until``:
        when its lock waits end (monotonic seconds; None: never)."""
        if not requests:
            return {}
        host, pid, started_at = owner_identity(owner)
        random_hex = os.urandom(16 * len(requests)).hex()
        params = {
            "keys": [r.key for r in requests],
            "scopes": [r.scope for r in requests],
            "tools": [r.tool_id for r in requests],
            "hashes": [r.input_hash for r in requests],
            "leases": [r.lease_id or random_hex[32 * i : 32 * i + 32] for i, r in enumerate(requests)],
            "safe": [r.retry_safe for r in requests],
            "running": [r.key in running for r in requests],
            "inputs": [r.input_text for r in requests],
            "org": org_id,
            "run": owner.run_id,
            "attempt": owner.run_attempt,
            "host": host,
            "pid": pid,
            "started": started_at,
            "ttl": lease_ttl_s,
            "now": self._now(),
            "force": mode is ClaimMode.FORCE_REFRESH,
            "retry": mode is not ClaimMode.NORMAL,
            "stale": stale_after_s,
            "gone": sorted(gone),
            "lost": LOST_WHILE_RUNNING,
        }
        by_key = {r.key: r for r in requests}
        seen: dict[Any, bool] = {}  # holder process -> gone, asked once per claim
        decided: dict[str, Claim] = {}
        for row in self._conns.execute(self._sql.claim, params, lock_wait_s=_left(until)):
            kind, now, receipt = row[0], row[1], receipt_from_row(row[2:])
            if kind == "uncertain":
                decided[receipt.key] = Claim(decide_disposition(receipt, mode, now, stale_after_s), receipt)
                continue
            if kind == "batch":
                if batched is not None:
                    batched.append(by_key[receipt.key])
                continue
            if kind != "read":
                decided[receipt.key] = Claim(_WRITTEN[kind], receipt)
                continue
            request = by_key[receipt.key]
            if already_taken(request, receipt, owner):  # an earlier attempt of this claim took it
                if batched is not None and receipt.batch_key is not None:  # with its batch request
                    batched.append(request)
                else:
                    decided[receipt.key] = Claim(ClaimDisposition.CLAIMED, receipt)
                continue
            if receipt.lease_id not in gone and holder_gone(receipt, now, seen):
                gone.add(receipt.lease_id)  # type: ignore[arg-type]  # taken over on the next pass
                continue
            disposition = decide_disposition(
                receipt,
                mode,
                now,
                stale_after_s,
                holder_gone=receipt.lease_id in gone,
                retry_safe=request.retry_safe,
            )
            if disposition is ClaimDisposition.CLAIMED or (
                receipt.status in IN_FLIGHT
                and disposition not in _LEAVES_IN_FLIGHT
                and not serves_last_good(receipt, mode, now, stale_after_s)
            ):  # the SQL and the table disagree: a bug (a live refresh's last good output is none)
                raise StoreError(f"{self._where}: claim of {receipt.key} was not decided ({receipt.status})")
            decided[receipt.key] = Claim(disposition, receipt)
        return decided

    def _claim_batches(
        self,
        org_id: str,
        requests: list[ClaimRequest],
        owner: Owner,
        lease_ttl_s: float,
        mode: ClaimMode,
        stale_after_s: float | None,
        until: float | None = None,
    ) -> dict[str, Claim]:
        """Claim receipts recorded in batch requests, each with its whole request, in one
        transaction: the records read, every member's row locked (in key order, as every
        statement locks), the plan made by :func:`stores.claims.plan_claims` (as SQLite's)
        and written. A key whose row changed since the claim statement read it (gone, or
        another batch key) is left unanswered: the caller's next pass claims it again.
        ``until``: as :meth:`_claim` takes it."""
        sql = self._sql

        def work(conn: Any) -> dict[str, Claim]:
            ((now,),) = conn.execute(sql.now, {"now": self._now()}).fetchall()
            read = conn.execute(sql.by_keys, (org_id, [q.key for q in requests])).fetchall()
            rows = {row[0]: receipt_from_row(row) for row in read}
            params = {"org": org_id, "keys": sorted(batch_members_wanted(requests, rows))}
            records = {row[0]: batch_from_row(row) for row in conn.execute(sql.batches_by_keys, params)}
            keys = {q.key for q in requests} | {m for record in records.values() for m in record.members}
            params = {"org": org_id, "keys": sorted(keys)}
            locked = {row[0]: receipt_from_row(row) for row in conn.execute(sql.lock_keys, params)}
            ready = [
                q for q in requests
                if (row := locked.get(q.key)) is not None
                and (
                    row.batch_key is None or row.batch_key in records or not keeps_batch(row)
                    or already_taken(q, row, owner)
                )
            ]  # fmt: skip
            plan = plan_claims(
                org_id, ready, locked, owner, now, lease_ttl_s, mode, stale_after_s, batches=records
            )
            self._write_plan(conn, org_id, owner, plan, now, lease_ttl_s)
            return plan.decided

        return self._conns.run(work, transaction=True, lock_wait_s=_left(until))

    def _write_plan(
        self, conn: Any, org_id: str, owner: Owner, plan: ClaimPlan, now: float, ttl_s: float
    ) -> None:
        """Write what :meth:`_claim_batches` decided (every row exists and is locked)."""
        sql = self._sql
        if plan.writes:
            host, pid, started_at = plan.identity
            columns = [list(column) for column in zip(*plan.writes, strict=True)]
            conn.execute(
                sql.take_rows,
                {
                    "org": org_id, "run": owner.run_id, "attempt": owner.run_attempt, "expires": now + ttl_s,
                    "now": now, "host": host, "pid": pid, "started": started_at, "keys": columns[0],
                    "scopes": columns[1], "tools": columns[2], "hashes": columns[3], "leases": columns[4],
                    "attempts": columns[5], "generations": columns[7], "statuses": columns[8],
                    "inputs": columns[9], "batches": columns[10],
                },
            )  # fmt: skip
        if plan.restored:
            conn.execute(sql.restore_rows, {"org": org_id, "now": now, "keys": plan.restored})
        if plan.lost:
            keys, errors = zip(*plan.lost, strict=True)
            params = {"org": org_id, "now": now, "keys": list(keys), "errors": list(errors)}
            conn.execute(sql.uncertain_rows, params)

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
        applied: set[str] = set()
        if items:
            params = {
                "keys": keys,
                "leases": [item[1] for item in items],
                "a": [item[2] for item in items],
                "b": [item[3] for item in items],
                "org": org_id,
                "run": owner.run_id,
                "attempt": owner.run_attempt,
                "now": self._now(),
                "ttl": ttl_s,
                "channel": self._channel,
            }
            stored: dict[str, Receipt] = {}
            fence = self._sql.fence[op]
            if batches:
                rows = self._conns.run(
                    lambda conn: self._recorded(conn, fence, params, batches), transaction=True,
                    lock_wait_s=wait_s,
                )  # fmt: skip
            elif wait_s is not None:
                rows = self._conns.execute(fence, params, lock_wait_s=wait_s)
            else:
                rows = self._execute(fence, params)
            for row in rows:
                if row[0]:
                    applied.add(row[1])
                else:
                    stored[row[1]] = receipt_from_row(row[1:])
            lease_of = {item[0]: item[1] for item in items}
            for key in keys:
                if key in applied or key in refused:
                    continue
                why = refusal(stored.get(key), lease_of[key], owner, idempotent_status)
                if why is None:
                    applied.add(key)
                else:
                    refused[key] = why
        return FenceReport(tuple(k for k in keys if k in applied), refused)

    def _recorded(
        self, conn: Any, fence: str, params: dict[str, Any], batches: Sequence[BatchRecord]
    ) -> list[tuple[Any, ...]]:
        """The running mark's statement, then (same transaction) each batch record whose
        every member it applied, and its members' ``batch_key``."""
        rows: list[tuple[Any, ...]] = conn.execute(fence, params).fetchall()
        done = {row[1] for row in rows if row[0]}
        whole = [record for record in batches if done.issuperset(record.members)]
        if whole:
            ((now,),) = conn.execute(self._sql.now, {"now": self._now()}).fetchall()
            org = params["org"]
            for chunk in _by_bytes([batch_row(r) for r in whole], RECORDS_MAX_BYTES):
                keys, tools, members = (list(c) for c in zip(*chunk, strict=True))
                conn.execute(
                    self._sql.insert_batches,
                    {"org": org, "now": now, "keys": keys, "tools": tools, "members": members},
                )
            pairs = [(member, record.key) for record in whole for member in record.members]
            conn.execute(
                self._sql.set_batch_keys,
                {"org": org, "keys": [k for k, _ in pairs], "batches": [b for _, b in pairs]},
            )
        return rows

    def resolve(
        self, org_id: str, key: str, action: ResolveAction, *, output: object = None, note: str = ""
    ) -> Receipt | None:
        action = ResolveAction(action)
        text = encode_output(output) if action is ResolveAction.COMPLETE else None  # raises first

        def work(conn: Any) -> Receipt | None:
            row = conn.execute(self._sql.lock_one, {"org": org_id, "key": key}).fetchone()
            receipt = receipt_from_row(row) if row else None
            if receipt is None or receipt.status is not ReceiptStatus.UNCERTAIN:
                return receipt
            params = {"org": org_id, "key": key, "now": self._now(), "output": text}
            params["error"] = error_text(resolved_as_failed(receipt.error, note))
            if action is ResolveAction.FAIL and receipt.completed_at is not None:
                # a refresh: its last good output stands (unless that output is not one a reader takes)
                restored = conn.execute(self._sql.resolve["fail_refresh"], params).fetchall()
                if restored:
                    return receipt_from_row(restored[0])
            (new,) = conn.execute(self._sql.resolve[action.value], params).fetchall()
            return receipt_from_row(new)

        return self._conns.run(work, transaction=True)

    def purge_epoch(self) -> int:
        rows = self._execute(self._sql.purge_epoch, {})
        return int(rows[0][0]) if rows else 0

    # -- waiting on other owners --------------------------------------------------------

    def change_feed(self) -> Any:
        """The store's listener, started (see the base class); returns at once."""
        return self._listener_started(0.0)

    def _listener_started(self, timeout_s: float) -> Any:
        """The store's one listener, started by the first waiter."""
        from stores.postgres.listen import Listener

        with self._listener_lock:
            if self._listener is None:
                app = self._conns.connect_kwargs["application_name"]
                kwargs = {**self._conns.connect_kwargs, "application_name": f"{app}:listen"}
                self._listener = Listener(self.url, self._channel, kwargs)
                self._listener.start()
        self._listener.wait_connected(min(timeout_s, self._conns.timeout_s))
        return self._listener

    # -- maintenance ------------------------------------------------------------------

    def purge(
        self,
        *,
        older_than_s: float = 0.0,
        statuses: Iterable[ReceiptStatus] | None = None,
        org_id: str | None = None,
    ) -> int:
        wanted = [ReceiptStatus(s).value for s in (statuses if statuses is not None else DEFAULT_PURGE)]
        params = {"older": older_than_s, "statuses": wanted, "org": org_id, "now": self._now()}

        def work(conn: Any) -> int:
            ((count,),) = conn.execute(self._sql.purge, params).fetchall()
            conn.execute(self._sql.purge_batches, params)
            return int(count)

        return self._conns.run(work, transaction=True)
