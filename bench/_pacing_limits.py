"""Pacing bench cases: several limits on one provider, and a limit in tokens (issue 29).

Each case runs, in a child process of its runtime (plain threads, or gevent
monkey-patching), the whole system (:class:`actors.DispatchSystem`, an
:func:`actors.http.http_tool` stating the provider's limits, a SQLite receipt store)
against ``examples/provider.py`` with ``--limit`` (fixed windows from its start, a token
bucket per second). More calls than the limits serve in ``seconds`` are submitted at
once; every answer is timed as it arrives (an httpx response hook), from the first
request sent.

* ``two_limits_case(runtime, seconds=90)``: ``--limit 50/s --limit 1000/min`` (burst 10),
  ``Pacing(limits=[Limit(50, "second"), Limit(1000, "minute")])``. Two rows: ``50/s``
  (``achieved``: requests accepted per second over the first 10 s, while the quota has
  room; ``max_window``: the most accepted in any 1 s) and ``1000/min`` (``achieved``:
  accepted over the run; ``share``: that / the most the provider accepts in it, each of
  its windows' 1000 or what 50/s sends in the part of it the run covers (90 s: 2,000);
  ``max_window``: the most accepted in any 60 s, which must not pass 1000). Target:
  ``share`` >= 0.95, ``n429`` == 0.
* ``tokens_case(runtime, seconds)``: ``--limit 20000/min:tokens``; calls state 100 to
  2,000 tokens (their estimate, ``Tool.units``) and use 50 % to 150 % of it (the
  provider's ``used``, read back by ``Tool.units_used``). One row: ``achieved``: tokens
  used by accepted calls over the run; ``share``: that / 20000 x ceil(seconds / 60).
  Target: ``share`` >= 0.90, ``n429`` == 0.

Run alone: ``python bench/_pacing_limits.py --case tokens --seconds 30 --runtime gevent``.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # loaded by pacing_bench.py, or run as a script
    sys.path.insert(0, str(HERE))

from _peers import ExampleProvider, in_runtime  # noqa: E402

__all__ = ["tokens_case", "two_limits_case"]


def two_limits_case(runtime: str, seconds: float = 90.0) -> list[dict[str, Any]]:
    """Rows ``{"case": "two_limits", "runtime", "limit", "achieved", "share", "n429",
    "target", "max_window"}`` for 50/s and 1000/min (see the module's docstring).

    Raises:
        RuntimeError: the child failed (its stderr's tail in the message).
    """
    return _child(runtime, "two_limits", seconds)


def tokens_case(runtime: str, seconds: float = 60.0) -> list[dict[str, Any]]:
    """Row ``{"case": "tokens", "runtime", "limit", "achieved", "share", "n429", "target",
    "max_window"}`` for 20000 tokens/min (see the module's docstring).

    Raises:
        RuntimeError: the child failed (its stderr's tail in the message).
    """
    return _child(runtime, "tokens", seconds)


def _child(runtime: str, case: str, seconds: float) -> list[dict[str, Any]]:
    args = ["--child", "--case", case, "--seconds", f"{seconds:g}"]
    return list(
        in_runtime(runtime, Path(__file__).resolve(), args, seconds * 3 + 180, f"{case} case ({runtime})")
    )


def _most(events: list[tuple[float, float]], window_s: float) -> float:
    """The most units ``events`` ((time, units), sorted) hold in any window of ``window_s``."""
    most, total, start = 0.0, 0.0, 0
    for t, units in events:
        total += units
        while events[start][0] <= t - window_s:
            total -= events[start][1]
            start += 1
        most = max(most, total)
    return most


def _allowed(amount: float, window_s: float, rate: float, seconds: float) -> float:
    """The most a provider counting fixed windows of ``window_s`` from the first request
    accepts in ``seconds`` from a client sending at ``rate`` at most: each window's
    ``amount``, or what the rate sends in the part of it the run covers."""
    windows = math.ceil(seconds / window_s - 1e-9)
    return sum(min(amount, rate * min(window_s, seconds - k * window_s)) for k in range(windows))


def _run(case: str, seconds: float) -> list[dict[str, Any]]:
    """The case in this process."""
    import attrs
    import httpx

    from actors import DispatchSystem, Limit, Pacing, Policy, RunInfo
    from actors.http import http_tool
    from actors.runtime import runtime_name
    from stores import SqliteReceiptStore

    answers: list[tuple[float, int, float]] = []  # (time, status, tokens used)
    sent: list[float] = []
    lock = threading.Lock()

    def on_request(request: httpx.Request) -> None:
        with lock:
            sent.append(time.monotonic())

    def on_response(response: httpx.Response) -> None:
        used = float(json.loads(response.request.content or b"{}").get("used", 0.0))
        with lock:
            answers.append((time.monotonic(), response.status_code, used))

    if case == "two_limits":
        provider = ExampleProvider("--limit", "50/s", "--limit", "1000/min", "--burst", "10")
        pacing = Pacing(limits=[Limit(50, "second"), Limit(1000, "minute")])
        rng = random.Random(29)
        inputs = [{"code": "FR", "i": i} for i in range(int(seconds / 60 + 1) * 1000 + 500)]
    else:
        provider = ExampleProvider("--limit", "20000/min:tokens")
        pacing = Pacing(limits=[Limit(20000, "minute", "tokens")])
        rng = random.Random(29)
        inputs = []
        for i in range(int(seconds / 60 + 1) * 30 + 30):
            estimate = rng.randint(100, 2000)
            used = max(1, round(estimate * rng.uniform(0.5, 1.5)))
            inputs.append({"code": "FR", "i": i, "tokens": estimate, "used": used})
    client = httpx.Client(event_hooks={"request": [on_request], "response": [on_response]})
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tool = http_tool(
                "country", f"{provider.url}/v1/country", provider="example", client=client,
                pacing=pacing, timeout_s=seconds + 120.0, credentials="bench",
            )  # fmt: skip
            if case == "tokens":
                tool = attrs.evolve(
                    tool,
                    units=lambda input: {"tokens": input["tokens"]},
                    units_used=lambda input, output: {"tokens": output["usage"]["tokens"]},
                )
            store = SqliteReceiptStore(os.path.join(tmp, "receipts.db"))
            system = DispatchSystem.start(
                tools=[tool],
                store=store,
                run=RunInfo(run_id=f"limits-{case}", org_id="bench", scope="pacing-bench"),
                policy=Policy(batch_grace_s=0.05, retry_attempts=0),
            )
            try:
                proxy = system.proxy()
                futures = [proxy.execute("country", value) for value in inputs]
                deadline = time.monotonic() + seconds + 60
                while time.monotonic() < deadline:
                    with lock:
                        if sent and time.monotonic() >= sent[0] + seconds:
                            break
                    time.sleep(0.05)
            finally:
                system.stop(timeout_s=60.0)
                store.close()
            del futures
    finally:
        client.close()
        provider.stop()
    with lock:
        t0 = sent[0]
        ok = sorted((at, used) for at, status, used in answers if status == 200 and at < t0 + seconds)
        n429 = sum(1 for at, status, _ in answers if status == 429 and at < t0 + seconds)
    runtime = runtime_name()
    windows = math.ceil(seconds / 60.0 - 1e-9)
    if case == "two_limits":
        first = [(at, 1.0) for at, _ in ok if at < t0 + 10.0]
        everything = [(at, 1.0) for at, _ in ok]
        return [
            {
                "case": "two_limits", "runtime": runtime, "limit": "50/s", "achieved": len(first) / 10.0,
                "share": len(first) / 500.0, "n429": n429, "target": 0.95,
                "max_window": _most(everything, 1.0),
            },
            {
                "case": "two_limits", "runtime": runtime, "limit": "1000/min", "achieved": float(len(ok)),
                "share": len(ok) / _allowed(1000.0, 60.0, 50.0, seconds), "n429": n429, "target": 0.95,
                "max_window": _most(everything, 60.0),
            },
        ]  # fmt: skip
    tokens = [(at, used) for at, used in ok]
    total = sum(used for _, used in tokens)
    return [
        {
            "case": "tokens", "runtime": runtime, "limit": "20000/min:tokens", "achieved": total,
            "share": total / (20000.0 * windows), "n429": n429, "target": 0.90,
            "max_window": _most(tokens, 60.0),
        }
    ]  # fmt: skip


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="two_limits", choices=("two_limits", "tokens"))
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--runtime", default="threads", choices=("threads", "gevent"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_run(args.case, args.seconds)), flush=True)
    elif args.case == "two_limits":
        print(json.dumps(two_limits_case(args.runtime, args.seconds)))
    else:
        print(json.dumps(tokens_case(args.runtime, args.seconds)))


if __name__ == "__main__":
    main()
