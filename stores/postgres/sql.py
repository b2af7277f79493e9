"""SQL statements of the Postgres receipt store.

Each bulk operation is ONE statement whose keys travel as arrays (``unnest``), so a
call costs one round trip whatever its size. The rules every statement keeps:

- "Now" is ``now()`` on the database server, read inside the deciding statement. A test
  passes its fake time as ``%(now)s`` instead; production passes NULL.
- Rows are locked in one fixed order, so two bulk calls over overlapping keys in
  different orders never deadlock: keys in the "C" collation, sorted, then locked
  ``FOR UPDATE`` (:func:`_lock`; a claim's ``lk`` sorts the rows it locks). A claim
  first inserts the absent keys (also in key order), and only then locks the existing
  ones: the scalar subquery on ``ins`` in ``lk`` forces that order (sibling CTEs
  otherwise run in an unspecified order).
- No plan depends on the table's statistics. A new table has none until autovacuum
  analyzes it, and ``org_id = ... AND key = ANY(...)`` is then planned as an index scan
  of the org, the keys a filter: every statement would read every row of the org. So
  the keys are joined on both ``(org_id, key)`` columns to a materialized CTE that
  carries the org as a column (:func:`_each`, :func:`_on`): the planner sees no constant
  org to scan by, and chooses between one index lookup per key and one scan of the
  table from the keys' count and the table's true size (a claim or read of thousands of
  keys scans; a few keys are looked up). The fenced writes, a few keys each and the
  most frequent statements, look each key up in a ``LATERAL`` subquery instead
  (:func:`_lock`), which cannot be planned as a scan at all. (Estimated costs stay
  those of the work: a lookup per key costed as a subquery for every one of 20,000
  keys passes ``jit_above_cost``, and JIT then compiles for seconds.)
- Arrays travel in binary (``%(keys)b``): psycopg's text dumping of a 500-key list
  costs more than the statement.
- In READ COMMITTED a ``FOR UPDATE`` returns the newest committed version of each row,
  so every decision and every refusal is made on the row as it stands, not on the
  statement's snapshot; each change is guarded by status, lease id and owner.
- A row another transaction inserted after this statement's snapshot is invisible to
  it (``ON CONFLICT DO NOTHING`` waits for that insert, then skips it); such keys come
  back without an answer and the store runs the statement again for them alone.
- Writes that end leases (complete, fail, release) NOTIFY once per statement, never per
  row: the payload is the org id, and waiters re-read their own keys.
"""

from __future__ import annotations

from stores.dispositions import REFRESH_LOST
from stores.postgres.claims import read_settled_sql
from stores.rows import COLUMNS

assert "'" not in REFRESH_LOST  # quoted as a SQL literal below
_LOST = f"'{REFRESH_LOST}'"

__all__ = ["Statements"]

_NOW = "SELECT coalesce(%(now)s::float8, extract(epoch FROM now())::float8) AS now"
_COLS = ", ".join(COLUMNS)
_LEASE_COLUMNS = (
    "lease_id", "lease_owner_run_id", "lease_owner_attempt", "lease_owner_host", "lease_owner_pid",
    "lease_owner_started_at",
)  # fmt: skip


_KEEPS = "l.completed_at IS NOT NULL AND l.status IN ('completed', 'queued', 'running')"
"""A claim of such a receipt keeps its output until a new one is stored (a refresh)."""


_NULLS = ", ".join("NULL" for _ in COLUMNS[1:])
"""Padding for the rows a fenced write applied: only their key is sent back."""


def _each(arrays: str = "%(keys)b::text[]", names: str = "key", org: str = "%(org)s") -> str:
    """A CTE of the rows of parallel array parameters ``arrays`` (columns ``names``, the
    first ``key``), each with the org ``org`` as column ``org``. Materialized, its org is
    no constant to the planner: a table joined to it on both key columns (:func:`_on`)
    has no org-only index scan to choose, nor a lookup of a key without its org."""
    return f'MATERIALIZED (SELECT {org}::text COLLATE "C" AS org, x.* FROM unnest({arrays}) AS x({names}))'


def _on(r: str, u: str = "u", column: str = "key") -> str:
    """The join of table alias ``r`` to rows ``u`` of :func:`_each` on ``(org_id, column)``."""
    return f'{r}.org_id = {u}.org AND {r}.{column} = {u}.key COLLATE "C"'


