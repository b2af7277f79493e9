"""Wake latency bench (issue 11): a call waiting on another worker's running receipt.

Run from the repository root (Postgres on 127.0.0.1:5432)::

    python bench/wake_bench.py                 # 10 rounds per mode
    python bench/wake_bench.py --rounds 20

Worker A is a :class:`actors.DispatchSystem` on a Postgres store with the default
policy (polls back off from 10 ms to 1 s); worker B is a second store owner on the same
schema. Each round B holds a new key running, A's call of it waits, B completes it after
a random 0.3-1.5 s (so it lands anywhere in A's poll cycle), and the figure is the time
from B's completion to A's answer. *notify*: the store's LISTEN/NOTIFY change feed wakes
A; *poll*: the same store with its change feed turned off (timer polls only, as before).
Prints median, 90th percentile and max in ms per mode.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from actors import DispatchSystem, Policy, RunInfo, Tool
from stores import ClaimRequest, Completion, LeaseRef, Owner, PostgresReceiptStore
from stores.keys import key_and_input_hash

URL = "postgresql://postgres@127.0.0.1:5432/test"
ORG, SCOPE = "acme", "bench"
B = Owner("run-b")
TOOL = Tool(tool_id="lookup", fn=lambda value, ctx: {"live": value})


class PollingOnly(PostgresReceiptStore):
    """The Postgres store with its change feed off: waiters poll, as before issue 11."""

    def change_feed(self) -> Any:
        return None


def _until(predicate: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError("condition not reached")
        time.sleep(0.005)


def run(mode: str, rounds: int, url: str) -> list[float]:
    schema = f"td_wake_{uuid.uuid4().hex[:8]}"
    store_a = (PostgresReceiptStore if mode == "notify" else PollingOnly)(url, schema=schema, max_size=3)
    store_b = PostgresReceiptStore(url, schema=schema, max_size=2)
    system = DispatchSystem.start(
        tools=[TOOL], store=store_a, run=RunInfo(run_id="run-a", org_id=ORG, scope=SCOPE),
        policy=Policy(batch_grace_s=0.0),
    )  # fmt: skip
    latencies = []
    try:
        for i in range(rounds):
            value = {"round": i, "mode": mode}
            key, input_hash = key_and_input_hash(
                org_id=ORG, scope=SCOPE, tool_id=TOOL.tool_id, input=value, version=TOOL.version
            )
            (claim,) = store_b.claim_many(
                ORG, [ClaimRequest(key, SCOPE, TOOL.tool_id, input_hash)], B, lease_ttl_s=300
            )
            lease = LeaseRef(key, claim.receipt.lease_id)
            store_b.mark_running_many(ORG, [lease], B)
            future = system.proxy().execute(TOOL.tool_id, value)
            _until(lambda: system.stats_.snapshot().get("waiting_on_owner"))
            threading.Event().wait(random.uniform(0.3, 1.5))
            started = time.monotonic()
            store_b.complete_many(ORG, [Completion(key, lease.lease_id, {"by": "b"})], B)
            result = future.get(timeout=30)
            latencies.append((time.monotonic() - started) * 1000.0)
            assert result.execution == "in_flight", result
    finally:
        system.stop(timeout_s=10)
        store_a.close()
        store_b.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--url", default=URL)
    args = parser.parse_args()
    print(f"{'mode':8} {'median ms':>10} {'p90 ms':>8} {'max ms':>8}  (completion -> waiter answered)")
    for mode in ("notify", "poll"):
        ms = sorted(run(mode, args.rounds, args.url))
        p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
        print(f"{mode:8} {statistics.median(ms):10.1f} {p90:8.1f} {ms[-1]:8.1f}")


if __name__ == "__main__":
    main()
