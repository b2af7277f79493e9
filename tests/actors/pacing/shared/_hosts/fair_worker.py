"""Runs sharing one provider's rate through one pacer, for the fair share tests.

Usage: ``fair_worker.py PROVIDER_URL PACER_URL ROLE``. ``PACER_URL`` is ``local`` (one
:class:`~actors.pacing.LocalPacer` shared by this process's systems) or a Redis pacer
URL. ROLE ``big``: the big run, two :class:`actors.DispatchSystem` s (two plays of one
customer) under the fairness key ``big``; ``small``: the small run, one system, fairness
weight 2; ``both``: all three. One ``http_tool`` against ``PROVIDER_URL``'s
``/v1/domain``, ``Pacing(rps=RATE)``. Prints ``{"ready": true}``; then, line by line on
stdin: ``big`` keeps the big run's systems busy (more calls than the rate serves) and
answers ``{"feeding": true}``; ``small`` runs the small run's calls at once and answers
``{"done", "failed", "elapsed_s"}`` when all ended; ``quit`` stops.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from actors import DispatchSystem, Pacing, Policy, RunInfo
from actors.http import http_tool
from actors.pacing import LocalPacer, open_pacer
from stores import SqliteReceiptStore

RATE = 50.0
SMALL_CALLS = 100
OUTSTANDING = 300
"""Calls of each big system submitted and not yet answered."""


def _feed(system: Any, name: str, stop: threading.Event) -> None:
    proxy = system.proxy()
    out: collections.deque[Any] = collections.deque()
    i = 0
    while not stop.is_set():
        while len(out) < OUTSTANDING:
            out.append(proxy.execute("lookup", {"domain": f"{name}-{i}.fr"}))
            i += 1
        with contextlib.suppress(Exception):  # stopped: the provider's counts are the measure
            out.popleft().get(timeout=60.0)


def _lines() -> Iterator[str]:
    """stdin's lines, waited for with ``select`` (patched by gevent: the feeders run meanwhile)."""
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], 0.2)
        if ready:
            line = sys.stdin.readline()
            if not line:
                return
            yield line


def main() -> None:
    provider_url, pacer_url, role = sys.argv[1:4]
    pacer = LocalPacer() if pacer_url == "local" else open_pacer(pacer_url)
    tool = http_tool(
        "lookup", f"{provider_url}/v1/domain", provider="fair", pacing=Pacing(rps=RATE), timeout_s=60.0
    )
    runs = {
        "big-a": RunInfo(run_id="big-a", org_id="org", scope="fair-a", fairness_key="big"),
        "big-b": RunInfo(run_id="big-b", org_id="org", scope="fair-b", fairness_key="big"),
        "small": RunInfo(run_id="small", org_id="org", scope="fair-small", fairness_weight=2.0),
    }
    names = [n for n in runs if role == "both" or n.startswith(role)]
    stop = threading.Event()
    with tempfile.TemporaryDirectory() as tmp:
        stores = {n: SqliteReceiptStore(os.path.join(tmp, f"{n}.db")) for n in names}
        systems = {
            n: DispatchSystem.start(
                tools=[tool], store=stores[n], run=runs[n], pacer=pacer, policy=Policy(batch_grace_s=0.02)
            )
            for n in names
        }
        try:
            print(json.dumps({"ready": True}), flush=True)
            for line in _lines():
                cmd = line.strip()
                if cmd == "big":
                    for n in names:
                        if n.startswith("big"):
                            threading.Thread(target=_feed, args=(systems[n], n, stop), daemon=True).start()
                    print(json.dumps({"feeding": True}), flush=True)
                elif cmd == "small":
                    proxy = systems["small"].proxy()
                    began = time.monotonic()
                    futures = [
                        proxy.execute("lookup", {"domain": f"small-{i}.de"}) for i in range(SMALL_CALLS)
                    ]
                    failed = 0
                    for future in futures:
                        try:
                            future.get(timeout=120.0)
                        except Exception:
                            failed += 1
                    elapsed = time.monotonic() - began
                    print(
                        json.dumps({"done": SMALL_CALLS - failed, "failed": failed, "elapsed_s": elapsed}),
                        flush=True,
                    )
                else:
                    break
        finally:
            stop.set()
            for system in systems.values():
                system.stop(timeout_s=30.0)
            for store in stores.values():
                store.close()
            pacer.close()


if __name__ == "__main__":
    main()
