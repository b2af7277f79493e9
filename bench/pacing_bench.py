"""Pacing bench: the whole system against a real rate limiter (nginx ``limit_req``).

Run from the repository root (nginx must be installed: ``apt-get install nginx-light``)::

    python bench/pacing_bench.py                       # 30 s per case, R = 20, 50, 200
    python bench/pacing_bench.py --seconds 120         # the long runs
    python bench/pacing_bench.py --rates 50 --runtimes threads

For each runtime (plain threads, and gevent monkey-patching, one child process each) and
each limit R, the bench starts its own nginx (``tests/_nginx.py``: ``limit_req rate=R
burst=B nodelay``, 429 with ``Retry-After: 1``, B = ``--burst-s`` seconds of R) and runs
two cases through the public API (:class:`actors.DispatchSystem`, a tool from
:func:`actors.http.http_tool`, a SQLite receipt store in a temporary directory):

* **stated**: the tool says ``Pacing(rps=R)``;
* **unknown**: the ``http_tool`` default (slow start from 20/s, then learnt).

More calls than the limit can serve in ``--seconds`` are submitted at once; the figures
are what nginx itself logged during those seconds, from the first submission: accepted
responses per second / R, and the share of requests answered 429. The governor's own
view (``GovernorActor.pacing_report``: how the rate was learnt, the limit estimate) is
printed under the table. Targets (issue 10): stated >= 96% of R with no 429; unknown
>= 85% of R with <= 2% 429s, over 30 s and over 120 s.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

ROOT = Path(__file__).resolve().parents[1]
try:
    import actors
except ImportError:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))
    import actors  # noqa: F401

from actors import DispatchSystem, Pacing, Policy, RunInfo  # noqa: E402
from actors.http import http_tool  # noqa: E402
from actors.runtime import runtime_name  # noqa: E402
from stores import SqliteReceiptStore  # noqa: E402

STATED_TARGET, UNKNOWN_TARGET, UNKNOWN_429_MAX = 0.96, 0.85, 0.02
"""Issue 10 calls the 96-97% a stated R = 200 reached on threads "reached" (its defect was
gevent's 83-87%); the unknown targets are its own."""
TRACE = bool(os.environ.get("PACING_BENCH_TRACE"))
TRACE_S = float(os.environ.get("PACING_BENCH_TRACE_S", "1.0"))
"""Print the governor's view every second to stderr (for tuning)."""


def _nginx_module() -> Any:
    spec = importlib.util.spec_from_file_location("_tooldispatch_nginx", ROOT / "tests" / "_nginx.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_case(rps: float, mode: str, seconds: float, burst_s: float) -> dict[str, Any]:
    """One case in this process; returns what nginx logged and the governor's view."""
    nginx = _nginx_module()
    burst = max(0, round(rps * burst_s))
    pacing = Pacing(rps=rps) if mode == "stated" else None
    with nginx.NginxLimiter(rps, burst) as limiter, tempfile.TemporaryDirectory() as tmp:
        tool = http_tool("call", limiter.url, provider="nginx", pacing=pacing, timeout_s=30.0)
        store = SqliteReceiptStore(os.path.join(tmp, "receipts.db"))
        system = DispatchSystem.start(
            tools=[tool],
            store=store,
            run=RunInfo(run_id=f"{mode}-{rps}", org_id="bench", scope="pacing-bench"),
            policy=Policy(batch_grace_s=0.05),
        )
        try:
            proxy = system.proxy()
            calls = int(rps * seconds * 1.5) + 100
            limiter.reset_counts()
            start = time.monotonic()
            futures = [proxy.execute("call", {"i": i}) for i in range(calls)]
            submitted_s = time.monotonic() - start
            while time.monotonic() < start + seconds:  # the measured window
                time.sleep(max(0.0, min(TRACE_S, start + seconds - time.monotonic())))
                if TRACE:
                    now_seen = limiter.statuses()
                    traced = system.ports.governor.proxy().pacing_report().get(timeout=30)
                    view = traced.get("bench/nginx", {})
                    print(
                        f"# {time.monotonic() - start:5.1f}s 200={now_seen.get(200, 0)} "
                        f"429={now_seen.get(429, 0)} {view.get('learnt')} rate={view.get('rate_rps')} "
                        f"limit={view.get('limit_rps')}",
                        file=sys.stderr,
                        flush=True,
                    )
            seen = limiter.statuses()
            report = system.ports.governor.proxy().pacing_report().get(timeout=30)
        finally:
            system.stop(timeout_s=60.0)
            store.close()
        del futures
    ok, limited = seen.get(200, 0), seen.get(429, 0)
    view = report.get("bench/nginx", {})
    return {
        "rps": rps,
        "mode": mode,
        "seconds": seconds,
        "burst": burst,
        "accepted_share": ok / (rps * seconds),
        "limited_share": limited / max(1, ok + limited),
        "accepted": ok,
        "limited": limited,
        "other": {k: v for k, v in seen.items() if k not in (200, 429)},
        "submit_s": submitted_s,
        "learnt": view.get("learnt"),
        "limit_rps": view.get("limit_rps"),
        "rate_rps": view.get("rate_rps"),
        "cuts": view.get("cuts"),
    }


def _child(rates: list[float], seconds: float, burst_s: float, modes: list[str]) -> None:
    for rps in rates:
        for mode in modes:
            result = run_case(rps, mode, seconds, burst_s)
            result["runtime"] = runtime_name()
            print(json.dumps(result), flush=True)


def _spawn(
    runtime: str, rates: list[float], seconds: float, burst_s: float, modes: list[str]
) -> list[dict[str, Any]]:
    cmd = [sys.executable]
    if runtime == "gevent":
        cmd += ["-m", "gevent.monkey"]
    cmd += [str(Path(__file__).resolve()), "--child", "--seconds", str(seconds), "--burst-s", str(burst_s)]
    cmd += ["--rates", ",".join(f"{r:g}" for r in rates), "--modes", ",".join(modes)]
    env = {**os.environ, "TOOLDISPATCH_RUNTIME": runtime}
    out = subprocess.run(
        cmd, env=env, stdout=subprocess.PIPE, stderr=None if TRACE else subprocess.PIPE, text=True
    )
    if out.returncode != 0 and out.stderr:
        print(out.stderr[-3000:], file=sys.stderr)
    results = []
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            results.append(json.loads(line))
            print(
                f"  {runtime}: {_cell(results[-1])} ({results[-1]['mode']} R={results[-1]['rps']:g})",
                flush=True,
            )
    return results


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    return f"{r['accepted_share'] * 100:5.1f}% of R, 429 {r['limited_share'] * 100:4.2f}% ({r['limited']})"


def _verdict(r: dict[str, Any]) -> str:
    if r["mode"] == "stated":
        return "met" if r["accepted_share"] >= STATED_TARGET and r["limited"] == 0 else "missed"
    ok = r["accepted_share"] >= UNKNOWN_TARGET and r["limited_share"] <= UNKNOWN_429_MAX
    return "met" if ok else "missed"


@click.command()
@click.option("--seconds", default=30.0, show_default=True, help="Measured window of each case.")
@click.option("--rates", default="20,50,200", show_default=True, help="Limits R to run, requests/s.")
@click.option("--burst-s", default=0.2, show_default=True, help="nginx burst, in seconds of R.")
@click.option("--runtimes", default="threads,gevent", show_default=True)
@click.option("--modes", default="stated,unknown", show_default=True, help="Which pacing cases to run.")
@click.option("--child", is_flag=True, hidden=True)
def main(seconds: float, rates: str, burst_s: float, runtimes: str, modes: str, child: bool) -> None:
    """Accepted rate / R and 429 share against nginx, stated and unknown R, both runtimes."""
    rate_list = [float(r) for r in rates.split(",") if r]
    mode_list = [m for m in modes.split(",") if m]
    if child:
        _child(rate_list, seconds, burst_s, mode_list)
        return
    if _nginx_module().find_nginx() is None:
        raise SystemExit(_nginx_module().NGINX_HOWTO)
    names = [r for r in runtimes.split(",") if r]
    print(f"pacing bench: {seconds:g} s per case, nginx burst {burst_s:g} s of R, load {os.getloadavg()}")
    results = {name: _spawn(name, rate_list, seconds, burst_s, mode_list) for name in names}
    index = {(r["runtime"], r["mode"], r["rps"]): r for rs in results.values() for r in rs}
    print()
    print("| R, pacing | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for rps in rate_list:
        for mode in mode_list:
            cells = []
            for name in names:
                r = index.get((name, mode, rps))
                cells.append("-" if r is None else f"{_cell(r)} **{_verdict(r)}**")
            print(f"| {rps:g}/s {mode} | " + " | ".join(cells) + " |")
    print()
    print("governor's view at the end of each case (how learnt, limit estimate, rate, cuts):")
    for (name, mode, rps), r in sorted(index.items()):
        limit = "-" if r["limit_rps"] is None else f"{r['limit_rps']:.1f}"
        rate = "-" if r["rate_rps"] is None else f"{r['rate_rps']:.1f}"
        print(
            f"  {name:7} {mode:7} R={rps:g}: {r['learnt']}, limit {limit}/s, rate {rate}/s, "
            f"{r['cuts']} cuts, burst {r['burst']}, other statuses {r['other']}"
        )


if __name__ == "__main__":
    main()