def _cols(alias: str) -> str:
    return ", ".join(f"{alias}.{c}" for c in COLUMNS)


def _action(a: str) -> str:
    """What a claim does to row alias ``a`` (joined to ``req``), as docs/receipts.md's claim
    table and :func:`stores.dispositions.decide_disposition`: 'claim' (a new lease), 'restore' (a
    lost refresh goes back to completed), 'uncertain' (a lost running call of a tool that
    is not retry-safe) or 'none' (the answer is the row as it stands: a live lease, or one
    this claim already took). A lease whose id
    is in ``%(gone)s`` (its holder's process is known to be gone) counts as expired."""
    live = (
        f"(coalesce({a}.lease_expires_at > clk.now, false) "
        f"AND NOT coalesce({a}.lease_id = ANY(%(gone)b::text[]), false))"
    )
    rerun = (
        f"(%(force)s::boolean OR (%(stale)s::float8 IS NOT NULL "
        f"AND clk.now - coalesce({a}.completed_at, {a}.updated_at) > %(stale)s::float8))"
    )
    # already leased under the request's lease id to this owner: an earlier attempt of the
    # same claim committed (stores.claims.already_taken answers it, live or lapsed)
    mine = (
        f"({a}.lease_id = req.lease_id AND {a}.lease_owner_run_id = %(run)s "
        f"AND {a}.lease_owner_attempt = %(attempt)s)"
    )
    # a claim that keeps the generation of a receipt recorded in a batch request takes the
    # whole request: 'batch', decided by the store in Python (PostgresReceiptStore._claim_batches)
    keep = f"({a}.batch_key IS NOT NULL AND NOT {_bumps(a)})"
    claim = f"CASE WHEN {keep} THEN 'batch' ELSE 'claim' END"
    return f"""(CASE
      WHEN {a}.status = 'completed' THEN CASE WHEN {rerun} THEN {claim} ELSE 'none' END
      WHEN {a}.status IN ('queued', 'running') THEN CASE
        WHEN {mine} THEN 'none'
        WHEN {live} THEN 'none'
        WHEN {a}.status = 'running' AND NOT req.safe THEN 'uncertain'
        WHEN {a}.completed_at IS NOT NULL THEN CASE WHEN {rerun} THEN {claim} ELSE 'restore' END
        ELSE {claim} END
      WHEN {a}.status = 'failed' THEN CASE WHEN %(retry)s::boolean THEN {claim} ELSE 'none' END
      WHEN {a}.status IN ('pending', 'skipped') THEN {claim}
      ELSE 'none' END)"""


def _bumps(a: str) -> str:
    """A claim of row ``a`` starts a new generation (:func:`stores.dispositions.next_generation`)."""
    failed = f"({a}.status = 'failed' AND {a}.failure_kind IS DISTINCT FROM 'timeout')"
    completed = f"({a}.status = 'completed' AND {a}.error IS DISTINCT FROM {_LOST})"
    return f"({completed} OR {failed})"


_FENCE_SET = {
    "running": "status = 'running', updated_at = clk.now",
    "running_renew": "status = 'running', lease_expires_at = clk.now + %(ttl)s, updated_at = clk.now",
    "renew": "lease_expires_at = clk.now + %(ttl)s, updated_at = clk.now",
    "complete": (
        "status = 'completed', output = l.a, cost = l.b, lease_expires_at = NULL, updated_at = clk.now, "
        "completed_at = clk.now"
    ),
    # A receipt holding a previous output (a refresh) goes back to completed, its lease
    # dropped, so the lost owner's late writes are refused as completed by another.
    "fail": ", ".join(
        [
            "status = CASE WHEN l.completed_at IS NULL THEN 'failed' ELSE 'completed' END",
            "error = CASE WHEN l.completed_at IS NULL THEN l.a END",
            "failure_kind = CASE WHEN l.completed_at IS NULL THEN l.b END",
            "lease_expires_at = NULL",
            "updated_at = clk.now",
        ]
        + [f"{c} = CASE WHEN l.completed_at IS NULL THEN l.{c} END" for c in _LEASE_COLUMNS]
    ),
    "uncertain": (
        "status = 'uncertain', error = l.a, failure_kind = l.b, lease_expires_at = NULL, updated_at = clk.now"
    ),
    "release": (
        "status = CASE WHEN l.completed_at IS NULL THEN 'pending' ELSE 'completed' END, "
        + ", ".join(f"{c} = NULL" for c in _LEASE_COLUMNS)
        + ", lease_expires_at = NULL, updated_at = clk.now"
    ),
}
NOTIFYING = frozenset({"complete", "fail", "uncertain", "release"})
"""Fenced writes that end leases, and so may wake a waiter."""

