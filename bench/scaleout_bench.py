"""Scale-out bench (issue 11, section 4): worker processes on one Postgres, paced through Redis.

Run from the repository root (Postgres on 127.0.0.1:5432, Redis on 127.0.0.1:6379, nginx
for the pacing part: ``apt-get install nginx-light``)::

    python bench/scaleout_bench.py                     # 20,000 keys; pacing 20 s per case
    python bench/scaleout_bench.py --keys 5000 --seconds 10 --no-dbos
    python bench/scaleout_bench.py --pacing-only --seconds 30   # the pacing table alone

**Throughput.** The same random keys through a trivial tool (no provider: the store is
the work), by 1, 2 and 4 worker processes, each taking the keys whose index % N == its
number (as ``--shard I/N``), each with its own :class:`actors.DispatchSystem` on one
Postgres schema. Children start, open their store, then wait for a common "go"; calls/s
= keys / (last end - first start). *fresh*: every key new (claim, run, complete);
*rerun*: the same keys again in new processes (all cached: a keyed read). Beside them,
on the same Postgres: a raw single-statement upsert of the same keys (``INSERT ... SELECT
unnest(...) ON CONFLICT DO NOTHING``, 500 a statement, one connection: the limit here), a
raw keyed read (``WHERE key = ANY(...)``), and DBOS ``@DBOS.step`` no-ops in one workflow
on a Postgres system database, when ``dbos`` is installed.

**Pacing.** 4 worker processes sharing one Redis pacer (``open_pacer``) against nginx
``limit_req rate=R burst=B nodelay`` (``tests/_nginx.py``), R = 50/s, with the rate
stated (``Pacing(rps=R)``) and unknown (``http_tool``'s default: slow start, learnt).
More calls than R can serve in ``--seconds`` are submitted at once; the figures are what
nginx logged in those seconds: accepted/s / R, and 429s. Targets (issue 11): accepted >=
95% of R with no 429 (stated).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import click

ROOT = Path(__file__).resolve().parents[1]
try:
    import actors
except ImportError:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))
    import actors  # noqa: F401

PG = os.environ.get("TOOLDISPATCH_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
SERVER_CORES = 16
"""The server the projection is made for (issue 27: what one 16-core Postgres carries)."""
REDIS = os.environ.get("TOOLDISPATCH_BENCH_REDIS", "redis://127.0.0.1:6379/0")


def _keys(n: int) -> list[str]:
    rng = random.Random(11)
    return [f"{rng.getrandbits(64):016x}" for _ in range(n)]


def _url(schema: str) -> str:
    return f"{PG}{'&' if '?' in PG else '?'}schema={schema}"


# -- children ---------------------------------------------------------------------------


def _backend_pids() -> list[int]:
    """The Postgres backends serving this process: its TCP connections to the server,
    matched by client port in ``pg_stat_activity``."""
    import psutil
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    port = int(conninfo_to_dict(PG.split("?")[0]).get("port") or 5432)
    mine = {c.laddr.port for c in psutil.Process().net_connections("tcp") if c.raddr and c.raddr.port == port}
    with psycopg.connect(PG.split("?")[0], autocommit=True) as conn:
        rows = conn.execute("SELECT pid, client_port FROM pg_stat_activity").fetchall()
    return [pid for pid, client_port in rows if client_port in mine]


def _cpu_of(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0.0 when it is gone or not
    readable: the server is on another host)."""
    import psutil

    try:
        times = psutil.Process(pid).cpu_times()
    except (psutil.Error, OSError):
        return 0.0
    return float(times.user + times.system)


