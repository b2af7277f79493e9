"""Store calls side by side on Postgres (``ReceiptStoreActor`` lanes).

A Postgres store runs each call as its own transaction on a pooled connection, so the
store actor hands its calls to lanes instead of running them one after another: a slow
write of one call's output no longer holds up another call's claim. SQLite keeps one
writer (no lanes).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from actors import Tool
from stores import PostgresReceiptStore, SqliteReceiptStore

from ..calls.test_lease_cleanup import PG_URL, pg_schema
from ..conftest import WAIT_S

__all__ = ["pg_schema"]

SLOW_S = 1.0


@pytest.mark.waits
def test_lanes_a_slow_write_does_not_hold_up_another_calls_claim(make_system: Any, pg_schema: str) -> None:
    writing = threading.Event()

    class SlowWrites(PostgresReceiptStore):
        def complete_many(self, org_id: str, completions: Any, owner: Any) -> Any:
            if not writing.is_set():  # the first write (the slow tool's output) is slow
                writing.set()
                time.sleep(SLOW_S)
            return super().complete_many(org_id, completions, owner)

    store = SlowWrites(PG_URL, schema=pg_schema)
    try:
        slow = Tool(tool_id="slow", fn=lambda i, c: {"tool": "slow"})
        fast = Tool(tool_id="fast", fn=lambda i, c: {"tool": "fast"})
        system = make_system([slow, fast], store=store)
        first = system.proxy().execute("slow", {"n": 1})
        assert writing.wait(WAIT_S)
        t0 = time.monotonic()
        assert system.proxy().execute("fast", {"n": 1}).get(timeout=WAIT_S).value == {"tool": "fast"}
        took = time.monotonic() - t0
        assert first.get(timeout=WAIT_S).value == {"tool": "slow"}
        assert took < SLOW_S / 2, f"the fast call waited {took:.2f} s behind the slow write"
    finally:
        store.close()


def test_lanes_none_for_sqlite(tmp_path: Any) -> None:
    store = SqliteReceiptStore(tmp_path / "r.db")
    try:
        assert store.capabilities.parallel_calls == 1  # one writer: calls run in order
    finally:
        store.close()
