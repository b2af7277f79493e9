"""SQL statements and row conversion of the SQLite receipt store.

Every statement carries all keys of a bulk operation at once through ``json_each(?)``;
the text of each is constant, so sqlite3's statement cache reuses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._codec import decode_json
from ._sqlite_schema import COLUMNS
from .types import FailureKind, Receipt, ReceiptStatus

_SELECT = f"SELECT {', '.join(COLUMNS)} FROM receipts"
_BY_KEYS = f"{_SELECT} WHERE org_id = ? AND key IN (SELECT value FROM json_each(?))"
_UPSERT_CLAIMS = f"""
INSERT INTO receipts ({", ".join(COLUMNS)})
SELECT value->>0, ?, value->>1, value->>2, 'queued', value->>3, NULL, NULL, NULL,
       value->>4, ?, ?, ?, value->>5, value->>6, ?, NULL
FROM json_each(?) WHERE true
ON CONFLICT (org_id, key) DO UPDATE SET
  status = 'queued', output = NULL, error = NULL, failure_kind = NULL,
  scope = excluded.scope, tool_id = excluded.tool_id, input_hash = excluded.input_hash,
  lease_id = excluded.lease_id, lease_owner_run_id = excluded.lease_owner_run_id,
  lease_owner_attempt = excluded.lease_owner_attempt,
  lease_expires_at = excluded.lease_expires_at, attempts = excluded.attempts,
  updated_at = excluded.updated_at, completed_at = NULL
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
    "status = 'completed', output = j.a, lease_expires_at = NULL, updated_at = ?, completed_at = ?"
)
_SET_FAIL = "status = 'failed', error = j.a, failure_kind = j.b, lease_expires_at = NULL, updated_at = ?"
_SET_RELEASE = (
    "status = 'pending', lease_id = NULL, lease_owner_run_id = NULL, lease_owner_attempt = NULL, "
    "lease_expires_at = NULL, updated_at = ?"
)
_DEFAULT_PURGE = (
    ReceiptStatus.COMPLETED,
    ReceiptStatus.FAILED,
    ReceiptStatus.PENDING,
    ReceiptStatus.SKIPPED,
)


def error_text(error: str) -> str:
    """Error text as stored: NUL (where SQLite's JSON functions cut a string short) and
    lone surrogates (no UTF-8 form) are written as backslash escapes."""
    return error.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


_STATUS_BY_VALUE = {status.value: status for status in ReceiptStatus}


def receipt_from_row(row: Sequence[Any]) -> Receipt:
    values = list(row)
    status = _STATUS_BY_VALUE.get(values[4])  # a dict hit is cheaper than the enum call
    values[4] = status if status is not None else ReceiptStatus(values[4])
    values[6] = decode_json(values[6])
    if values[8] is not None:
        values[8] = FailureKind(values[8])
    return Receipt(*values)
