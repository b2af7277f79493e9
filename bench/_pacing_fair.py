"""The fairness case of the pacing bench: a small run beside a huge one on one provider.

The example provider (``examples/provider.py``, a subprocess) limits one account to
R = 50 requests/s (burst 5). A big run of 100,000 calls saturates it; after a few
seconds a small run of 100 calls starts beside it. Both state ``Pacing(rps=R)`` and pace
through one pacer, each run its own fairness key (its run id, weight 1), so while both
want more each gets half the rate: the small run should finish in 100 / (R / 2) = 4 s,
at most 5 s, with the sum of both within R and no 429.

* ``process``: both runs are :class:`actors.DispatchSystem` s in one process sharing one
  :class:`actors.pacing.LocalPacer`;
* ``redis``: each run is its own worker process pacing through one Redis
  (``TOOLDISPATCH_BENCH_REDIS``, default ``redis://127.0.0.1:6379/0``; a unique key prefix,
  deleted after).

Each run goes in a child process of its runtime (plain threads, or under gevent
monkey-patching). Run from the repository root::

    python bench/_pacing_fair.py --runtime threads --mode process --seconds 15

:func:`fairness_case` returns the bench table's row.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # loaded by pacing_bench.py, or run as a script
    sys.path.insert(0, str(HERE))

from _peers import ExampleProvider, provider_stats, runtime_command  # noqa: E402

RATE = 50.0
"""R, requests/s (the provider's limit and the runs' stated rate)."""
BURST = 5
"""The provider's bucket (0.1 s of R)."""
BIG_CALLS = 100_000
SMALL_CALLS = 100
TARGET_S = 5.0
"""The small run's goal: its half share takes 4 s."""
OUTSTANDING = 2_000
"""Calls of the big run submitted and not yet answered (the rest wait to be submitted)."""
REDIS_URL = os.environ.get("TOOLDISPATCH_BENCH_REDIS", "redis://127.0.0.1:6379/0")


def fairness_case(runtime: str, mode: str, seconds: float) -> dict[str, Any]:
    """Run the case (``mode``: ``"process"`` or ``"redis"``) on ``runtime`` (``"threads"`` or
    ``"gevent"``) for at most ``seconds`` of the big run; the small run starts after
    ``min(3, seconds / 4)`` seconds.

    Returns:
        ``{"case": "fairness", "mode", "runtime", "small_run_s", "target_s", "total_rps"
        (requests the provider accepted per second while the small run ran, both runs),
        "limit", "n429" (429s the provider answered, the whole case), "big_rps" (the big
        run's accepted rate meanwhile)}``; ``small_run_s`` is None when the small run did
        not finish within ``seconds``.

    Raises:
        ValueError: an unknown mode or runtime.
        RuntimeError: the provider or a worker failed.
    """
    if mode not in ("process", "redis") or runtime not in ("threads", "gevent"):
        raise ValueError(f"mode process|redis and runtime threads|gevent, got {mode!r}, {runtime!r}")
    provider = ExampleProvider("--rate", str(RATE), "--burst", str(BURST))
    prefix = f"tdbench-fair:{uuid.uuid4().hex[:10]}"
    delay = min(3.0, seconds / 4)
    try:
        if mode == "process":
            got = _child(runtime, ["both", provider.url, "local", str(seconds), str(delay)]).result()
        else:
            pacer = f"{REDIS_URL}?prefix={prefix}"
            big = _child(runtime, ["big", provider.url, pacer, str(seconds), "0"])
            big.wait_for("saturated")
            time.sleep(max(0.0, delay - big.age()))
            small = _child(runtime, ["small", provider.url, pacer, str(seconds), "0"])
            got = small.result()
            big.result()
        stats = provider.stats()
    finally:
        provider.stop()
        if mode == "redis":
            _delete_prefix(prefix)
    return {
        "case": "fairness",
        "mode": mode,
        "runtime": runtime,
        "small_run_s": got["small_run_s"],
        "target_s": TARGET_S,
        "total_rps": got["total_rps"],
        "limit": RATE,
        "n429": stats.get("rate_limited", 0),
        "big_rps": round(got["total_rps"] - got["small_rps"], 1),
    }


# --- the parent's helpers ----------------------------------------------------------------


class _Child:
    """A worker child process; its JSON lines are read as they come."""

    def __init__(self, runtime: str, args: list[str]) -> None:
        cmd, env = runtime_command(runtime, Path(__file__).resolve(), "--child", *args)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env
        )
        self.lines: collections.deque[dict[str, Any]] = collections.deque()
        self._new = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                with self._new:
                    self.lines.append(json.loads(line))
                    self._new.notify_all()
        with self._new:
            self.lines.append({"exit": self.proc.wait()})
            self._new.notify_all()

    def age(self) -> float:
        return time.monotonic() - self.started

    def wait_for(self, key: str, timeout_s: float = 600.0) -> dict[str, Any]:
        with self._new:
            while True:
                for line in self.lines:
                    if key in line:
                        return line
                    if "exit" in line:
                        raise RuntimeError(f"worker {self.proc.args} exited with {line['exit']}")
                if not self._new.wait(timeout_s):
                    raise RuntimeError(f"worker {self.proc.args} said no {key!r} in {timeout_s} s")

    def result(self) -> dict[str, Any]:
        got = self.wait_for("result")["result"]
        self.proc.wait(60)
        return dict(got)


