"""SQL statements of the Postgres receipt store.

Each bulk operation is ONE statement whose keys travel as arrays (``unnest``), so a
call costs one round trip whatever its size. The rules every statement keeps:

- "Now" is ``now()`` on the database server, read inside the deciding statement. A test
  passes its fake time as ``%(now)s`` instead; production passes NULL.
- Rows are locked in one fixed order (``ORDER BY key FOR UPDATE``, keys in the "C"
  collation), so two bulk calls over overlapping keys in different orders never
  deadlock. A claim first inserts the absent keys (also in key order), and only then
  locks the existing ones: the scalar subquery on ``ins`` in ``locked`` forces that order
  (sibling CTEs otherwise run in an unspecified order).
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

from ._sqlite_schema import COLUMNS

__all__ = ["Statements"]

_NOW = "SELECT coalesce(%(now)s::float8, extract(epoch FROM now())::float8) AS now"
_COLS = ", ".join(COLUMNS)


def _claimable(a: str) -> str:
    """The claim table of SEMANTICS.md for row alias ``a``: true where a claim takes it."""
    live = f"coalesce({a}.lease_expires_at > clk.now, false)"
    return f"""(CASE {a}.status
      WHEN 'completed' THEN %(force)s::boolean OR (%(stale)s::float8 IS NOT NULL
           AND clk.now - coalesce({a}.completed_at, {a}.updated_at) > %(stale)s::float8)
      WHEN 'queued' THEN NOT {live}
      WHEN 'running' THEN NOT {live}
      WHEN 'failed' THEN %(retry)s::boolean
      ELSE true END)"""


_FENCE_SET = {
    "running": "status = 'running', updated_at = clk.now",
    "running_renew": "status = 'running', lease_expires_at = clk.now + %(ttl)s, updated_at = clk.now",
    "renew": "lease_expires_at = clk.now + %(ttl)s, updated_at = clk.now",
    "complete": (
        "status = 'completed', output = j.a, lease_expires_at = NULL, updated_at = clk.now, "
        "completed_at = clk.now"
    ),
    "fail": (
        "status = 'failed', error = j.a, failure_kind = j.b, lease_expires_at = NULL, updated_at = clk.now"
    ),
    "release": (
        "status = 'pending', lease_id = NULL, lease_owner_run_id = NULL, lease_owner_attempt = NULL, "
        "lease_expires_at = NULL, updated_at = clk.now"
    ),
}
NOTIFYING = frozenset({"complete", "fail", "release"})
"""Fenced writes that end leases, and so may wake a waiter."""


class Statements:
    """The statements for one schema (``schema`` is an already quoted identifier)."""

    def __init__(self, schema: str, channel: str) -> None:
        t = f"{schema}.receipts"
        self.table = t
        self.channel = channel
        self.by_keys = f"SELECT {_COLS} FROM {t} WHERE org_id = %s AND key = ANY(%s::text[])"
        self.claim = f"""
WITH req AS (
  SELECT * FROM unnest(%(keys)s::text[], %(scopes)s::text[], %(tools)s::text[], %(hashes)s::text[],
                       %(leases)s::text[]) AS r(key, scope, tool_id, input_hash, lease_id)
),
clk AS ({_NOW}),
ins AS (
  INSERT INTO {t} AS r (key, org_id, scope, tool_id, status, input_hash, lease_id, lease_owner_run_id,
                        lease_owner_attempt, lease_expires_at, attempts, created_at, updated_at)
  SELECT req.key, %(org)s, req.scope, req.tool_id, 'queued', req.input_hash, req.lease_id, %(run)s,
         %(attempt)s, clk.now + %(ttl)s, 1, clk.now, clk.now
  FROM req, clk ORDER BY req.key
  ON CONFLICT (org_id, key) DO NOTHING
  RETURNING {", ".join("r." + c for c in COLUMNS)}
),
snap AS (SELECT {_COLS} FROM {t} WHERE org_id = %(org)s AND key = ANY(%(keys)s::text[])),
cand AS (SELECT s.key FROM snap s, clk WHERE {_claimable("s")}),
locked AS (
  SELECT {_COLS} FROM {t}
  WHERE org_id = %(org)s AND key IN (SELECT key FROM cand) AND (SELECT count(*) FROM ins) >= 0
  ORDER BY key FOR UPDATE
),
upd AS (
  UPDATE {t} AS r SET status = 'queued', output = NULL, error = NULL, failure_kind = NULL,
    scope = req.scope, tool_id = req.tool_id, input_hash = req.input_hash, lease_id = req.lease_id,
    lease_owner_run_id = %(run)s, lease_owner_attempt = %(attempt)s, lease_expires_at = clk.now + %(ttl)s,
    attempts = l.attempts + 1, updated_at = clk.now, completed_at = NULL
  FROM locked l JOIN req ON req.key = l.key, clk
  WHERE r.org_id = %(org)s AND r.key = l.key AND {_claimable("l")}
  RETURNING {", ".join("r." + c for c in COLUMNS)}
)
SELECT true, clk.now, ins.* FROM ins, clk
UNION ALL SELECT true, clk.now, upd.* FROM upd, clk
UNION ALL SELECT false, clk.now, l.* FROM locked l, clk WHERE l.key NOT IN (SELECT key FROM upd)
UNION ALL SELECT false, clk.now, s.* FROM snap s, clk WHERE s.key NOT IN (SELECT key FROM cand)
"""
        self.fence = {op: self._fence(t, set_sql, op in NOTIFYING) for op, set_sql in _FENCE_SET.items()}
        self.in_flight = f"""
WITH clk AS ({_NOW})
SELECT key FROM {t}, clk WHERE org_id = %(org)s AND key = ANY(%(keys)s::text[])
  AND status IN ('queued', 'running') AND coalesce(lease_expires_at > clk.now, false)
"""
        self.purge = f"""
WITH clk AS ({_NOW}),
doomed AS (
  SELECT org_id, key FROM {t}, clk
  WHERE updated_at <= clk.now - %(older)s AND status = ANY(%(statuses)s::text[])
    AND NOT coalesce(lease_expires_at > clk.now, false)
    AND (%(org)s::text IS NULL OR org_id = %(org)s::text)
  ORDER BY org_id, key FOR UPDATE
)
DELETE FROM {t} r USING doomed d WHERE r.org_id = d.org_id AND r.key = d.key
"""

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
  SELECT * FROM unnest(%(keys)s::text[], %(leases)s::text[], %(a)s::text[], %(b)s::text[])
    AS u(key, lease_id, a, b)
),
clk AS ({_NOW}),
locked AS (
  SELECT {_COLS} FROM {t} WHERE org_id = %(org)s AND key = ANY(%(keys)s::text[])
  ORDER BY key FOR UPDATE
),
upd AS (
  UPDATE {t} AS r SET {set_sql}
  FROM locked l JOIN j ON j.key = l.key, clk
  WHERE r.org_id = %(org)s AND r.key = l.key AND l.lease_id = j.lease_id
    AND l.lease_owner_run_id = %(run)s AND l.lease_owner_attempt = %(attempt)s
    AND l.status IN ('queued', 'running')
  RETURNING r.key
){note}
SELECT l.key IN (SELECT key FROM upd), l.* FROM locked l{join}
"""
