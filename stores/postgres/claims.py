"""The Postgres store's plain-read step of a claim (see :func:`stores.claims.settled_by_read`).

One ``SELECT`` (no lock, no write) with the database clock answers the keys whose
receipts are settled (reused, recorded failures, uncertain); only the rest go through
the claim statement.
"""

from __future__ import annotations

from typing import Any

from stores.claims import settled_by_read
from stores.rows import receipt_from_row
from stores.types import Claim, ClaimMode, ClaimRequest

__all__ = ["read_settled", "read_settled_sql"]


def read_settled_sql(ctes: str, rows: str, now_sql: str) -> str:
    """The read: each requested row with the database's now (``%(now)s`` a test's fake);
    ``rows`` the select list and ``FROM`` of the rows of ``%(org)s`` for ``%(keys)s``,
    ``ctes`` the CTEs it reads (see :mod:`stores.postgres.sql`)."""
    return f"WITH clk AS ({now_sql}), {ctes} SELECT clk.now, {rows}, clk"


def read_settled(
    store: Any,
    org_id: str,
    requests: list[ClaimRequest],
    mode: ClaimMode,
    stale_after_s: float | None,
    lock_wait_s: float | None = None,
) -> tuple[dict[str, Claim], list[ClaimRequest]]:
    """(answers, misses) for ``requests`` (unique keys) of a
    :class:`~stores.postgres.store.PostgresReceiptStore`; a forced refresh reads nothing.
    ``lock_wait_s``: the most seconds the read waits for a table lock (None: no bound).

    Raises:
        StoreBusyError: the lock not granted within ``lock_wait_s``.
    """
    if mode is ClaimMode.FORCE_REFRESH or not requests:
        return {}, requests
    params = {"org": org_id, "keys": [r.key for r in requests], "now": store._now()}
    rows = store._conns.execute(store._sql.read_settled, params, lock_wait_s=lock_wait_s)
    if not rows:
        return {}, requests
    now = rows[0][0]
    existing = {row[1]: receipt_from_row(row[1:]) for row in rows}
    return settled_by_read(requests, existing, now, mode, stale_after_s)
