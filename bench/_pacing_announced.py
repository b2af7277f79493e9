"""Pacing bench case: a limit the provider announces (issue 29).

``announced_case(runtime, rate, seconds)`` runs, in a child process of that runtime
(plain threads, or gevent monkey-patching), the whole system (:class:`actors.DispatchSystem`,
an :func:`actors.http.http_tool` with no pacing stated, a SQLite receipt store) against
``examples/provider.py --rate R --burst B --announce``: a token bucket of R requests/s
holding B = 0.2 s of R (at least 10, as ``bench/pacing_bench.py`` gives nginx) whose
every answer states ``RateLimit-Policy: "requests-1s";q=R;w=1`` and the rest. More calls
than R can serve in ``seconds`` are submitted at once (``execute_many``). Every answer is timed as it
arrives (an httpx response hook); the figures run from the first request sent:

* ``achieved``: requests accepted per second over ``seconds``; ``share``: that / R;
* ``first_second_share``: requests accepted in the first second / R;
* ``n429``: answers 429 (the provider's own count agrees, or the case says so).

Target: ``share`` and ``first_second_share`` >= 0.97, ``n429`` == 0.

Run alone: ``python bench/_pacing_announced.py --rate 50 --seconds 15 --runtime gevent``.
"""

from __future__ import annotations

import json
import os
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

TARGET = 0.97

__all__ = ["announced_case"]


def announced_case(runtime: str, rate: float, seconds: float) -> dict[str, Any]:
    """One case in a child process of ``runtime`` (``"threads"`` or ``"gevent"``).

    Returns:
        ``{"case": "announced", "runtime", "limit", "achieved", "share",
        "first_second_share", "n429", "target": 0.97}`` plus ``learnt`` (the pacing
        report's) and ``provider_429`` (the provider's count).

    Raises:
        RuntimeError: the child failed (its stderr's tail in the message).
    """
    args = ["--child", "--rate", f"{rate:g}", "--seconds", f"{seconds:g}"]
    what = f"announced case ({runtime}, R={rate:g})"
    return dict(in_runtime(runtime, Path(__file__).resolve(), args, seconds * 4 + 120, what))


def _run(rate: float, seconds: float) -> dict[str, Any]:
    """The case in this process."""
    import httpx

    from actors import DispatchSystem, Policy, RunInfo
    from actors.http import http_tool
    from actors.runtime import runtime_name
    from stores import SqliteReceiptStore

    answers: list[tuple[float, int]] = []
    sent: list[float] = []
    lock = threading.Lock()

    def on_request(request: httpx.Request) -> None:
        with lock:
            sent.append(time.monotonic())

    def on_response(response: httpx.Response) -> None:
        with lock:
            answers.append((time.monotonic(), response.status_code))

    provider = ExampleProvider(
        "--rate", f"{rate:g}", "--burst", f"{max(10.0, round(0.2 * rate)):g}", "--announce"
    )
    client = httpx.Client(event_hooks={"request": [on_request], "response": [on_response]})
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tool = http_tool(
                "country",
                f"{provider.url}/v1/country",
                provider="example",
                client=client,
                timeout_s=30.0,
                credentials="bench",
            )
            store = SqliteReceiptStore(os.path.join(tmp, "receipts.db"))
            system = DispatchSystem.start(
                tools=[tool],
                store=store,
                run=RunInfo(run_id=f"announced-{rate:g}", org_id="bench", scope="pacing-bench"),
                policy=Policy(batch_grace_s=0.05),
            )
            try:
                proxy = system.proxy()
                calls = int(rate * seconds * 1.5) + 100
                futures = proxy.execute_many("country", [{"code": "FR", "i": i} for i in range(calls)])
                deadline = time.monotonic() + seconds + 30
                while time.monotonic() < deadline:
                    with lock:
                        if sent and time.monotonic() >= sent[0] + seconds:
                            break
                    time.sleep(0.05)
                report = system.ports.governor.proxy().pacing_report().get(timeout=30)
            finally:
                system.stop(timeout_s=60.0)
                store.close()
            del futures
        provider_stats = provider.stats()
    finally:
        client.close()
        provider.stop()
    with lock:
        t0 = sent[0]
        window = [(at, status) for at, status in answers if at < t0 + seconds]
    ok = sum(1 for _, status in window if status == 200)
    first = sum(1 for at, status in window if status == 200 and at < t0 + 1.0)
    n429 = sum(1 for _, status in window if status == 429)
    view = report.get("bench/example", {})
    return {
        "case": "announced",
        "runtime": runtime_name(),
        "limit": rate,
        "achieved": ok / seconds,
        "share": ok / (rate * seconds),
        "first_second_share": first / rate,
        "n429": n429,
        "target": TARGET,
        "learnt": view.get("learnt"),
        "provider_429": provider_stats.get("rate_limited", 0),
    }


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--runtime", default="threads", choices=("threads", "gevent"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_run(args.rate, args.seconds)), flush=True)
    else:
        print(json.dumps(announced_case(args.runtime, args.rate, args.seconds)))


if __name__ == "__main__":
    main()
