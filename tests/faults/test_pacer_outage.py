"""A shared pacer's Redis restarted under a dispatch system: the calls go on (paced locally
meanwhile), and the system's ``stats()["outages"]`` (what the run's report shows) names
the pacer's outage with its duration. The Redis is this test's own."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from actors import DispatchSystem, Pacing, Policy, RunInfo, Tool
from actors.pacing import RedisPacer
from stores import SqliteReceiptStore

pytestmark = pytest.mark.scenario

WAIT_S = 15.0


def test_a_redis_restart_is_an_outage_of_the_pacer_named_with_its_duration(
    tmp_path: Any, own_redis: Any
) -> None:
    pacer = RedisPacer(own_redis.url, prefix="td-faults", retry_s=0.05)
    store = SqliteReceiptStore(tmp_path / "receipts.db")
    tool = Tool(tool_id="api", fn=lambda input, ctx: {"ok": input["n"]}, pacing=Pacing(rps=200.0))
    system = DispatchSystem.start(
        tools=[tool], store=store, run=RunInfo(run_id="r1", org_id="acme", scope="s"),
        policy=Policy(batch_grace_s=0.01), pacer=pacer,
    )  # fmt: skip
    try:
        proxy = system.proxy()
        assert proxy.execute("api", {"n": 0}).get(timeout=WAIT_S).value == {"ok": 0}
        own_redis.stop()
        assert proxy.execute("api", {"n": 1}).get(timeout=WAIT_S).value == {"ok": 1}  # paced locally
        (away,) = system.stats()["outages"]
        assert (away["service"], away["ongoing"]) == ("pacer", True)
        assert own_redis.start()
        tick, n = threading.Event(), 2
        while system.stats()["outages"][0]["ongoing"]:  # each call tries Redis again (every 0.05 s)
            assert n < WAIT_S / 0.01, "the pacer never rejoined Redis"
            assert proxy.execute("api", {"n": n}).get(timeout=WAIT_S).value == {"ok": n}
            n += 1
            tick.wait(0.01)
        (back,) = system.stats()["outages"]
        assert back["service"] == "pacer" and back["where"] == own_redis.url
        assert back["duration_s"] > 0.0 and back["failures"] >= 1 and not back["ongoing"]
    finally:
        system.stop(timeout_s=WAIT_S)
        store.close()
        pacer.close()