def _child(runtime: str, args: list[str]) -> _Child:
    return _Child(runtime, args)


def _delete_prefix(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(f"{prefix}:*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


# --- the worker child ---------------------------------------------------------------------


def _worker(role: str, provider_url: str, pacer_url: str, seconds: float, delay: float) -> None:
    """Run the big run, the small one, or both (one pacer between them); print JSON lines."""
    sys.path.insert(0, str(ROOT))
    from actors import DispatchSystem, Pacing, Policy, RunInfo
    from actors.http import http_tool
    from actors.pacing import LocalPacer, open_pacer
    from stores import SqliteReceiptStore

    pacer = LocalPacer() if pacer_url == "local" else open_pacer(pacer_url)
    tool = http_tool(
        "lookup",
        f"{provider_url}/v1/domain",
        provider="fair-provider",
        pacing=Pacing(rps=RATE),
        timeout_s=60.0,
    )
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        systems: dict[str, Any] = {}
        stores = []
        for name in ("big", "small") if role == "both" else (role,):
            store = SqliteReceiptStore(os.path.join(tmp, f"{name}.db"))
            stores.append(store)
            run = RunInfo(run_id=f"{name}-{uuid.uuid4().hex[:6]}", org_id="bench", scope=f"fair-{name}")
            systems[name] = DispatchSystem.start(
                tools=[tool], store=store, run=run, pacer=pacer, policy=Policy(batch_grace_s=0.05)
            )
        stop = threading.Event()
        feeder = None
        try:
            if "big" in systems:
                feeder = threading.Thread(target=_feed_big, args=(systems["big"], stop), daemon=True)
                feeder.start()
                _wait_saturated(provider_url)
                print(json.dumps({"saturated": time.monotonic() - began}), flush=True)
            result: dict[str, Any] = {}
            if "small" in systems:
                time.sleep(max(0.0, began + delay - time.monotonic()))
                result = _small_run(systems["small"], provider_url, began + seconds)
            else:
                time.sleep(max(0.0, began + seconds - time.monotonic()))
            print(json.dumps({"result": result}), flush=True)
        finally:
            stop.set()
            for system in systems.values():
                system.stop(timeout_s=30.0)
            if feeder is not None:
                feeder.join(30.0)
            for store in stores:
                store.close()
            pacer.close()


def _feed_big(system: Any, stop: threading.Event) -> None:
    """Submit the big run's calls, OUTSTANDING at a time, until ``stop``."""
    proxy = system.proxy()
    out: collections.deque[Any] = collections.deque()
    submitted = 0
    while not stop.is_set() and (submitted < BIG_CALLS or out):
        while len(out) < OUTSTANDING and submitted < BIG_CALLS:
            out.append(proxy.execute("lookup", {"domain": f"big{submitted}.fr"}))
            submitted += 1
        with contextlib.suppress(Exception):  # a call stopped or refused: the provider's view counts
            out.popleft().get(timeout=60.0)


def _wait_saturated(provider_url: str) -> None:
    """Until the provider has accepted a second's worth of the big run's requests."""
    while provider_stats(provider_url).get("requests", 0) < RATE:
        time.sleep(0.05)


def _small_run(system: Any, provider_url: str, deadline: float) -> dict[str, Any]:
    """The small run's calls at once; how long until all were answered, and the rates the
    provider accepted meanwhile."""
    proxy = system.proxy()
    before = provider_stats(provider_url).get("requests", 0)
    start = time.monotonic()
    futures = [proxy.execute("lookup", {"domain": f"small{i}.de"}) for i in range(SMALL_CALLS)]
    done = 0
    for future in futures:
        try:
            future.get(timeout=max(0.1, deadline - time.monotonic()))
            done += 1
        except Exception:
            break
    elapsed = time.monotonic() - start
    accepted = provider_stats(provider_url).get("requests", 0) - before
    return {
        "small_run_s": round(elapsed, 2) if done == SMALL_CALLS else None,
        "total_rps": round(accepted / elapsed, 1),
        "small_rps": round(done / elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default="threads", choices=["threads", "gevent"])
    parser.add_argument("--mode", default="process", choices=["process", "redis"])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--child", nargs=5, metavar=("ROLE", "PROVIDER", "PACER", "SECONDS", "DELAY"))
    args = parser.parse_args()
    if args.child:
        role, provider, pacer, seconds, delay = args.child
        _worker(role, provider, pacer, float(seconds), float(delay))
        return
    print(json.dumps(fairness_case(args.runtime, args.mode, args.seconds)))


if __name__ == "__main__":
    main()
