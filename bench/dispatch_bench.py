"""Dispatch benchmark: the whole actor system against diskcache and DBOS anchors.

Run from the repository root::

    python bench/dispatch_bench.py [--calls 20000]       # --calls 100000 for the issue's figure
    python -m gevent.monkey bench/dispatch_bench.py      # the same under gevent
    python bench/dispatch_bench.py --profile 20000 --profile-only   # where the CPU goes

The default ``--calls`` is 20,000 so that a whole run (both anchors included) stays near
three minutes on the 2-core machine; 100,000 calls take about five times as long per
section.

Sections (issue 3, "Benchmark"):

1. **fresh / rerun**: ``--calls`` distinct calls of a no-op tool (returns a small dict)
   through :class:`actors.DispatchSystem` on a new SQLite file, then the same calls on
   the same file through a new system (every call ``cached``). Timed from the first
   ``execute`` to the last result in hand (results are set only after their receipt is
   persisted); building the inputs is not timed, ``stop`` is timed apart.
2. **anchors**: diskcache ``Cache(dir).memoize()`` on a no-op function, ``--calls``
   distinct misses then the same calls again (hits); DBOS ``@DBOS.step`` no-ops inside
   one workflow on a SQLite system database (``--dbos-calls``; DBOS is slow here, so
   compare per-call figures), once with DBOS's own SQLite settings (rollback journal,
   synchronous=FULL: fsync per commit) and once with the settings the receipt store and
   diskcache use (WAL, synchronous=NORMAL). DBOS runs in a child process of the same
   runtime (its background threads would otherwise share this process).
3. a side-by-side table with ratios, and the issue's targets marked met or missed.
4. **burst**: N calls over U unique keys to a batchable tool with max batch M must make
   exactly ceil(U/M) provider calls (PASS/FAIL; the issue's 7/3/3 case and a larger one).
5. **latency**: one non-batchable call at a time on an idle system, repeated; p50/p95
   added over calling the function directly (target p50 <= 1 ms).

``--profile N`` adds a profiled fresh pass of N calls (yappi, CPU time of every thread, or
of every greenlet under gevent, where the SQLite work on the hub's threadpool is not
seen) and prints the CPU per component and the top functions by cumulative share. The
profiler slows the run several times over; read its shares, not its rates. See
``bench/README.md``.
"""

from __future__ import annotations

import collections
import json
import math
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
from typing import Any

import attrs
import click

try:
    import actors
except ImportError:  # run as a script from a checkout: put the repository root on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import actors  # noqa: F401

from actors import BatchStrategy, DispatchSystem, Policy, RunInfo, Tool
from actors._runtime import runtime_name
from stores import SqliteReceiptStore

ORG_ID = "org-bench"
SCOPE = "dispatch-bench"
FRESH_TARGET = 30_000.0
"""Issue 3: fresh calls per second."""
FRESH_VS_DISKCACHE = 2.0
"""Issue 3: fresh at least this many times diskcache's miss path."""
RERUN_TARGET = 100_000.0
"""Issue 3: rerun (all cached) calls per second."""
LATENCY_TARGET_MS = 1.0
"""Issue 3: added p50 latency of one non-batchable call on an idle system."""


def _noop(input: Any, ctx: Any) -> dict[str, Any]:
    return {"ok": True, "i": input["i"]}


@attrs.define
class Timing:
    """One measured figure: ``n`` calls in ``wall_s`` (and ``cpu_s`` of this process)."""

    name: str
    n: int
    wall_s: float
    cpu_s: float = 0.0
    note: str = ""

    @property
    def rate(self) -> float:
        return self.n / self.wall_s if self.wall_s > 0 else math.inf

    @property
    def us(self) -> float:
        return self.wall_s / self.n * 1e6 if self.n else math.nan


# -- 1. tooldispatch fresh and rerun ----------------------------------------------------