def child_throughput(shard: str, schema: str, n_keys: int) -> None:
    import psutil

    from actors import DispatchSystem, RunInfo, Tool
    from stores import open_store

    index, count = (int(x) for x in shard.split("/"))
    keys = [k for j, k in enumerate(_keys(n_keys)) if j % count == index]
    store = open_store(_url(schema))
    tool = Tool(tool_id="echo", fn=lambda input, ctx: {"k": input["k"]})
    run = RunInfo(run_id=uuid.uuid4().hex[:12], org_id="bench", scope="scaleout")
    system = DispatchSystem.start(tools=[tool], store=store, run=run)
    me = psutil.Process()
    try:
        print("ready", flush=True)
        sys.stdin.readline()
        before = {pid: _cpu_of(pid) for pid in _backend_pids()}
        cpu = sum(me.cpu_times()[:2])
        start = time.time()
        futures = system.proxy().execute_many("echo", [{"k": k} for k in keys])
        for f in futures:
            f.get(timeout=600)
        end = time.time()
        cpu = sum(me.cpu_times()[:2]) - cpu
        # a backend that opened during the run counts from zero (its start is work too)
        server = sum(_cpu_of(pid) - before.get(pid, 0.0) for pid in _backend_pids())
    finally:
        system.stop()
        store.close()
    done = {"start": start, "end": end, "n": len(keys), "cpu_s": cpu, "server_cpu_s": server}
    print(json.dumps(done), flush=True)


def run_child_pacing(
    shard: str, schema: str, mode: str, url: str, rps: float, calls: int, prefix: str
) -> None:
    from actors import DispatchSystem, Pacing, RunInfo
    from actors.http import http_tool
    from actors.pacing import open_pacer
    from stores import open_store

    index, count = (int(x) for x in shard.split("/"))
    store = open_store(_url(schema))
    pacer = open_pacer(f"{REDIS}?prefix={prefix}")
    tool = http_tool(
        "call", url, provider="nginx", pacing=Pacing(rps=rps) if mode == "stated" else None, timeout_s=30.0
    )
    run = RunInfo(run_id=uuid.uuid4().hex[:12], org_id="bench", scope=f"pacing-{mode}")
    system = DispatchSystem.start(tools=[tool], store=store, run=run, pacer=pacer)
    print("ready", flush=True)
    sys.stdin.readline()
    futures = [system.proxy().execute("call", {"i": i}) for i in range(index, calls, count)]
    print("sent", flush=True)
    for f in futures:  # the parent kills this process after its window
        with contextlib.suppress(Exception):
            f.get(timeout=600)


def run_child_dbos(n: int, db_url: str) -> None:
    from dbos import DBOS

    DBOS(config={"name": "scaleout-bench", "system_database_url": db_url, "run_admin_server": False,
                 "log_level": "WARNING"})  # type: ignore[arg-type]  # fmt: skip

    @DBOS.step()
    def noop(input: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "i": input["i"]}

    @DBOS.workflow()
    def flow(count: int) -> int:
        for i in range(count):
            noop({"i": i})
        return count

    DBOS.launch()
    try:
        t0 = time.perf_counter()
        done = flow(n)
        wall = time.perf_counter() - t0
    finally:
        DBOS.destroy()
    print(json.dumps({"n": done, "wall_s": wall}), flush=True)


# -- parent -----------------------------------------------------------------------------


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip


def _ready(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"a child did not start: {line!r}")


def _go(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()


def workers_rate(workers: int, schema: str, n_keys: int) -> tuple[float, float, float]:
    """Calls/s of ``workers`` processes, and the CPU per call in µs (user + system) of
    the workers and of the Postgres backends that served them."""
    procs = [
        _spawn("--child-throughput", f"{i}/{workers}", "--schema", schema, "--keys", str(n_keys))
        for i in range(workers)
    ]
    _ready(procs)
    _go(procs)
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=900)
        results.append(json.loads(out.strip().splitlines()[-1]))
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    n = sum(r["n"] for r in results)
    worker_us = sum(r["cpu_s"] for r in results) / n * 1e6
    server_us = sum(r["server_cpu_s"] for r in results) / n * 1e6
    return n / span, worker_us, server_us


