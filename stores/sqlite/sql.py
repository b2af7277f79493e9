"""SQL statements and row conversion of the SQLite receipt store.

Every statement carries all keys of a bulk operation at once through ``json_each(?)``;
the text of each is constant, so sqlite3's statement cache reuses it.
"""

from __future__ import annotations

from stores.dispositions import REFRESH_LOST
from stores.rows import COLUMNS

assert "'" not in REFRESH_LOST  # quoted as a SQL literal below
_LOST = f"'{REFRESH_LOST}'"

_KEEPS_OUTPUT = "receipts.completed_at IS NOT NULL AND receipts.status IN ('completed', 'queued', 'running')"
_SELECT = f"SELECT {', '.join(COLUMNS)} FROM receipts"
_BY_KEYS = f"{_SELECT} WHERE org_id = ? AND key IN (SELECT value FROM json_each(?))"
# What a normal claim reuses (stores.dispositions.decide_disposition: completed, fresh enough),
# the output text as stored: the caller's plain read of a cold rerun.
_REUSABLE_TAKEN = (
    # "+status": no index on status for this term, so each key is looked up by primary key
    # (with status = ? the planner may scan every completed receipt of the file instead)
    "AND +status = 'completed' "
    # values a reader would not take (set by hand): left to a claim, which says so for
    # that call alone (a text time here failed the whole bulk read with a TypeError)
    "AND typeof(output) = 'text' AND typeof(input_hash) = 'text' "
    "AND typeof(coalesce(completed_at, updated_at)) IN ('integer', 'real') "
    "AND typeof(generation) = 'integer'"
)
_REUSABLE = (
    "SELECT key, input_hash, output, coalesce(completed_at, updated_at), cost FROM receipts "
    f"WHERE org_id = ? AND key IN (SELECT value FROM json_each(?)) {_REUSABLE_TAKEN}"
)
_REUSABLE_ONE = (
    "SELECT key, input_hash, output, coalesce(completed_at, updated_at), cost FROM receipts "
    f"WHERE org_id = ? AND key = ? {_REUSABLE_TAKEN}"
)
"""One key's read (a lone call of a rerun): a point lookup, without encoding the key as a
JSON list for ``json_each`` (~11 µs against ~17 µs a statement, measured)."""
_READ_AHEAD_START = (
    "SELECT min(updated_at) FROM receipts WHERE org_id = ? AND key IN (SELECT value FROM json_each(?)) "
    "AND typeof(updated_at) IN ('integer', 'real')"
)
_READ_AHEAD = (
    # a range of the (status, updated_at) index, in its order; ties at the page's edge
    # are told apart by key
    "SELECT key, input_hash, output, updated_at, cost FROM receipts "
    "WHERE status = 'completed' AND updated_at >= ? AND typeof(updated_at) IN ('integer', 'real') "
    "AND NOT (updated_at = ? AND key <= ?) AND org_id = ? AND tool_id = ? "
    "AND typeof(output) = 'text' AND typeof(input_hash) = 'text' AND typeof(generation) = 'integer' "
    "ORDER BY updated_at, key LIMIT ?"
)
"""A rerun's receipts read ahead of its calls (``read_completed_since``)."""
_UPSERT_CLAIMS = f"""
INSERT INTO receipts ({", ".join(COLUMNS)})
SELECT value->>0, ?, value->>1, value->>2, value->>8, value->>3, NULL, NULL, NULL,
       value->>4, ?, ?, ?, value->>5, value->>6, ?, NULL, value->>7, ?, ?, ?, value->>9, value->>10, NULL
FROM json_each(?) WHERE true
ON CONFLICT (org_id, key) DO UPDATE SET
  status = excluded.status, error = NULL, failure_kind = NULL,
  output = CASE WHEN {_KEEPS_OUTPUT} THEN receipts.output END,
  completed_at = CASE WHEN {_KEEPS_OUTPUT} THEN receipts.completed_at END,
  scope = excluded.scope, tool_id = excluded.tool_id, input_hash = excluded.input_hash,
  lease_id = excluded.lease_id, lease_owner_run_id = excluded.lease_owner_run_id,
  lease_owner_attempt = excluded.lease_owner_attempt,
  lease_expires_at = excluded.lease_expires_at, attempts = excluded.attempts,
  updated_at = excluded.updated_at, generation = excluded.generation,
  lease_owner_host = excluded.lease_owner_host, lease_owner_pid = excluded.lease_owner_pid,
  lease_owner_started_at = excluded.lease_owner_started_at,
  input_text = coalesce(excluded.input_text, receipts.input_text), batch_key = excluded.batch_key
"""
# Claims that change a receipt without taking a lease (decided in Python on the rows
# read in the same transaction): a lost refresh goes back to completed, a lost running
# call of a tool that is not retry-safe becomes uncertain.
_RESTORE_COMPLETED = f"""
UPDATE receipts SET status = 'completed', error = {_LOST}, lease_expires_at = NULL, updated_at = ?,
  lease_id = NULL, lease_owner_run_id = NULL, lease_owner_attempt = NULL,
  lease_owner_host = NULL, lease_owner_pid = NULL, lease_owner_started_at = NULL
WHERE org_id = ? AND key IN (SELECT value FROM json_each(?))
"""
_SET_UNCERTAIN_LOST = """
UPDATE receipts SET status = 'uncertain', error = j.e, failure_kind = NULL,
  lease_expires_at = NULL, updated_at = ?
FROM (SELECT value->>0 AS k, value->>1 AS e FROM json_each(?)) AS j
WHERE receipts.org_id = ? AND receipts.key = j.k
"""
# Batch requests recorded before they are sent (stores.types.BatchRecord): read by a claim
# that takes a member over, written with the members' running mark.
_BATCHES_BY_KEYS = (
    "SELECT batch_key, tool_id, members FROM batches "
    "WHERE org_id = ? AND batch_key IN (SELECT value FROM json_each(?))"
)
_INSERT_BATCH = (
    "INSERT INTO batches (org_id, batch_key, tool_id, members, created_at) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (org_id, batch_key) DO NOTHING"
)
_SET_BATCH_KEY = (
    "UPDATE receipts SET batch_key = ? WHERE org_id = ? AND key IN (SELECT value FROM json_each(?))"
)
# records no receipt still needs (one whose next claim keeps its generation names it):
# the subquery is built once (an anti-join), not run per record
_PURGE_BATCHES = f"""
DELETE FROM batches WHERE created_at <= ? AND (? IS NULL OR org_id = ?)
AND (org_id, batch_key) NOT IN (
  SELECT org_id, batch_key FROM receipts WHERE batch_key IS NOT NULL
  AND (status NOT IN ('completed', 'failed') OR (status = 'failed' AND failure_kind = 'timeout')
       OR (status = 'completed' AND error = {_LOST}))
)
"""
# The MATERIALIZED CTE makes SQLite drive the update from the keys and look each one
# up by primary key; a plain UPDATE ... FROM (subquery) scans the whole org instead.
_FENCE = """
WITH j(k, l, a, b) AS MATERIALIZED (
  SELECT value->>0, value->>1, value->>2, value->>3 FROM json_each(?)
)
UPDATE receipts SET {set} FROM j
WHERE receipts.org_id = ? AND receipts.key = j.k AND receipts.lease_id = j.l
  AND receipts.lease_owner_run_id = ? AND receipts.lease_owner_attempt = ?
  AND receipts.status IN ('queued', 'running')
RETURNING receipts.key
"""
_SET_RUNNING = "status = 'running', updated_at = ?"
_SET_RUNNING_RENEW = "status = 'running', lease_expires_at = ? + ?, updated_at = ?"
_SET_RENEW = "lease_expires_at = ? + ?, updated_at = ?"
_SET_COMPLETE = (
    "status = 'completed', output = j.a, cost = j.b, lease_expires_at = NULL, updated_at = ?, "
    "completed_at = ?"
)
# A receipt that still holds a previous output (a refresh) goes back to completed.
# Its lease is dropped (lease id and owner too), so the lost owner's late completion is
# refused as completed by another, never answered "applied".
_LEASE_COLUMNS = (
    "lease_id", "lease_owner_run_id", "lease_owner_attempt", "lease_owner_host", "lease_owner_pid",
    "lease_owner_started_at",
)  # fmt: skip
_SET_FAIL = (
    "status = CASE WHEN completed_at IS NULL THEN 'failed' ELSE 'completed' END, "
    "error = CASE WHEN completed_at IS NULL THEN j.a END, "
    "failure_kind = CASE WHEN completed_at IS NULL THEN j.b END, lease_expires_at = NULL, updated_at = ?, "
    + ", ".join(f"{c} = CASE WHEN completed_at IS NULL THEN {c} END" for c in _LEASE_COLUMNS)
)
_SET_UNCERTAIN = (
    "status = 'uncertain', error = j.a, failure_kind = j.b, lease_expires_at = NULL, updated_at = ?"
)
_SET_RELEASE = (
    "status = CASE WHEN completed_at IS NULL THEN 'pending' ELSE 'completed' END, "
    "lease_id = NULL, lease_owner_run_id = NULL, lease_owner_attempt = NULL, "
    "lease_owner_host = NULL, lease_owner_pid = NULL, lease_owner_started_at = NULL, "
    "lease_expires_at = NULL, updated_at = ?"
)
_KEPT_OUTPUT = "typeof(completed_at) IN ('integer', 'real') AND output IS NOT NULL"
"""A rerun keeps the stored output only when it is one a reader takes as an output (a
completion time that is a number, an output there): else the call goes again."""
# An uncertain refresh (it kept its previous output) resolved --rerun or --fail is the
# completed receipt it was: the last good output stands, no lease left on it.
_KEPT_NO_LEASE = ", ".join(f"{c} = CASE WHEN {_KEPT_OUTPUT} THEN NULL ELSE {c} END" for c in _LEASE_COLUMNS)
_RESOLVE = {
    # generation: a value a reader cannot take (text, a fraction) is what made the receipt
    # uncertain; resolved, it starts again at 1 (else it stayed uncertain after resolve)
    action: f"UPDATE receipts SET {assignments}, updated_at = ?, generation = CASE WHEN "
    "typeof(generation) = 'integer' THEN generation ELSE 1 END WHERE org_id = ? AND key = ?"
    for action, assignments in {
        "rerun": f"status = CASE WHEN {_KEPT_OUTPUT} THEN 'completed' ELSE 'pending' END, "
        f"output = CASE WHEN {_KEPT_OUTPUT} THEN output END, "
        f"completed_at = CASE WHEN {_KEPT_OUTPUT} THEN completed_at END, "
        f"error = NULL, failure_kind = NULL, lease_expires_at = NULL, batch_key = NULL, {_KEPT_NO_LEASE}",
        # no lease is held once decided: one left (a text or far expiry set by hand) kept the
        # failed or completed receipt from every purge (a text sorts after every number)
        "fail": "status = 'failed', error = ?, failure_kind = 'permanent', lease_expires_at = NULL",
        "complete": "status = 'completed', output = ?, error = NULL, failure_kind = NULL, completed_at = ?, "
        "lease_expires_at = NULL",
    }.items()
}
_RESOLVE_FAILED_REFRESH = (
    "UPDATE receipts SET status = 'completed', error = NULL, failure_kind = NULL, lease_expires_at = NULL, "
    f"{', '.join(f'{c} = NULL' for c in _LEASE_COLUMNS)}, updated_at = ? "
    f"WHERE org_id = ? AND key = ? AND {_KEPT_OUTPUT}"
)
"""``resolve(FAIL)`` of an uncertain refresh that kept a readable previous output: the
refresh failed, so the last good output stands (``completed``), as after ``fail_many``."""
_BUMP_PURGE_EPOCH = (
    "INSERT INTO meta (name, value) VALUES ('purge_epoch', 1) "
    "ON CONFLICT (name) DO UPDATE SET value = value + 1"
)