_KEPT = "completed_at IS NOT NULL AND output IS NOT NULL"
"""An uncertain receipt that kept a previous output (a refresh): resolved --rerun, or
--fail, it is the completed receipt it was, with no lease left on it."""
_RESOLVE = {
    # the stored output is kept only when a reader takes it as one (a time, an output there)
    "rerun": (
        f"status = CASE WHEN {_KEPT} THEN 'completed' ELSE 'pending' END, "
        "output = CASE WHEN completed_at IS NOT NULL THEN output END, "
        "completed_at = CASE WHEN output IS NOT NULL THEN completed_at END, "
        "error = NULL, failure_kind = NULL, lease_expires_at = NULL, batch_key = NULL, "
        + ", ".join(f"{c} = CASE WHEN {_KEPT} THEN NULL ELSE {c} END" for c in _LEASE_COLUMNS)
    ),
    # a refresh whose outcome was uncertain, found not to have acted: the last good output
    # stands (as after ``fail_many``); the store runs it only for a receipt it reads with one
    "fail_refresh": (
        "status = 'completed', error = NULL, failure_kind = NULL, lease_expires_at = NULL, "
        + ", ".join(f"{c} = NULL" for c in _LEASE_COLUMNS)
    ),
    # no lease is held once decided: one left (a NaN or Infinity expiry set by hand, greater
    # than every time) kept the failed or completed receipt from every purge
    "fail": "status = 'failed', error = %(error)s, failure_kind = 'permanent', lease_expires_at = NULL",
    "complete": (
        "status = 'completed', output = %(output)s, error = NULL, failure_kind = NULL, "
        "completed_at = clk.now, lease_expires_at = NULL"
    ),
}


def _lock(t: str) -> str:
    """The rows of table ``t`` of org ``%(org)s`` for the keys in ``%(keys)s``, locked
    ``FOR UPDATE`` in key order: the sorted keys drive a nested loop over a ``LATERAL``
    lookup of each (``OFFSET 0`` keeps it a subquery, run once per key), so a statement
    of a few keys reads a few rows whatever the table's size and statistics."""
    keys = 'SELECT DISTINCT k COLLATE "C" AS key FROM unnest(%(keys)b::text[]) AS x(k) ORDER BY 1'
    return (
        f"SELECT l.* FROM ({keys}) q, "
        f"LATERAL (SELECT {_COLS} FROM {t} WHERE org_id = %(org)s AND key = q.key OFFSET 0 FOR UPDATE) l"
    )


_TAKE_ARRAYS = (
    "%(keys)b::text[], %(scopes)b::text[], %(tools)b::text[], %(hashes)b::text[], %(leases)b::text[], "
    "%(attempts)b::int[], %(generations)b::int[], %(statuses)b::text[], %(inputs)b::text[], "
    "%(batches)b::text[]"
)
_TAKE_NAMES = "key, scope, tool_id, input_hash, lease_id, attempts, generation, status, input_text, batch_key"
"""The rows a claim of recorded batch requests writes (``take_rows``)."""

_STARTED = "CASE WHEN req.running THEN 'running' ELSE 'queued' END"
"""A claimed receipt's status: ``running`` when claimed straight into running."""


