"""A stop while a claim is out: its calls are refused as cancelled when it lands, and
counted so (stats['cancelled'] said 0 for 3 calls answered CallCancelledError).
Breaker round 2; both runtimes."""

from __future__ import annotations

import threading
from typing import Any

from actors import CallCancelledError, Policy, Tool
from stores import SqliteReceiptStore

from ..conftest import WAIT_S

_claiming = threading.Event()
_release = threading.Event()


class SlowClaims(SqliteReceiptStore):
    def claim_many(self, *args: Any, **kwargs: Any) -> Any:
        _claiming.set()
        _release.wait(WAIT_S)
        return super().claim_many(*args, **kwargs)


def test_stop_while_a_claim_is_out_counts_its_calls_cancelled(make_system: Any, db_path: Any) -> None:
    _claiming.clear()
    _release.clear()
    sent: list[Any] = []

    def fn(input: Any, ctx: Any) -> Any:
        sent.append(input)
        return {"i": input["i"]}

    store = SlowClaims(db_path)
    try:
        system = make_system([Tool(tool_id="t", fn=fn)], policy=Policy(batch_grace_s=0.0), store=store)
        futures = system.proxy().execute_many("t", [{"i": 1}, {"i": 2}, {"i": 3}])
        assert _claiming.wait(WAIT_S)
        threading.Timer(0.3, _release.set).start()
        system.stop(timeout_s=WAIT_S)
        outcomes = []
        for f in futures:
            try:
                outcomes.append(f.get(timeout=WAIT_S))
            except Exception as exc:
                outcomes.append(exc)
        assert sent == []
        assert all(isinstance(o, CallCancelledError) for o in outcomes), outcomes
        stats = system.stats()
        assert stats.get("cancelled", 0) == 3, (
            f"3 calls answered CallCancelledError by the stop, stats say cancelled={stats.get('cancelled')}"
        )
    finally:
        _release.set()
        store.close()
