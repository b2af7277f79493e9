"""A stated limit so slow that a call's request gets its token only after the call's
timeout: the call is refused at once, not sent, its receipt left pending (as a spent
quota's), instead of waiting far past its ``timeout_s``. The whole system, threads or
gevent; a plain tool stands for the provider."""

from __future__ import annotations

import time
from typing import Any

from actors import Pacing, Policy, QuotaExhaustedError, Tool
from stores.types import ReceiptStatus

from ..conftest import WAIT_S


def test_slow_stated_limit_refuses_calls_past_their_timeout_receipts_pending(
    make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    sent: list[int] = []

    def call(body: dict[str, int], ctx: Any) -> dict[str, int]:
        sent.append(body["i"])
        return body

    tool = Tool(tool_id="slow", fn=call, provider="slow", timeout_s=2.0, pacing=Pacing(rps=0.01))
    system = make_system([tool], policy=Policy(batch_grace_s=0.01))
    inputs = [{"i": i} for i in range(3)]
    started = time.monotonic()
    results: list[Any] = []
    for future in system.proxy().execute_many("slow", inputs):
        try:
            results.append(future.get(timeout=WAIT_S))
        except Exception as exc:
            results.append(exc)
    assert time.monotonic() - started < 2.0  # refused at once, not at (or past) the timeout
    refused = [r for r in results if isinstance(r, QuotaExhaustedError)]
    assert len(sent) == 1 and len(refused) == 2  # the bucket's one token; one per 102 s after it
    assert refused[0].limit == "0.01 requests/s" and refused[0].reset_s > 2.0
    statuses = [r.status for r in read_receipts([key_of(tool, i) for i in inputs])]
    assert statuses.count(ReceiptStatus.PENDING) == 2  # a rerun pays for them later