def bench_dispatch(path: str, n: int, run_id: str, name: str, expect: str) -> tuple[Timing, list[str]]:
    """Submit ``n`` distinct no-op calls, wait for all; returns the timing and diagnostics."""
    inputs = [{"i": i} for i in range(n)]
    store = SqliteReceiptStore(path)
    try:
        run = RunInfo(run_id=run_id, org_id=ORG_ID, scope=SCOPE)
        system = DispatchSystem.start(tools=[Tool(tool_id="noop", fn=_noop)], store=store, run=run)
        try:
            proxy = system.proxy()
            cpu0, t0 = time.process_time(), time.perf_counter()
            futures = [proxy.execute("noop", x) for x in inputs]
            t_submit = time.perf_counter()
            results = [f.get(timeout=900) for f in futures]
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            stats = system.stats()
            ops = system.store_proxy.ops.get(timeout=30)
        finally:
            t_stop = time.perf_counter()
            system.stop()
            stop_s = time.perf_counter() - t_stop
    finally:
        store.close()
    executions = collections.Counter(r.execution for r in results)
    phases = stats["phases"]
    drains = int(phases.get("drain", {}).get("count", 0))
    waves = int(phases.get("admission", {}).get("count", 0))
    note = "" if executions == {expect: n} else f"UNEXPECTED executions {dict(executions)}"
    diag = [
        f"{name}: submit {n / (t_submit - t0):,.0f} calls/s on the caller; executions "
        f"{dict(executions)}; provider calls {stats['provider_calls']:,}; stop {stop_s * 1000:.0f} ms",
        f"{name}: {drains:,} drains ({n / max(drains, 1):,.1f} calls each), {waves:,} waves, "
        f"{ops:,} store ops ({n / max(ops, 1):,.1f} calls/op), CPU {cpu / n * 1e6:,.0f} µs/call",
        f"{name}: phase p50/p95 ms: "
        + ", ".join(f"{p} {v['p50_ms']:.1f}/{v['p95_ms']:.1f}" for p, v in phases.items()),
    ]
    return Timing(name, n, wall, cpu, note), diag


# -- 2. anchors ---------------------------------------------------------------------------


def bench_diskcache(directory: str, n: int) -> list[Timing]:
    """diskcache ``memoize`` on a no-op: ``n`` misses, then the same ``n`` as hits."""
    try:
        from diskcache import Cache
    except ImportError:
        return [Timing("diskcache memoize miss", 0, 0.0, note="n/a: pip install diskcache")]
    inputs = [{"i": i} for i in range(n)]
    out = []
    with Cache(directory) as cache:
        cache.stats(enable=True)

        @cache.memoize()
        def noop(input: dict[str, Any]) -> dict[str, Any]:
            return {"ok": True, "i": input["i"]}

        for name in ("diskcache memoize miss", "diskcache memoize hit"):
            before = cache.stats()
            cpu0, t0 = time.process_time(), time.perf_counter()
            for x in inputs:
                noop(x)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            hits, misses = (a - b for a, b in zip(cache.stats(), before, strict=True))
            out.append(Timing(name, n, wall, cpu, f"{hits:,} hits / {misses:,} misses"))
    return out


def dbos_child(n: int, mode: str, directory: str) -> None:
    """In a child process: ``n`` DBOS step no-ops in one workflow; prints one JSON line."""
    from dbos import DBOS

    url = f"sqlite:///{os.path.join(directory, f'dbos-{mode}.sqlite')}"
    config: dict[str, Any] = {"name": "dispatch-bench", "system_database_url": url, "run_admin_server": False}
    config["log_level"] = "WARNING"
    if mode == "wal":
        import sqlalchemy as sa

        engine = sa.create_engine(url)

        @sa.event.listens_for(engine, "connect")
        def _pragmas(conn: Any, record: Any) -> None:  # DBOS's own settings, plus WAL/NORMAL
            conn.isolation_level = "IMMEDIATE"
            conn.execute("PRAGMA busy_timeout=30000")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")

        config["system_database_engine"] = engine
    DBOS(config=config)  # type: ignore[arg-type]

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
        cpu0, t0 = time.process_time(), time.perf_counter()
        done = flow(n)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        DBOS.destroy()
    print(json.dumps({"n": done, "wall_s": wall, "cpu_s": cpu}), flush=True)


