"""A worker process of the shared limits test: a DispatchSystem pacing through one Redis.

Usage: ``limits_worker.py PACER_URL PROVIDER_URL DB FIRST N``. Prints ``{"ready": true}``
once started; on the line ``go`` runs calls ``FIRST .. FIRST + N - 1`` of a tool under
``Pacing(limits=[50/s, 100 requests per 4 s, 2000 tokens per 4 s])`` (each call states
its tokens, and uses what the provider answers) and prints ``{"outcomes": {...},
"degraded": bool}``.
"""

from __future__ import annotations

import json
import random
import sys

import attrs

from actors import DispatchSystem, Limit, Pacing, Policy, RunInfo
from actors.http import http_tool
from actors.pacing import open_pacer
from stores import SqliteReceiptStore


def main() -> None:
    pacer_url, provider_url, db, first, n = sys.argv[1:6]
    pacer = open_pacer(pacer_url)
    limits = [Limit(50, "second"), Limit(100, 4.0), Limit(2000, 4.0, "tokens")]
    tool = http_tool("call", provider_url, provider="limited", pacing=Pacing(limits=limits), timeout_s=120.0)
    tool = attrs.evolve(
        tool,
        units=lambda input: {"tokens": input["tokens"]},
        units_used=lambda input, output: {"tokens": output["tokens"]},
    )
    store = SqliteReceiptStore(db)
    system = DispatchSystem.start(
        tools=[tool], store=store, run=RunInfo(run_id=f"w{first}", org_id="acme", scope="limits"),
        policy=Policy(batch_grace_s=0.01, retry_attempts=0), pacer=pacer,
    )  # fmt: skip
    rng = random.Random(int(first))
    inputs = [{"i": i, "tokens": rng.randint(5, 40)} for i in range(int(first), int(first) + int(n))]
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()
    outcomes: dict[str, int] = {}
    for future in system.proxy().execute_many("call", inputs):
        try:
            name = future.get(timeout=300).execution
        except Exception as exc:
            name = type(exc).__name__
        outcomes[name] = outcomes.get(name, 0) + 1
    degraded = bool(pacer.snapshot().get("outages"))
    system.stop(timeout_s=60)
    store.close()
    pacer.close()
    print(json.dumps({"outcomes": outcomes, "degraded": degraded}), flush=True)


if __name__ == "__main__":
    main()
