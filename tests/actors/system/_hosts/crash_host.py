"""A host process for the crash test: runs many calls of one durable tool on a SQLite file.

Usage: ``python crash_host.py DB LOG --run-id R --run-attempt N --calls N --signal-after K
--stall-after S`` (prefix ``-m gevent.monkey`` for the gevent runtime). The tool appends one
line per provider call to LOG (``<receipt key> <n> <run id>/<attempt>``, flushed and
fsynced before it works), then works for ``--work-s`` seconds; provider calls after the
S-th hang until the process is killed (so a kill always lands mid-run). The host prints
``PROGRESS K`` once K results (in any order) are back, and at the end one ``RESULT`` line
(JSON: ``n -> [receipt key, execution, value]``) after stopping cleanly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from typing import Any

from actors import DispatchSystem, Policy, RunInfo, Tool
from stores import SqliteReceiptStore

MAX_CONCURRENCY = 4
LEASE_TTL_S = 0.5


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("log")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--run-attempt", type=int, default=1)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--signal-after", type=int, default=0)
    parser.add_argument("--work-s", type=float, default=0.02)
    parser.add_argument("--stall-after", type=int, default=0)
    args = parser.parse_args(argv)
    label = f"{args.run_id}/{args.run_attempt}"
    log_lock = threading.Lock()
    never = threading.Event()
    started = [0]

    def provider(inp: Any, ctx: Any) -> Any:
        line = f"{ctx.receipt_key} {inp['n']} {label}\n".encode()
        with log_lock:
            started[0] += 1
            stall = 0 < args.stall_after < started[0]
            fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
        never.wait(600.0 if stall else args.work_s)  # the provider works (or hangs until killed)
        return {"n": inp["n"], "square": inp["n"] * inp["n"]}

    system = DispatchSystem.start(
        tools=[Tool(tool_id="enrich", fn=provider, retry_safe=True)],  # a lost call may run again
        store=SqliteReceiptStore(args.db),
        run=RunInfo(run_id=args.run_id, run_attempt=args.run_attempt, org_id="acme", scope="crash"),
        policy=Policy(max_concurrency=MAX_CONCURRENCY, lease_ttl_s=LEASE_TTL_S),
    )
    results: dict[int, Any] = {}
    errors: list[BaseException] = []
    done = threading.Lock()

    def collect(n: int, future: Any) -> None:
        try:
            result = future.get(timeout=120)
        except BaseException as exc:
            with done:
                errors.append(exc)
            return
        with done:
            results[n] = [result.receipt_key, result.execution, result.value]
            if len(results) == args.signal_after:
                print(f"PROGRESS {len(results)}", flush=True)

    with system:
        futures = [system.proxy().execute("enrich", {"n": n}) for n in range(args.calls)]
        # One waiter per call, so progress counts results in the order they come back.
        waiters = [threading.Thread(target=collect, args=(n, f), daemon=True) for n, f in enumerate(futures)]
        for waiter in waiters:
            waiter.start()
        for waiter in waiters:
            waiter.join()
    if errors:
        print("ERRORS " + "; ".join(repr(e) for e in errors), file=sys.stderr, flush=True)
        return 1
    print("RESULT " + json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