def bench_dbos(directory: str, n: int, mode: str, name: str, timeout_s: float) -> Timing:
    """Run :func:`dbos_child` in a child of the same runtime; n/a (with the reason) on error."""
    prefix = [sys.executable, "-m", "gevent.monkey"] if runtime_name() == "gevent" else [sys.executable]
    cmd = [
        *prefix,
        os.path.abspath(__file__),
        "--dbos-child",
        mode,
        "--dbos-calls",
        str(n),
        "--dir",
        directory,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return Timing(name, 0, 0.0, note=f"n/a: no result within {timeout_s:.0f} s")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Timing(name, 0, 0.0, note=f"n/a: {tail[:100]}")
    data = json.loads(lines[-1])
    return Timing(name, data["n"], data["wall_s"], data["cpu_s"])


# -- 4. burst -----------------------------------------------------------------------------


def bench_burst(path: str, n: int, unique: int, max_batch: int) -> tuple[bool, str]:
    """``n`` calls over ``unique`` keys, batch max ``max_batch``: provider calls must be ceil(U/M)."""
    sizes: list[int] = []

    def batch_fn(payload: list[Any], ctx: Any) -> list[Any]:
        sizes.append(len(payload))
        return [_noop(x, ctx) for x in payload]

    def single(input: Any, ctx: Any) -> Any:
        sizes.append(1)
        return _noop(input, ctx)

    tool = Tool(tool_id="burst", fn=single, batch=BatchStrategy(batch_fn=batch_fn, max_batch_size=max_batch))
    store = SqliteReceiptStore(path)
    try:
        run = RunInfo(run_id="bench-burst", org_id=ORG_ID, scope=SCOPE)
        with DispatchSystem.start(tools=[tool], store=store, run=run) as system:
            t0 = time.perf_counter()
            futures = [system.proxy().execute("burst", {"i": j % unique}) for j in range(n)]
            values = [f.get(timeout=300).value for f in futures]
            wall = time.perf_counter() - t0
            provider_calls = system.stats()["provider_calls"]
    finally:
        store.close()
    expected = math.ceil(unique / max_batch)
    right = all(v["i"] == j % unique for j, v in enumerate(values))
    ok = len(sizes) == expected == provider_calls and right
    sizes_text = ", ".join(f"{k}x{v}" for k, v in sorted(collections.Counter(sizes).items(), reverse=True))
    return ok, (
        f"burst N={n:,} U={unique:,} M={max_batch}: {len(sizes)} provider calls (stats {provider_calls}), "
        f"expected ceil(U/M) = {expected}; batch sizes {sizes_text}; "
        f"results {'right' if right else 'WRONG'}; {wall:.2f} s -> {'PASS' if ok else 'FAIL'}"
    )


# -- 5. latency ---------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float:
    data = sorted(values)
    return data[min(len(data) - 1, int(len(data) * q))]


def bench_latency(path: str, rounds: int) -> tuple[dict[str, list[float]], list[str]]:
    """Sequential single calls vs calling the function directly; ms.

    ``live``: new keys (claim, mark running, run, complete). ``cached, same system``: the
    same keys again, which the tool queue answers from its memory of completed keys.
    ``cached, new system``: the same keys through a second system (a receipt reuse).

    The phases of the live calls are collected through the perf hook; what they do not
    cover is hand-offs between threads (or greenlets) and waiting for a CPU.
    """
    direct = []
    for i in range(rounds):
        t0 = time.perf_counter()
        _noop({"i": i}, None)
        direct.append((time.perf_counter() - t0) * 1000.0)
    series: dict[str, list[float]] = {"live": [], "cached, same system": [], "cached, new system": []}
    phases: dict[str, list[float]] = collections.defaultdict(list)
    recording = [False]

    def hook(phase: str, ms: float, extra: dict[str, Any]) -> None:
        if recording[0]:  # receipt_prepare is recorded twice: the claim, then mark running
            name = phase if phase != "receipt_prepare" else "mark_running" if "marked" in extra else "claim"
            phases[name].append(ms)

    store = SqliteReceiptStore(path)
    try:
        tools = [Tool(tool_id="noop", fn=_noop)]
        policy = Policy(perf_hook=hook)
        for run_id, names in (
            ("bench-latency", ("live", "cached, same system")),
            ("bench-latency-2", ("cached, new system",)),
        ):
            run = RunInfo(run_id=run_id, org_id=ORG_ID, scope=SCOPE)
            with DispatchSystem.start(tools=tools, store=store, run=run, policy=policy) as system:
                proxy = system.proxy()
                for i in range(20):  # warm up: pools start their workers
                    proxy.execute("noop", {"i": -1 - i}).get(timeout=30)
                for name in names:
                    recording[0] = name == "live"
                    for i in range(rounds):
                        t0 = time.perf_counter()
                        result = proxy.execute("noop", {"i": i}).get(timeout=30)
                        series[name].append((time.perf_counter() - t0) * 1000.0)
                        assert result.execution == name.split(",")[0], result
    finally:
        store.close()
    live = series["live"]
    p50 = {name: _percentile(values, 0.5) for name, values in phases.items() if values}
    inside = sum(v for k, v in p50.items() if k != "drain")
    diag = [
        "live call phases p50 ms: "
        + ", ".join(f"{k} {v:.2f}" for k, v in p50.items())
        + f"; call p50 minus the drain's phases: {_percentile(live, 0.5) - inside:.2f} (hand-offs, waiting)"
    ]
    return {"direct": direct, **series}, diag


# -- profile ------------------------------------------------------------------------------


def profile_fresh(path: str, n: int, top: int) -> None:
    """A fresh pass under yappi (CPU clock, all threads or greenlets); top functions."""
    try:
        import yappi
    except ImportError:
        click.echo("profile: n/a (pip install yappi)")
        return
    if runtime_name() == "gevent":
        yappi.set_context_backend("greenlet")
    yappi.set_clock_type("cpu")
    yappi.start(builtins=False, profile_threads=True)
    timing, _ = bench_dispatch(path, n, "bench-profile", "profiled fresh", "live")
    yappi.stop()
    stats = list(yappi.get_func_stats())
    gevent = runtime_name() == "gevent"
    contexts = yappi.get_greenlet_stats() if gevent else yappi.get_thread_stats()
    total = sum(c.ttot for c in contexts) or 1.0
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

    def where(s: Any) -> str:
        module = s.module.replace(root, "")
        for marker in ("site-packages" + os.sep, "lib" + os.sep + "python"):
            if marker in module:
                module = module.split(marker, 1)[1]
        return f"{module}:{s.lineno} {s.name}"

    click.echo(
        f"\nprofile: fresh pass of {n:,} calls under yappi ({timing.rate:,.0f} calls/s with the profiler "
        f"on); CPU of every {'greenlet' if gevent else 'thread'}: {total:.2f} s"
    )
    components = [
        ("caller: DispatchProxy.execute", "DispatchProxy.execute"),
        ("drain pool: Drain.run (claim, waves, finish)", "Drain.run"),
        ("tool pool: Waves._call_unit (the tool itself)", "Waves._call_unit"),
        ("receipt store actor (SQLite work)", "ReceiptStoreActor._handle_receive"),
        ("tool queue actor", "ToolQueueActor._handle_receive"),
        ("completion flusher actor", "CompletionFlusherActor._handle_receive"),
        ("governor actor", "GovernorActor._handle_receive"),
        ("heartbeat actor", "HeartbeatActor._handle_receive"),
    ]
    by_name: dict[str, float] = collections.defaultdict(float)
    for s in stats:
        by_name[s.name] += s.ttot
    click.echo("CPU by component (inclusive):")
    for label, fn in components:
        click.echo(f"  {100 * by_name[fn] / total:5.1f}%  {by_name[fn] / n * 1e6:8.1f} µs/call  {label}")
    listed = [s for s in stats if s.name not in _PLUMBING and not s.name.endswith(_PLUMBING_SUFFIXES)]
    click.echo(f"{'cum %':>6}{'cum s':>8}{'self s':>8}{'calls':>9}  function (threading plumbing left out)")
    for s in sorted(listed, key=lambda s: -s.ttot)[:top]:
        click.echo(f"{100 * s.ttot / total:6.1f}{s.ttot:8.2f}{s.tsub:8.2f}{s.ncall:9,}  {where(s)}")
    click.echo(f"{'self %':>6}{'self s':>8}{'':>8}{'calls':>9}  function (by self time)")
    for s in sorted(stats, key=lambda s: -s.tsub)[:top]:
        click.echo(f"{100 * s.tsub / total:6.1f}{s.tsub:8.2f}{'':>8}{s.ncall:9,}  {where(s)}")


_PLUMBING = {
    "run", "Thread.run", "_WorkItem.run", "_worker", "Greenlet.run", "<listcomp>", "main",
    "Context.invoke", "Command.invoke", "BaseCommand.main", "BaseCommand.__call__",
    "bench_dispatch", "profile_fresh",
}  # fmt: skip
_PLUMBING_SUFFIXES = ("_bootstrap", "_bootstrap_inner", "._actor_loop", "._actor_loop_running")
"""Frames that only carry work to a thread, an actor or a pool (not listed by --profile)."""


# -- report -------------------------------------------------------------------------------


def _runtime_banner() -> str:
    if runtime_name() == "gevent":
        import gevent

        return f"gevent {gevent.__version__} (monkey-patched; actors and pools are greenlets)"
    return "threads (no gevent)"


def _calibrate() -> str:
    """Nanoseconds per iteration of an empty Python loop: how fast this machine is right now."""
    start = time.perf_counter()
    for _ in range(1_000_000):
        pass
    return f"empty Python loop {(time.perf_counter() - start) * 1000:.0f} ns/iteration"


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _versions() -> str:
    out = []
    for dist in ("pykka", "gevent", "diskcache", "dbos", "sqlalchemy"):
        try:
            from importlib.metadata import version

            out.append(f"{dist} {version(dist)}")
        except Exception:
            out.append(f"{dist} -")
    return ", ".join(out)


def _ratio(a: Timing | None, b: Timing | None) -> str:
    if a is None or b is None or not a.n or not b.n:
        return "n/a"
    return f"{a.rate / b.rate:,.2f}x"


def _table(rows: list[Timing], fresh: Timing) -> None:
    click.echo(
        f"\n{'what':<44}{'N':>9}{'wall s':>9}{'calls/s':>11}{'µs/call':>10}{'CPU µs':>9}{'fresh÷row':>10}"
    )
    click.echo("-" * 102)
    for t in rows:
        if not t.n:
            click.echo(f"{t.name:<44}{'':>9}{'':>9}{'n/a':>11}{'':>10}{'':>9}{'':>10}  {t.note}")
            continue
        click.echo(
            f"{t.name:<44}{t.n:>9,}{t.wall_s:>9.2f}{t.rate:>11,.0f}{t.us:>10.1f}"
            f"{t.cpu_s / t.n * 1e6:>9.0f}{_ratio(fresh, t):>10}  {t.note}"
        )
    click.echo("-" * 102)


@click.command()
@click.option("--calls", default=20_000, show_default=True, help="Calls for fresh, rerun and diskcache.")
@click.option("--dbos-calls", default=500, show_default=True, help="DBOS steps per configuration.")
@click.option("--dbos-timeout", default=120.0, show_default=True, help="Seconds before a DBOS run is n/a.")
@click.option("--no-dbos", is_flag=True, help="Skip the DBOS anchor.")
@click.option("--burst", "burst", default=(10_000, 1_000, 50), type=(int, int, int), show_default=True,
              help="N U M: N calls over U unique keys, max batch M (7 3 3 always runs too).")  # fmt: skip
@click.option("--latency-rounds", default=200, show_default=True, help="Sequential calls per latency figure.")
@click.option(
    "--profile", "profile_calls", default=0, help="Also profile a fresh pass of this many calls (yappi)."
)
@click.option("--profile-only", is_flag=True, help="Only the profiled pass (needs --profile N).")
@click.option("--top", default=15, show_default=True, help="Functions listed by --profile.")
@click.option(
    "--dir", "directory", default=None, help="Where to put the temporary files (default: system temp)."
)
@click.option("--dbos-child", default=None, hidden=True)
def main(
    calls: int, dbos_calls: int, dbos_timeout: float, no_dbos: bool, burst: tuple[int, int, int],
    latency_rounds: int, profile_calls: int, profile_only: bool, top: int, directory: str | None,
    dbos_child: str | None,
) -> None:  # fmt: skip
    """Time the dispatch system against diskcache and DBOS; check bursts and latency."""
    if dbos_child:
        dbos_child_run(dbos_calls, dbos_child, directory or tempfile.gettempdir())
        return
    started = time.perf_counter()
    click.echo(f"runtime: {_runtime_banner()}")
    click.echo(f"machine now: load average {_load()}, {_calibrate()} (compare runs only at similar values)")
    click.echo(
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs, "
        f"{platform.machine()}; {_versions()}"
    )
    with tempfile.TemporaryDirectory(prefix="dispatch-bench-", dir=directory) as tmp:
        if profile_only:
            profile_fresh(os.path.join(tmp, "profile.db"), profile_calls or calls, top)
            return
        db = os.path.join(tmp, "receipts.db")
        fresh, diag_fresh = bench_dispatch(db, calls, "bench-fresh", "tooldispatch fresh", "live")
        rerun, diag_rerun = bench_dispatch(
            db, calls, "bench-rerun", "tooldispatch rerun (all cached)", "cached"
        )
        anchors = bench_diskcache(os.path.join(tmp, "diskcache"), calls)
        if not no_dbos:
            anchors.append(
                bench_dbos(tmp, dbos_calls, "default", "DBOS step (its SQLite defaults)", dbos_timeout)
            )
            anchors.append(
                bench_dbos(tmp, dbos_calls, "wal", "DBOS step (WAL, synchronous=NORMAL)", dbos_timeout)
            )
        bursts = [bench_burst(os.path.join(tmp, "burst-small.db"), 7, 3, 3)]
        bursts.append(bench_burst(os.path.join(tmp, "burst.db"), *burst))
        latency, diag_latency = bench_latency(os.path.join(tmp, "latency.db"), latency_rounds)
        _report(fresh, rerun, anchors, diag_fresh + diag_rerun, bursts, latency, diag_latency)
        if profile_calls:
            profile_fresh(os.path.join(tmp, "profile.db"), profile_calls, top)
    click.echo(
        f"\nwhole run {time.perf_counter() - started:.0f} s; machine at the end: load average {_load()}, "
        f"{_calibrate()}"
    )


def _report(
    fresh: Timing, rerun: Timing, anchors: list[Timing], diag: list[str], bursts: list[tuple[bool, str]],
    latency: dict[str, list[float]], diag_latency: list[str],
) -> None:  # fmt: skip
    verdicts: list[tuple[str, str, bool]] = []
    click.echo("\nno-op tool, distinct inputs {'i': n}, one SQLite file (WAL, synchronous=NORMAL)")
    _table([fresh, rerun, *anchors], fresh)
    for line in diag:
        click.echo(f"  {line}")
    by_name = {t.name: t for t in anchors}
    miss, hit = by_name.get("diskcache memoize miss"), by_name.get("diskcache memoize hit")
    click.echo(
        f"\nratios: fresh / diskcache miss {_ratio(fresh, miss)}; rerun / diskcache hit {_ratio(rerun, hit)}"
    )
    for t in anchors:
        if t.name.startswith("DBOS"):
            click.echo(f"        fresh / {t.name} {_ratio(fresh, t)}")

    verdicts.append(
        (f"fresh >= {FRESH_TARGET:,.0f} calls/s", f"{fresh.rate:,.0f}", fresh.rate >= FRESH_TARGET)
    )
    if miss is not None and miss.n:
        ratio = fresh.rate / miss.rate
        verdicts.append(
            (f"fresh >= {FRESH_VS_DISKCACHE:g}x diskcache miss", f"{ratio:.2f}x", ratio >= FRESH_VS_DISKCACHE)
        )
    verdicts.append(
        (f"rerun >= {RERUN_TARGET:,.0f} calls/s", f"{rerun.rate:,.0f}", rerun.rate >= RERUN_TARGET)
    )
    click.echo("")
    for ok, line in bursts:
        click.echo(line)
        verdicts.append((line.split(":")[0] + " -> ceil(U/M) provider calls", "PASS" if ok else "FAIL", ok))

    base = _percentile(latency["direct"], 0.5)
    click.echo(f"\nlatency, {len(latency['live'])} sequential calls on an idle system (ms):")
    click.echo(f"{'':<28}{'p50':>9}{'p95':>9}{'p50 added':>11}{'p95 added':>11}")
    for name, values in latency.items():
        p50, p95 = _percentile(values, 0.5), _percentile(values, 0.95)
        added = (p50 - base, p95 - _percentile(latency["direct"], 0.95))
        click.echo(f"{name + (' call' if name == 'direct' else ''):<28}{p50:9.3f}{p95:9.3f}"
                   f"{added[0]:11.3f}{added[1]:11.3f}")  # fmt: skip
    click.echo(f"  {diag_latency[0]}")
    live_added = _percentile(latency["live"], 0.5) - base
    verdicts.append(
        (
            f"live call adds <= {LATENCY_TARGET_MS:g} ms at p50",
            f"{live_added:.2f} ms",
            live_added <= LATENCY_TARGET_MS,
        )
    )

    click.echo(f"\ntargets (issue 3), runtime {runtime_name()}:")
    for target, measured, ok in verdicts:
        click.echo(f"  {target:<60}{measured:>10}  {'met' if ok else 'MISSED'}")


def dbos_child_run(n: int, mode: str, directory: str) -> None:
    try:
        dbos_child(n, mode, directory)
    except ImportError as exc:
        sys.exit(f"dbos is not installed ({exc})")


if __name__ == "__main__":
    main()
