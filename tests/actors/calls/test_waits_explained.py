"""``stats()["waits"]``: where a run's time went per provider and tool, by reason, through a
real system: the calls of a paced provider wait for their turn (a slot or the send
gate), then run; a batch tool's calls wait for their batch to fill; every execution's
store claim and write count as ``store``. Real SQLite files."""

from __future__ import annotations

import time
from typing import Any

from actors import BatchStrategy, Pacing, Policy, Tool

from ..conftest import WAIT_S


def _slow(input: Any, ctx: Any) -> Any:
    time.sleep(0.05)
    return {"echo": input["i"]}


def test_a_paced_providers_time_is_split_between_waiting_its_turn_and_running(make_system: Any) -> None:
    tool = Tool(tool_id="verify", fn=_slow, provider="acme", pacing=Pacing(rps=20, burst=1))
    system = make_system([tool])
    futures = system.proxy().execute_many("verify", [{"i": i} for i in range(10)])
    [f.get(timeout=WAIT_S) for f in futures]
    waits = system.stats()["waits"]
    acme = waits["providers"]["acme"]
    assert waits["tools"]["verify"] == acme
    assert 0.45 <= acme["running"] < 5.0  # ten calls of 50 ms each
    # ten calls at 20/s with a burst of one: the last waits ~0.45 s, ~2.25 s in all
    assert acme.get("slot", 0.0) + acme.get("pacing", 0.0) >= 1.0
    assert acme["store"] > 0.0


def test_a_batch_tools_calls_count_the_wait_for_their_batch_to_fill(make_system: Any) -> None:
    batch = BatchStrategy(batch_fn=lambda p, c: [{"echo": i["i"]} for i in p], max_batch_size=50)
    tool = Tool(tool_id="enrich", fn=_slow, batch=batch)
    system = make_system([tool], policy=Policy(batch_grace_s=0.3))
    [f.get(timeout=WAIT_S) for f in system.proxy().execute_many("enrich", [{"i": i} for i in range(4)])]
    grace = system.stats()["waits"]["providers"]["enrich"]["batch_grace"]
    assert 4 * 0.25 <= grace < 4 * 3.0  # each of the four waited the grace (0.3 s)
