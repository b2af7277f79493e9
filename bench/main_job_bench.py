"""Benchmark of the main job: `tooldispatch run` over the 10,000 OpenDNS domains.

    python bench/main_job_bench.py [--rows 10000] [--rate 100] [--pacing-rows 3000] [--runtime threads]

Prints, in one run:
* rows/s of a fresh run and of a rerun (same command, same receipt store), by the
  process's wall time (start-up included) and by the run's own (its report's: the
  issue 27 target, a rerun >= 20,000 rows/s), and the provider's requests against the
  unique calls (batched);
* pacing against the provider limited at R requests/s (one request per call): the
  achieved rate and the share of 429s when the play states R (target >= 97% of R, zero
  429s) and when it does not (AIMD finds it; target >= 85% of R, <= 2% 429s).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import click

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DOMAINS = os.path.join(ROOT, "..", "shared", "data", "opendns-top-domains.txt")


class Provider:
    """examples/provider.py in a subprocess on 127.0.0.1."""

    def __init__(self, rate: float, burst: float) -> None:
        cmd = [sys.executable, os.path.join(ROOT, "examples", "provider.py"), "--port", "0",
               "--rate", str(rate), "--burst", str(burst)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip().rsplit(" ", 1)[-1]

    def stats(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/stats") as response:
            return json.load(response)

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/reset", method="POST")).read()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def run_cli(
    provider: Provider, rows_file: str, db: str, env: dict[str, str], runtime: str
) -> tuple[float, int, float | None]:
    """The command's wall time (s, the process's: start-up included), its exit code, and
    the wall time its report gives (s, the rows' own: from the first row to the last)."""
    cmd = [sys.executable, "-m", "actors.job.cli", "run", os.path.join(ROOT, "examples", "domains_play.py"),
           "--input", rows_file, "--db", db, "--runtime", runtime]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(cmd, env={**os.environ, "TOOLDISPATCH_PROVIDER_URL": provider.url, **env},
                          capture_output=True, text=True)  # fmt: skip
    wall = time.perf_counter() - start
    own = re.search(r"wall time\W+([0-9.]+) s", done.stderr)
    return wall, done.returncode, float(own.group(1)) if own else None


@click.command()
@click.option("--rows", default=10_000, show_default=True, help="Domains for the fresh/rerun figures.")
@click.option("--rate", default=100.0, show_default=True, help="Provider limit R, requests/s.")
@click.option("--pacing-rows", default=3000, show_default=True, help="Domains for each pacing run.")
@click.option("--runtime", type=click.Choice(["threads", "gevent"]), default="threads", show_default=True)
def main(rows: int, rate: float, pacing_rows: int, runtime: str) -> None:
    with open(DOMAINS, encoding="utf-8") as fh:
        domains = [line.strip() for line in fh if line.strip()]
    work = tempfile.mkdtemp(prefix="tooldispatch-bench-")
    main_rows = os.path.join(work, "domains.txt")
    with open(main_rows, "w") as fh:
        fh.write("\n".join(domains[:rows]) + "\n")
    tlds = {d.rsplit(".", 1)[-1] for d in domains[:rows]}
    print(
        f"python {sys.version.split()[0]}; runtime {runtime}; rows {rows}; "
        f"provider limit R = {rate:g} requests/s"
    )

    provider = Provider(rate=0, burst=10)
    try:
        fresh_s, code1, fresh_own = run_cli(provider, main_rows, os.path.join(work, "main.db"), {}, runtime)
        fresh = provider.stats()
        provider.reset()
        rerun_s, code2, rerun_own = run_cli(provider, main_rows, os.path.join(work, "main.db"), {}, runtime)
        rerun = provider.stats()
    finally:
        provider.close()
    print("\n| run | wall s | rows/s | own rows/s | provider requests | lookups served | exit |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    runs = (("fresh", fresh_s, fresh_own, fresh, code1), ("rerun", rerun_s, rerun_own, rerun, code2))
    for label, wall_s, own_s, stats, code in runs:
        requests, items = stats.get("requests", 0), stats.get("items", 0)
        own_rate = f"{rows / own_s:,.0f}" if own_s else "n/a"
        print(
            f"| {label} | {wall_s:.1f} | {rows / wall_s:,.0f} | {own_rate} | {requests} | {items} | {code} |"
        )
    print(f"unique calls: {rows} domains + at most {len(tlds)} ccTLD countries; "
          f"requests per unique call: {fresh.get('requests', 0) / rows:.4f}")  # fmt: skip

    pacing_file = os.path.join(work, "pacing.txt")
    with open(pacing_file, "w") as fh:
        fh.write("\n".join(domains[rows - pacing_rows if rows >= pacing_rows else 0 :][:pacing_rows]) + "\n")
    print(f"\npacing: {pacing_rows} domains, one request per call, provider limit {rate:g}/s (burst 5)")
    print("| play knows R | achieved req/s | % of R | 429s | % 429s | target | verdict |")
    print("| --- | ---: | ---: | ---: | ---: | --- | --- |")
    for label, known, target_rate, target_429 in (("yes", True, 0.97, 0.0), ("no (AIMD)", False, 0.85, 0.02)):
        provider = Provider(rate=rate, burst=5)
        try:
            env = {"TOOLDISPATCH_BATCH": "0", "TOOLDISPATCH_PROVIDER_RPS": str(rate) if known else "0"}
            run_cli(provider, pacing_file, os.path.join(work, f"pacing-{known}.db"), env, runtime)
            stats = provider.stats()
        finally:
            provider.close()
        served = stats.get("requests", 0)
        limited = stats.get("rate_limited", 0)
        span = max(1e-9, stats.get("last_at", 0) - stats.get("first_at", 0))
        achieved = (served - 1) / span if served > 1 else 0.0
        share = limited / max(1, served + limited)
        ok = achieved >= target_rate * rate and share <= target_429
        target = f">= {100 * target_rate:.0f}% of R, <= {100 * target_429:.0f}% 429s"
        verdict = "met" if ok else "MISSED"
        print(
            f"| {label} | {achieved:.1f} | {100 * achieved / rate:.1f}% | {limited} | {100 * share:.2f}% "
            f"| {target} | {verdict} |"
        )


if __name__ == "__main__":
    main()