def raw_rates(keys: list[str], schema: str) -> tuple[float, float]:
    import psycopg

    with psycopg.connect(_url(schema).split("?")[0], autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        table = f'"{schema}".raw'
        conn.execute(f"CREATE TABLE {table} (key text PRIMARY KEY, output text, status text)")
        start = time.perf_counter()
        for at in range(0, len(keys), 500):
            conn.execute(
                f"INSERT INTO {table} SELECT k, %s, 'completed' FROM unnest(%s::text[]) k ON CONFLICT (key) DO NOTHING",  # noqa: E501
                ('{"k": 1}', keys[at : at + 500]),
            )
        upsert = len(keys) / (time.perf_counter() - start)
        start = time.perf_counter()
        for at in range(0, len(keys), 500):
            conn.execute(
                f"SELECT key, output FROM {table} WHERE key = ANY(%s)", (keys[at : at + 500],)
            ).fetchall()
        read = len(keys) / (time.perf_counter() - start)
    return upsert, read


def dbos_rate(n: int) -> tuple[float | None, str]:
    import psycopg

    name = f"td_dbos_{uuid.uuid4().hex[:8]}"
    base = PG.split("?")[0].rsplit("/", 1)[0]
    try:
        p = _spawn("--child-dbos", str(n), "--schema", f"{base}/{name}")
        out, _ = p.communicate(timeout=300)
        return n / json.loads(out.strip().splitlines()[-1])["wall_s"], ""
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    finally:
        with psycopg.connect(PG.split("?")[0], autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pacing_case(mode: str, rps: float, seconds: float, burst_s: float, workers: int) -> dict[str, Any]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("_td_nginx", ROOT / "tests" / "_nginx.py")
    assert spec is not None and spec.loader is not None
    nginx = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nginx)
    schema, prefix = f"td_bench_{uuid.uuid4().hex[:10]}", f"td-bench-{uuid.uuid4().hex[:10]}"
    calls = int(rps * seconds * 1.5) + 100
    with nginx.NginxLimiter(rps, max(0, round(rps * burst_s))) as limiter:
        procs = [
            _spawn("--child-pacing", f"{i}/{workers}", "--schema", schema, "--mode", mode, "--url", limiter.url,  # noqa: E501
                   "--rps", str(rps), "--keys", str(calls), "--prefix", prefix)
            for i in range(workers)
        ]  # fmt: skip
        try:
            _ready(procs)
            limiter.reset_counts()
            _go(procs)
            time.sleep(seconds)  # the measured window (a bench: figures are nginx's own log)
            seen = limiter.statuses()
        finally:
            for p in procs:
                p.kill()
                p.wait()
        _drop(schema, prefix)
    ok, limited = seen.get(200, 0), seen.get(429, 0)
    return {"accepted_share": ok / (rps * seconds), "accepted": ok, "limited": limited}


def _drop(schema: str, prefix: str | None = None) -> None:
    import psycopg

    with psycopg.connect(PG.split("?")[0], autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    if prefix:
        import redis

        client = redis.Redis.from_url(REDIS)
        for key in client.scan_iter(match=f"{prefix}*"):
            client.delete(key)
        client.close()


@click.command()
@click.option("--keys", "n_keys", default=20_000, show_default=True)
@click.option("--workers", default="1,2,4", show_default=True)
@click.option("--seconds", default=20.0, show_default=True, help="Pacing window per case.")
@click.option("--rps", default=50.0, show_default=True)
@click.option("--burst-s", default=0.2, show_default=True, help="nginx burst, in seconds of R.")
@click.option("--dbos-steps", default=500, show_default=True)
@click.option("--no-dbos", is_flag=True)
@click.option("--no-pacing", is_flag=True)
@click.option("--pacing-only", is_flag=True, help="Only the pacing part (no Postgres throughput, no DBOS).")
@click.option("--child-throughput", default=None, hidden=True)
@click.option("--child-pacing", default=None, hidden=True)
@click.option("--child-dbos", default=None, hidden=True)
@click.option("--schema", default=None, hidden=True)
@click.option("--mode", default=None, hidden=True)
@click.option("--url", default=None, hidden=True)
@click.option("--prefix", default=None, hidden=True)
def main(
    n_keys: int, workers: str, seconds: float, rps: float, burst_s: float, dbos_steps: int, no_dbos: bool,
    no_pacing: bool, pacing_only: bool, child_throughput: str | None, child_pacing: str | None,
    child_dbos: str | None, schema: str | None, mode: str | None, url: str | None, prefix: str | None,
) -> None:  # fmt: skip
    """Scaling curve on Postgres and shared pacing through Redis; ratios in one table."""
    if child_throughput:
        return child_throughput_run(child_throughput, schema, n_keys)
    if child_pacing:
        return run_child_pacing(child_pacing, schema, mode, url, rps, n_keys, prefix)  # type: ignore[arg-type]
    if child_dbos:
        return run_child_dbos(int(child_dbos), schema)  # type: ignore[arg-type]
    if pacing_only:
        return pacing_table(rps, seconds, burst_s)
    keys = _keys(n_keys)
    rows: list[tuple[str, float | None, str]] = []
    raw_schema = f"td_bench_{uuid.uuid4().hex[:10]}"
    try:
        upsert, read = raw_rates(keys, raw_schema)
    finally:
        _drop(raw_schema)
    rows += [
        ("raw upsert, 500 keys a statement (the limit)", upsert, ""),
        ("raw keyed read, 500 a statement", read, ""),
    ]
    cpu_of: dict[int, tuple[float, float]] = {}
    for n in (int(x) for x in workers.split(",")):
        s = f"td_bench_{uuid.uuid4().hex[:10]}"
        try:
            fresh, fresh_cpu, fresh_server = workers_rate(n, s, n_keys)
            rerun, rerun_cpu, rerun_server = workers_rate(n, s, n_keys)
        finally:
            _drop(s)
        cpu_of[n] = (fresh_cpu, fresh_server)
        fresh_note = f"{fresh / upsert:.2f} of raw upsert; CPU/call: workers {fresh_cpu:.0f} µs"
        rerun_note = f"{rerun / read:.2f} of raw read; CPU/call: workers {rerun_cpu:.0f} µs"
        rows += [
            (f"{n} worker(s), fresh", fresh, f"{fresh_note}, server {fresh_server:.0f} µs"),
            (f"{n} worker(s), rerun", rerun, f"{rerun_note}, server {rerun_server:.0f} µs"),
        ]
    if not no_dbos:
        rate, why = dbos_rate(dbos_steps)
        rows.append((f"DBOS step no-op ({dbos_steps} in one workflow, Postgres)", rate, why))
    one = next((r[1] for r in rows if r[0] == "1 worker(s), fresh"), None)
    print(f"\nthroughput, {n_keys} random keys, Postgres {PG.split('@')[-1]}")
    print("| case | calls/s | ratio |\n|---|---:|---|")
    for name, rate, note in rows:
        extra = note
        if one and rate and name.startswith(("2 worker(s), fresh", "4 worker(s), fresh")):
            extra += f"; {rate / one:.2f}x one worker"
        if one and rate and name.startswith("DBOS"):
            extra += f"; one worker fresh = {one / rate:.1f}x DBOS"
        print(f"| {name} | {'n/a' if rate is None else f'{rate:,.0f}'} | {extra} |")
    if 1 in cpu_of and cpu_of[1][1] > 0:
        worker_us, server_us = cpu_of[1]
        print(
            f"\non paper: a fresh call costs the server {server_us:.0f} µs of CPU and its worker "
            f"{worker_us:.0f} µs; one Postgres of {SERVER_CORES} cores, CPU-bound, would carry "
            f"~{SERVER_CORES / server_us * 1e6:,.0f} fresh calls/s, from "
            f"~{SERVER_CORES / server_us * worker_us:.0f} worker cores (before disk: WAL flushes, "
            "one per transaction, are batched by the store)"
        )
    if no_pacing:
        return None
    return pacing_table(rps, seconds, burst_s)


def pacing_table(rps: float, seconds: float, burst_s: float) -> None:
    print(
        f"\npacing, 4 workers sharing a Redis pacer, nginx R = {rps:g}/s, burst {burst_s:g} s, {seconds:g} s window"  # noqa: E501
    )
    print("| rate | accepted/s / R | accepted | 429s |\n|---|---:|---:|---:|")
    for m in ("stated", "unknown"):
        r = pacing_case(m, rps, seconds, burst_s, 4)
        print(f"| {m} | {r['accepted_share']:.3f} | {r['accepted']} | {r['limited']} |")
    return None


def child_throughput_run(shard: str, schema: str | None, n_keys: int) -> None:
    assert schema is not None
    child_throughput(shard, schema, n_keys)


if __name__ == "__main__":
    main()