class Statements:
    """The statements for one schema (``schema`` is an already quoted identifier)."""

    def __init__(self, schema: str, channel: str) -> None:
        t = f"{schema}.receipts"
        self.table = t
        self.channel = channel
        self.by_keys = (
            f"WITH u AS {_each('%b::text[]', org='%s')} SELECT {_cols('r')} FROM u JOIN {t} r ON {_on('r')}"
        )
        self.read_settled = read_settled_sql(
            f"u AS {_each()}", f"{_cols('r')} FROM u JOIN {t} r ON {_on('r')}", _NOW
        )
        # the status test stays outside the join (OFFSET 0): on the row it could pick the
        # status index, whose rows it cannot estimate without statistics either
        self.reusable = f"""
WITH clk AS ({_NOW}), u AS {_each()}
SELECT r.key, r.input_hash, r.output, clk.now - coalesce(r.completed_at, r.updated_at), r.cost
FROM (SELECT r.key, r.status, r.input_hash, r.output, r.completed_at, r.updated_at, r.cost
      FROM u JOIN {t} r ON {_on("r")} OFFSET 0) r, clk
WHERE r.status = 'completed'
  -- set by hand: left to a claim, which says so for that call alone (a NULL age failed
  -- the whole bulk read with a TypeError)
  AND r.output IS NOT NULL AND coalesce(r.completed_at, r.updated_at) IS NOT NULL
"""
        self.read_ahead_start = (
            f"SELECT min(updated_at) FROM {t} WHERE org_id = %(org)s AND key = ANY(%(keys)b::text[])"
        )
        # a range of the (status, updated_at) index, in its order (ties at the page's edge
        # told apart by key); the page ends with the row whose output reaches %(bytes)s,
        # added up
        self.read_ahead = f"""
SELECT key, input_hash, output, updated_at, cost FROM (
  SELECT p.*,
         sum(octet_length(p.output)) OVER (ORDER BY p.updated_at, p.key) - octet_length(p.output) AS earlier
  FROM (SELECT key, input_hash, output, updated_at, cost FROM {t}
        WHERE status = 'completed' AND updated_at >= %(since)s
          AND NOT (updated_at = %(since)s AND key <= %(last)s)
          AND org_id = %(org)s AND tool_id = %(tool)s AND output IS NOT NULL AND input_hash IS NOT NULL
        ORDER BY updated_at, key LIMIT %(limit)s) p
) q
WHERE earlier < %(bytes)s ORDER BY updated_at, key
"""
        self.claim = f"""
WITH req AS MATERIALIZED (
  SELECT %(org)s::text COLLATE "C" AS org, r.*
  FROM unnest(%(keys)b::text[], %(scopes)b::text[], %(tools)b::text[], %(hashes)b::text[], %(leases)b::text[],
              %(safe)b::boolean[], %(running)b::boolean[], %(inputs)b::text[])
    AS r(key, scope, tool_id, input_hash, lease_id, safe, running, input_text)
),
clk AS ({_NOW}),
snap AS (
  SELECT {_cols("s")}, {_action("s")} AS action FROM req JOIN {t} s ON {_on("s", "req")}, clk
),
ins AS (
  INSERT INTO {t} AS r (key, org_id, scope, tool_id, status, input_hash, lease_id, lease_owner_run_id,
                        lease_owner_attempt, lease_expires_at, attempts, created_at, updated_at, generation,
                        lease_owner_host, lease_owner_pid, lease_owner_started_at, input_text)
  SELECT req.key, %(org)s, req.scope, req.tool_id, {_STARTED}, req.input_hash, req.lease_id, %(run)s,
         %(attempt)s, clk.now + %(ttl)s, 1, clk.now, clk.now, 1, %(host)s, %(pid)s, %(started)s,
         req.input_text
  FROM req, clk WHERE NOT EXISTS (SELECT 1 FROM snap WHERE snap.key = req.key) ORDER BY req.key
  ON CONFLICT (org_id, key) DO NOTHING
  RETURNING {_cols("r")}
),
lk AS (
  SELECT {_COLS} FROM {t}
  WHERE (org_id, key) IN (SELECT org_id, key FROM snap WHERE action <> 'none')
    AND (SELECT count(*) FROM ins) >= 0
  ORDER BY key FOR UPDATE
),
la AS (SELECT {_cols("l")}, {_action("l")} AS action FROM lk l JOIN req ON req.key = l.key, clk),
take AS MATERIALIZED (
  SELECT l.*, {_STARTED} AS new_status, req.scope AS new_scope, req.tool_id AS new_tool,
         req.input_hash AS new_hash, req.lease_id AS new_lease, req.input_text AS new_input
  FROM la l JOIN req ON req.key = l.key WHERE l.action = 'claim'
),
claimed AS (
  UPDATE {t} AS r SET status = l.new_status, error = NULL, failure_kind = NULL,
    output = CASE WHEN {_KEEPS} THEN l.output END,
    completed_at = CASE WHEN {_KEEPS} THEN l.completed_at END,
    scope = l.new_scope, tool_id = l.new_tool, input_hash = l.new_hash, lease_id = l.new_lease,
    lease_owner_run_id = %(run)s, lease_owner_attempt = %(attempt)s, lease_expires_at = clk.now + %(ttl)s,
    attempts = l.attempts + 1, updated_at = clk.now,
    generation = CASE WHEN {_bumps("l")} THEN l.generation + 1 ELSE l.generation END,
    batch_key = CASE WHEN {_bumps("l")} THEN NULL ELSE l.batch_key END,
    lease_owner_host = %(host)s, lease_owner_pid = %(pid)s, lease_owner_started_at = %(started)s,
    input_text = coalesce(l.new_input, l.input_text)
  FROM take l, clk WHERE r.org_id = l.org_id AND r.key = l.key
  RETURNING {_cols("r")}
),
restored AS (
  UPDATE {t} AS r SET status = 'completed', error = {_LOST}, lease_expires_at = NULL, updated_at = clk.now,
    {", ".join(f"{c} = NULL" for c in _LEASE_COLUMNS)}
  FROM la l, clk WHERE r.org_id = l.org_id AND r.key = l.key AND l.action = 'restore'
  RETURNING {_cols("r")}
),
lost AS (
  UPDATE {t} AS r SET status = 'uncertain', error = %(lost)s, failure_kind = NULL,
    lease_expires_at = NULL, updated_at = clk.now
  FROM la l, clk WHERE r.org_id = l.org_id AND r.key = l.key AND l.action = 'uncertain'
  RETURNING {_cols("r")}
)
SELECT 'claimed', clk.now, ins.* FROM ins, clk
UNION ALL SELECT 'claimed', clk.now, claimed.* FROM claimed, clk
UNION ALL SELECT 'restored', clk.now, restored.* FROM restored, clk
UNION ALL SELECT 'uncertain', clk.now, lost.* FROM lost, clk
UNION ALL SELECT 'read', clk.now, {_cols("l")} FROM la l, clk WHERE l.action = 'none'
UNION ALL SELECT 'batch', clk.now, {_cols("l")} FROM la l, clk WHERE l.action = 'batch'
UNION ALL SELECT 'read', clk.now, {_cols("s")} FROM snap s, clk WHERE s.action = 'none'
"""
        self.fence = {op: self._fence(t, set_sql, op in NOTIFYING) for op, set_sql in _FENCE_SET.items()}
        self.purge = f"""
WITH clk AS ({_NOW}),
doomed AS (
  SELECT org_id, key FROM {t}, clk
  WHERE updated_at <= clk.now - %(older)s AND status = ANY(%(statuses)b::text[])
    AND NOT coalesce(lease_expires_at > clk.now, false)
    AND (%(org)s::text IS NULL OR org_id = %(org)s::text)
  ORDER BY org_id, key FOR UPDATE
),
gone AS (DELETE FROM {t} r USING doomed d WHERE r.org_id = d.org_id AND r.key = d.key RETURNING 1),
bump AS (
  INSERT INTO {schema}.meta AS m (name, value) SELECT 'purge_epoch', '1' WHERE EXISTS (SELECT 1 FROM gone)
  ON CONFLICT (name) DO UPDATE SET value = (m.value::bigint + 1)::text
)
SELECT count(*) FROM gone
"""
        self.purge_epoch = f"SELECT value FROM {schema}.meta WHERE name = 'purge_epoch'"
        b = f"{schema}.batches"
        self.now = _NOW
        self.batches_by_keys = (
            f"WITH u AS {_each()} SELECT x.batch_key, x.tool_id, x.members FROM u JOIN {b} x "
            f"ON {_on('x', column='batch_key')}"
        )
        self.insert_batches = f"""
INSERT INTO {b} (org_id, batch_key, tool_id, members, created_at)
SELECT %(org)s, u.k, u.t, u.m, %(now)s FROM unnest(%(keys)b::text[], %(tools)b::text[], %(members)b::text[])
  AS u(k, t, m)
ON CONFLICT (org_id, batch_key) DO NOTHING
"""
        self.set_batch_keys = f"""
WITH u AS {_each("%(keys)b::text[], %(batches)b::text[]", "key, b")}
UPDATE {t} AS r SET batch_key = u.b FROM u WHERE {_on("r")}
"""
        self.purge_batches = f"""
WITH clk AS ({_NOW})
DELETE FROM {b} AS x USING clk
WHERE coalesce(x.created_at, 0) <= clk.now - %(older)s AND (%(org)s::text IS NULL OR x.org_id = %(org)s::text)
  AND NOT EXISTS (
    SELECT 1 FROM {t} r WHERE r.org_id = x.org_id AND r.batch_key = x.batch_key AND NOT {_bumps("r")}
  )
"""
        # a claim that takes a recorded batch request whole: rows locked in key order, the
        # plan decided in Python (stores.claims.plan_claims), then written back
        self.lock_keys = _lock(t)
        self.take_rows = f"""
WITH u AS {_each(_TAKE_ARRAYS, _TAKE_NAMES)}
UPDATE {t} AS r SET status = u.status, error = NULL, failure_kind = NULL,
  output = CASE WHEN r.completed_at IS NOT NULL AND r.status IN ('completed', 'queued', 'running')
    THEN r.output END,
  completed_at = CASE WHEN r.completed_at IS NOT NULL AND r.status IN ('completed', 'queued', 'running')
    THEN r.completed_at END,
  scope = u.scope, tool_id = u.tool_id, input_hash = u.input_hash, lease_id = u.lease_id,
  lease_owner_run_id = %(run)s, lease_owner_attempt = %(attempt)s, lease_expires_at = %(expires)s,
  attempts = u.attempts, updated_at = %(now)s, generation = u.generation, batch_key = u.batch_key,
  lease_owner_host = %(host)s, lease_owner_pid = %(pid)s, lease_owner_started_at = %(started)s,
  input_text = coalesce(u.input_text, r.input_text)
FROM u WHERE {_on("r")}
"""
        self.restore_rows = f"""
WITH u AS {_each("%(keys)b::text[]", "key")}
UPDATE {t} AS r SET status = 'completed', error = {_LOST}, lease_expires_at = NULL, updated_at = %(now)s,
  {", ".join(f"{c} = NULL" for c in _LEASE_COLUMNS)}
FROM u WHERE {_on("r")}
"""
        self.uncertain_rows = f"""
WITH u AS {_each("%(keys)b::text[], %(errors)b::text[]", "key, e")}
UPDATE {t} AS r SET status = 'uncertain', error = u.e, failure_kind = NULL, lease_expires_at = NULL,
  updated_at = %(now)s
FROM u WHERE {_on("r")}
"""
        self.lock_one = f"SELECT {_COLS} FROM {t} WHERE org_id = %(org)s AND key = %(key)s FOR UPDATE"
        # the row is locked (``lock_one``) and judged uncertain in Python first (a status or
        # a lease expiry it cannot read reads as uncertain there, whatever the column says)
        self.resolve = {
            action: f"""
WITH clk AS ({_NOW})
UPDATE {t} SET {assignments}, updated_at = clk.now FROM clk
WHERE org_id = %(org)s AND key = %(key)s{f" AND {_KEPT}" if action == "fail_refresh" else ""}
RETURNING {_COLS}
"""
            for action, assignments in _RESOLVE.items()
        }

    def _fence(self, t: str, set_sql: str, notify: bool) -> str:
        note = ""
        join = ""
        if notify:
            note = """,
note AS (
  SELECT count(*) AS n FROM (SELECT pg_notify(%(channel)s, %(org)s)::text
                             FROM (SELECT 1 WHERE EXISTS (SELECT 1 FROM upd)) w) x
)"""
            join = ", note"
        return f"""
WITH j AS (
  SELECT * FROM unnest(%(keys)b::text[], %(leases)b::text[], %(a)b::text[], %(b)b::text[])
    AS u(key, lease_id, a, b)
),
clk AS ({_NOW}),
locked AS ({_lock(t)}),
ok AS MATERIALIZED (
  SELECT l.*, j.a, j.b FROM locked l JOIN j ON j.key = l.key
  WHERE l.lease_id = j.lease_id AND l.lease_owner_run_id = %(run)s AND l.lease_owner_attempt = %(attempt)s
    AND l.status IN ('queued', 'running')
),
upd AS (
  UPDATE {t} AS r SET {set_sql} FROM ok l, clk WHERE r.org_id = l.org_id AND r.key = l.key RETURNING r.key
){note}
SELECT true, u.key, {_NULLS} FROM upd u{join}
UNION ALL SELECT false, l.* FROM locked l WHERE l.key NOT IN (SELECT key FROM upd)
"""
