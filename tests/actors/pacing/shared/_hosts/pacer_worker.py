"""A worker process of the shared pacer tests: one RedisPacer, driven over stdin.

Usage: ``pacer_worker.py URL RATE BURST``. Prints ``{"ready": true}`` once connected,
then answers each command line with one JSON line:

* ``take``: one take of (org, prov): ``{"granted", "verdict", "wait_s"}``;
* ``pause S``: pauses (org, prov) for S seconds: ``{"pause_s"}``;
* ``run S``: takes as fast as the pacer lets it for S seconds of its own clock:
  ``{"grants", "degraded"}``;
* ``quit``.
"""

from __future__ import annotations

import json
import sys
import time

from actors.pacing import ProviderLimits, open_pacer


def main() -> None:
    url, rate, burst = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    pacer = open_pacer(url, {"prov": ProviderLimits(rate_rps=rate, burst=burst)})
    pacer.state("org", "prov")  # connect and load the script before the start line
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "take":
            g = pacer.take("org", "prov")
            out = {"granted": g.granted, "verdict": g.verdict, "wait_s": g.wait_s}
        elif cmd == "pause":
            out = {"pause_s": pacer.pause("org", "prov", float(args[0])).pause_s}
        elif cmd == "run":
            grants, degraded, end = 0, False, time.monotonic() + float(args[0])
            while time.monotonic() < end:
                g = pacer.take("org", "prov")
                grants += g.granted
                degraded = degraded or g.degraded
                if not g.granted:
                    time.sleep(min(g.wait_s, 0.01, max(0.0, end - time.monotonic())))
            out = {"grants": grants, "degraded": degraded}
        else:
            break
        print(json.dumps(out), flush=True)
    pacer.close()


if __name__ == "__main__":
    main()
