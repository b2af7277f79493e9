"""A rerun from a play's row threads: SQLite and Postgres against diskcache's hit, one run.

    python bench/rerun_bench.py [--calls 20000] [--threads 8] [--pg postgresql://...]

Each backend: a first system completes ``--calls`` no-op calls (``execute_many``), then
a new system on the same store reruns them from ``--threads`` host threads, each calling
``execute(...).get()`` one input at a time (as ``tooldispatch run``'s rows do). Printed:
calls/s of the rerun, how many keys the callers' own plain reads asked for (what the
read-ahead into the memo did not answer), and the ratio to diskcache's ``memoize`` hit
from the same threads and from one thread (the issue-27 anchor). Postgres is skipped
when it cannot be reached; its schema is dropped after.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

import click

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    import actors  # noqa: F401
except ImportError:  # run as a script from a checkout
    sys.path.insert(0, ROOT)

from actors import DispatchSystem, RunInfo, Tool  # noqa: E402
from stores import SqliteReceiptStore  # noqa: E402


def _noop(input: Any, ctx: Any) -> dict[str, Any]:
    return {"ok": True, "i": input["i"]}


def _on_threads(call: Any, inputs: list[Any], threads: int) -> float:
    """Seconds for ``threads`` threads to call ``call(input)`` once per input."""

    def rows(k: int) -> None:
        for x in inputs[k::threads]:
            call(x)

    workers = [threading.Thread(target=rows, args=(k,)) for k in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - t0


def _rerun(make_store: Any, inputs: list[Any], threads: int) -> tuple[float, int]:
    """(calls/s of the rerun, keys the callers' plain reads asked for)."""
    tools = [Tool(tool_id="noop", fn=_noop)]
    store = make_store()
    try:
        first = DispatchSystem.start(
            tools=tools, store=store, run=RunInfo(run_id="first", org_id="o", scope="s")
        )
        for future in first.proxy().execute_many("noop", inputs):
            future.get(timeout=900)
        first.stop()
        asked = [0]
        read = store.read_reusable

        def counted(org_id: str, keys: Any, **kwargs: Any) -> Any:
            asked[0] += len(keys)
            return read(org_id, keys, **kwargs)

        store.read_reusable = counted  # type: ignore[method-assign]
        rerun = DispatchSystem.start(
            tools=tools, store=store, run=RunInfo(run_id="rerun", org_id="o", scope="s")
        )
        proxy = rerun.proxy()
        try:
            wall = _on_threads(lambda x: proxy.execute("noop", x).get(timeout=900), inputs, threads)
        finally:
            rerun.stop()
        return len(inputs) / wall, asked[0]
    finally:
        store.close()


def _diskcache(directory: str, inputs: list[Any], threads: int) -> tuple[float, float] | None:
    try:
        import diskcache
    except ImportError:
        return None
    cache = diskcache.Cache(directory)

    @cache.memoize()
    def noop(input: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "i": input["i"]}

    for x in inputs:
        noop(x)
    many = len(inputs) / _on_threads(noop, inputs, threads)
    one = len(inputs) / _on_threads(noop, inputs, 1)
    cache.close()
    return many, one


@click.command()
@click.option("--calls", default=20_000, show_default=True)
@click.option("--threads", default=8, show_default=True)
@click.option("--pg", default="postgresql://postgres@127.0.0.1:5432/test", show_default=True)
@click.option("--rounds", default=3, show_default=True, help="Runs of each; medians printed.")
def main(calls: int, threads: int, pg: str, rounds: int) -> None:
    inputs = [{"i": i} for i in range(calls)]
    work = tempfile.mkdtemp(prefix="tooldispatch-rerun-bench-")
    backends: list[tuple[str, Any]] = []
    counter = iter(range(10**6))
    backends.append(("sqlite", lambda: SqliteReceiptStore(os.path.join(work, f"r{next(counter)}.db"))))
    schemas: list[str] = []
    try:
        import psycopg

        psycopg.connect(pg, connect_timeout=3).close()
        from stores import PostgresReceiptStore

        def make_pg() -> Any:
            schemas.append(f"td_rerun_bench_{uuid.uuid4().hex[:8]}")
            return PostgresReceiptStore(pg, schema=schemas[-1])

        backends.append(("postgres", make_pg))
    except Exception as exc:
        print(f"postgres skipped: {exc}")
    results: dict[str, list[tuple[float, int]]] = {name: [] for name, _ in backends}
    anchors: list[tuple[float, float]] = []
    try:
        for r in range(rounds):
            for name, make in backends:
                results[name].append(_rerun(make, inputs, threads))
            found = _diskcache(os.path.join(work, f"dc{r}"), inputs, threads)
            if found is not None:
                anchors.append(found)
    finally:
        if schemas:
            import psycopg

            with psycopg.connect(pg, autocommit=True) as conn:
                for schema in schemas:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    print(f"{calls:,} calls rerun from {threads} threads, execute(...).get() each; medians of {rounds}")
    hit_many = statistics.median(a[0] for a in anchors) if anchors else None
    hit_one = statistics.median(a[1] for a in anchors) if anchors else None
    if hit_many is not None and hit_one is not None:
        print(f"diskcache memoize hit: {hit_many:,.0f}/s from {threads} threads, {hit_one:,.0f}/s from one")
    head = ("store", "calls/s", "plain-read keys", "vs hit, 1 thread", "vs hit, same threads")
    print(f"{head[0]:10} {head[1]:>10} {head[2]:>16} {head[3]:>17} {head[4]:>21}")
    for name, runs in results.items():
        rate = statistics.median(x[0] for x in runs)
        asked = int(statistics.median(x[1] for x in runs))
        one = f"{rate / hit_one:.2f}x" if hit_one else "n/a"
        many = f"{rate / hit_many:.2f}x" if hit_many else "n/a"
        print(f"{name:10} {rate:>10,.0f} {asked:>16,} {one:>17} {many:>21}")
    print("target (issue 27): a rerun from 8 threads >= 1x diskcache's hit")


if __name__ == "__main__":
    main()
