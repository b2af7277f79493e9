"""A cancel at the send gate against a real limiter (nginx ``limit_req``, 4 r/s, no
burst): calls wait at the gate for their turns and one is cancelled. The turn it gives
back must not put a later call on a turn another holds (on 09450ef nginx answered 429
and the learnt rate was cut to 1.69)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from actors import CallCancelledError, Pacing, Policy, RateLimitedError
from actors.http import http_tool

from ..conftest import ORG, until

pytestmark = pytest.mark.scenario
WAIT_S = 60.0


@pytest.mark.parametrize("cancel", [False, True], ids=["no-cancel", "cancel"])
def test_gate_nginx_a_cancel_at_the_gate_meets_no_429(nginx: Any, make_system: Any, cancel: bool) -> None:
    # nginx takes one request per 250 ms; the tool states 2/s (one per 500 ms), so a late
    # worker's jitter (the machine shared by parallel suites) has 250 ms of room, while
    # two requests leaving on one turn (the fault) still meet a 429
    limiter = nginx(4, burst=0)
    tool = http_tool("verify", limiter.url, provider="nginx", pacing=Pacing(rps=2), timeout_s=30.0)
    system = make_system([tool], policy=Policy(batch_grace_s=0.0, retry_attempts=1))
    assert system.proxy().execute("verify", {"i": 0}).get(timeout=WAIT_S).execution == "live"
    gate = system.gates.get(ORG, "nginx")
    gate.set_rate(1.0)  # the gate a little slower than the governor: a queue forms there
    futures = {}
    for i in (1, 2, 3, 4):
        booked = gate.next_turn
        futures[i] = system.proxy().execute("verify", {"i": i})
        until(lambda booked=booked: gate.next_turn > booked, f"call {i} to book its turn")
    if cancel:
        futures[3].cancel()
    threading.Event().wait(0.05)
    futures[5] = system.proxy().execute("verify", {"i": 5})
    outcomes = {}
    for i, f in futures.items():
        try:
            outcomes[i] = f.get(timeout=WAIT_S)
        except Exception as exc:
            outcomes[i] = exc
    statuses = limiter.statuses()
    limited = [i for i, o in outcomes.items() if isinstance(o, RateLimitedError)]
    kinds = {i: type(o).__name__ for i, o in outcomes.items()}
    failed = [o for o in outcomes.values() if isinstance(o, Exception) and type(o) is not CallCancelledError]
    assert not failed, f"nginx saw {statuses}; outcomes {kinds} (429: {limited})"
    assert statuses.get(429, 0) == 0, (
        f"nginx (4 r/s, burst 0) answered {statuses}; outcomes {kinds}; gate rate now {gate.rps}"
    )
