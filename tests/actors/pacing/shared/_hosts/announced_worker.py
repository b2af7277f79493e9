"""A worker process calling a provider that announces its limit, paced through a shared pacer.

Usage: ``announced_worker.py PACER_URL PROVIDER_URL DB_PATH I N CALLS``: a
:class:`actors.DispatchSystem` (its own SQLite file) with one ``http_tool`` stating no
pacing, posting ``{"code": "FR", "i": i}`` to ``PROVIDER_URL`` (``examples/provider.py
--announce``'s ``/v1/country``), paced through ``PACER_URL``. Prints ``{"ready": true}``,
then on ``go`` executes calls ``I, I + N, ...`` below ``CALLS`` and prints ``{"live",
"rate_limited", "other"}`` once every call ended; on ``report`` prints the provider's
pacing report (``system.stats()["pacing"]``); ``quit`` stops it.
"""

from __future__ import annotations

import json
import sys

from actors import DispatchSystem, RateLimitedError, RunInfo
from actors.http import http_tool
from actors.pacing import open_pacer
from stores import open_store


def main() -> None:
    pacer_url, provider_url, db, index, count, calls = sys.argv[1:7]
    pacer = open_pacer(pacer_url)
    store = open_store(db)
    tool = http_tool("country", provider_url, provider="example", timeout_s=30.0)
    run = RunInfo(run_id=f"announced-{index}", org_id="org", scope="shared-announced")
    system = DispatchSystem.start(tools=[tool], store=store, run=run, pacer=pacer)
    try:
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "go":
                futures = [
                    system.proxy().execute("country", {"code": "FR", "i": i})
                    for i in range(int(index), int(calls), int(count))
                ]
                ends = {"live": 0, "rate_limited": 0, "other": 0}
                for future in futures:
                    try:
                        future.get(timeout=120.0)
                        ends["live"] += 1
                    except RateLimitedError:
                        ends["rate_limited"] += 1
                    except Exception:
                        ends["other"] += 1
                print(json.dumps(ends), flush=True)
            elif cmd == "report":
                print(json.dumps(system.stats()["pacing"]["org/example"]), flush=True)
            else:
                break
    finally:
        system.stop()
        store.close()
        pacer.close()


if __name__ == "__main__":
    main()
