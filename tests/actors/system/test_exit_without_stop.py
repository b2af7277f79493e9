"""A host that ends without ``DispatchSystem.stop()`` (its script raised, was interrupted,
or simply ran to its end) still exits, and what its running calls paid for is stored:
the system is stopped at interpreter exit. Before, the actors' non-daemon threads held
the exit up for ever. Real child processes on real SQLite files, in the runtime of this
test run (``-m gevent.monkey`` under gevent).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import actors

pytestmark = pytest.mark.scenario

EXIT_WITHIN_S = 20.0

_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from actors import DispatchSystem, RunInfo, Tool
    from stores import SqliteReceiptStore

    db, ending = sys.argv[1], sys.argv[2]

    def slow(i, c):
        time.sleep(0.5)
        with open(db + ".returned", "a") as out:  # what the provider was paid for
            out.write("%d\\n" % i["i"])
        return {"i": i}

    def make():
        store = SqliteReceiptStore(db)
        run = RunInfo(run_id=ending, org_id="o", scope="s")
        return DispatchSystem.start(tools=[Tool(tool_id="slow", fn=slow)], store=store, run=run)

    import actors.runtime.at_exit
    if ending == "locked":  # the tools (0.5 s) come back well inside it, even on a loaded machine
        actors.runtime.at_exit.AT_EXIT_STOP_S = 4.0
    if ending == "sigint-twice":
        def slow(i, c):
            time.sleep(20)
            return {"i": i}
    systems = [make() for _ in range(2 if ending == "two-systems" else 1)]
    for n, system in enumerate(systems):
        system.proxy().execute_many("slow", [{"i": n * 10 + i} for i in range(3)])
    if ending == "dropped":
        systems.clear()  # the host lets go of every handle: the actors still run
    if ending == "host-thread":  # the host's own (non-daemon) thread still calls after main ends
        import threading
        proxy = systems[0].proxy()
        def more():
            for j in range(4):
                proxy.execute("slow", {"i": 100 + j}).get(timeout=30)
        threading.Thread(target=more).start()
    if ending == "fork":
        for f in systems[0].proxy().execute_many("slow", [{"i": i} for i in range(3)]):
            f.get(timeout=30)
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # the child's exit: its parent's system is not its own
        os.waitpid(pid, 0)
        print("child exited in %.1f s" % (time.monotonic() - started), flush=True)
        systems[0].stop()
    time.sleep(0.2)
    if ending == "locked":  # the store is locked by another connection at exit
        import sqlite3
        lock = sqlite3.connect(db, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
    print("running", flush=True)
    if ending == "raise":
        raise RuntimeError("the script crashed with calls running")
    if ending in ("sigint", "sigint-twice"):
        time.sleep(30)  # interrupted here
    if ending == "exit":
        sys.exit(3)
    """
)


def child_env(runtime: str) -> tuple[dict[str, str], list[str]]:
    """(environment, command prefix) of a child host in this run's runtime, importing the
    same ``actors``/``stores`` as this test process."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(actors.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    prefix = [sys.executable, "-m", "gevent.monkey"] if runtime == "gevent" else [sys.executable]
    return env, prefix


def _run(
    runtime: str, tmp_path: Path, ending: str, interrupt: int = 0
) -> tuple[subprocess.CompletedProcess[str], float]:
    script = tmp_path / "host.py"
    script.write_text(_SCRIPT)
    env, prefix = child_env(runtime)
    start = time.monotonic()
    proc = subprocess.Popen(
        [*prefix, str(script), str(tmp_path / "r.db"), ending],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        if interrupt:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "running"
            proc.send_signal(signal.SIGINT)
            if interrupt > 1:  # the second: once the exit's stop waits on the tools
                assert proc.stderr is not None
                for line in proc.stderr:
                    if "stopping it, up to" in line:
                        break
                proc.send_signal(signal.SIGINT)
                start = time.monotonic()  # how long the exit takes after it
        out, err = proc.communicate(timeout=EXIT_WITHIN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(
            f"the host did not exit within {EXIT_WITHIN_S} s (stop() was never called)\n{err[-2000:]}"
        )
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.monotonic() - start


def _statuses(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT status, count(*) FROM receipts GROUP BY status").fetchall())


@pytest.mark.parametrize(
    ("ending", "code", "calls"),
    [
        pytest.param("raise", 1, 3, id="raised"),
        pytest.param("end", 0, 3, id="ran-to-its-end"),
        pytest.param("exit", 3, 3, id="sys-exit"),
        pytest.param("dropped", 0, 3, id="handles-dropped"),
        pytest.param("two-systems", 0, 6, id="two-systems"),
        pytest.param("host-thread", 0, 7, id="host-thread-calls-after-main-ended"),
    ],
)
def test_a_host_that_never_stops_its_system_exits_with_its_running_calls_stored(
    runtime: Any, tmp_path: Path, ending: str, code: int, calls: int
) -> None:
    done, _ = _run(runtime, tmp_path, ending)
    assert done.returncode == code, done.stderr[-2000:]
    assert _statuses(tmp_path / "r.db") == {"completed": calls}
    assert "stop() was not called" in done.stderr


def test_a_host_interrupted_with_sigint_exits_with_its_running_calls_stored(
    runtime: Any, tmp_path: Path
) -> None:
    done, _ = _run(runtime, tmp_path, "sigint", interrupt=1)
    assert "KeyboardInterrupt" in done.stderr
    assert done.returncode != 0
    assert _statuses(tmp_path / "r.db") == {"completed": 3}


def test_a_second_interrupt_while_the_exit_waits_on_running_tools_leaves_at_once(
    runtime: Any, tmp_path: Path
) -> None:
    """First Ctrl-C: the exit's stop waits for the running calls (20 s tools); a second one
    leaves at once (before: the stop was cut short and the actors' threads held the exit
    for ever). The calls still running are left to their leases, as after a crash."""
    done, took = _run(runtime, tmp_path, "sigint-twice", interrupt=2)
    assert took < 8.0, done.stderr[-2000:]  # the tools run 20 s, the exit's bound is 30 s
    assert "interrupted again: leaving now" in done.stderr


def test_a_locked_store_at_exit_holds_the_exit_no_longer_than_its_bound(runtime: Any, tmp_path: Path) -> None:
    """Another connection holds the SQLite file locked: the exit's stop (bound 4 s here)
    salvages what it could not write, and the process exits (before: it waited on the
    store actor's busy timeout, 30 s more)."""
    done, took = _run(runtime, tmp_path, "locked")
    assert took < 15.0, done.stderr[-2000:]  # its bound and 11 s to spare, not 30 s more
    returned = {int(line) for line in (tmp_path / "r.db.returned").read_text().split()}
    salvage = tmp_path / "r.db.salvage.jsonl"
    lines = salvage.read_text().splitlines() if salvage.exists() else []
    salvaged = {json.loads(line)["output"]["i"]["i"] for line in lines}
    assert returned and returned <= salvaged, (returned, salvaged)  # nothing paid for is lost


def test_a_forked_child_does_not_stop_its_parents_system_at_its_exit(runtime: Any, tmp_path: Path) -> None:
    done, _ = _run(runtime, tmp_path, "fork")
    assert done.returncode == 0, done.stderr[-2000:]
    took = float(done.stdout.split("child exited in ")[1].split()[0])
    assert took < 3.0, done.stderr[-2000:]


_FANOUT = textwrap.dedent(
    """
    import sys, time
    from concurrent.futures import ThreadPoolExecutor
    from actors import DispatchSystem, RunInfo, Tool
    from stores import SqliteReceiptStore

    holder = {}

    def child(i, c):
        time.sleep(0.3)
        return {"c": i["c"]}

    def parent(i, c):  # still running, and fanning out, when the host's main ends
        time.sleep(0.5)
        with ThreadPoolExecutor(2) as pool:
            one = c.wrap(lambda x: holder["p"].execute("child", {"c": x}).get(30).value)
            got = list(pool.map(one, [1, 2]))
        return {"got": got}

    store = SqliteReceiptStore(sys.argv[1])
    safe = sys.argv[2] == "safe"
    tools = [Tool(tool_id="parent", fn=parent, retry_safe=safe), Tool(tool_id="child", fn=child)]
    system = DispatchSystem.start(tools=tools, store=store, run=RunInfo(run_id="f", org_id="o", scope="s"))
    holder["p"] = system.proxy()
    system.proxy().execute_many("parent", [{"p": p} for p in range(3)])
    time.sleep(0.2)
    """
)


@pytest.mark.parametrize("safe", [True, False], ids=["retry-safe", "not-retry-safe"])
def test_a_tool_fanning_out_on_an_executor_when_the_host_exits_is_recorded_as_stopped(
    runtime: Any, tmp_path: Path, safe: bool
) -> None:
    """``concurrent.futures`` refuses new work once the interpreter's shutdown began, before
    the exit's stop: the parents fail with "cannot schedule new futures after interpreter
    shutdown". That is the exit, not the input: recorded ``transient`` (a rerun runs them)
    or, not retry-safe, ``uncertain`` (before: ``failed``/``permanent``, never run again)."""
    script = tmp_path / "fanout.py"
    script.write_text(_FANOUT)
    env, prefix = child_env(runtime)
    db = tmp_path / "r.db"
    arg = "safe" if safe else "unsafe"
    done = subprocess.run(
        [*prefix, str(script), str(db), arg], capture_output=True, text=True, env=env, timeout=EXIT_WITHIN_S
    )
    assert done.returncode == 0, done.stderr[-2000:]
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT status, failure_kind FROM receipts WHERE tool_id = 'parent'").fetchall()
    assert len(rows) == 3
    for status, kind in rows:
        assert status == "completed" or (status, kind) == (
            ("failed", "transient") if safe else ("uncertain", kind)
        ), rows


_MP = textwrap.dedent(
    """
    import multiprocessing, sys, time
    from actors import DispatchSystem, RunInfo, Tool
    from stores import SqliteReceiptStore

    def slow(i, c):
        time.sleep(0.5)
        return {"i": i}

    def child(db, n):  # a system the child never stops; it leaves through os._exit
        run = RunInfo(run_id="c%d" % n, org_id="o", scope="s")
        store = SqliteReceiptStore(db)
        system = DispatchSystem.start(tools=[Tool(tool_id="slow", fn=slow)], store=store, run=run)
        system.proxy().execute_many("slow", [{"i": n * 10 + i} for i in range(3)])
        time.sleep(0.2)

    if __name__ == "__main__":
        context = multiprocessing.get_context(sys.argv[2])
        procs = [context.Process(target=child, args=(sys.argv[1], n)) for n in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
            assert p.exitcode == 0, p.exitcode
    """
)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_multiprocessing_child_that_never_stops_its_system_stores_its_running_calls(
    runtime: Any, tmp_path: Path, method: str
) -> None:
    """A ``multiprocessing`` child made by fork leaves through ``os._exit`` (no ``atexit``):
    its system is stopped by multiprocessing's finalizers (before: its receipts stayed
    ``running``, the results its tools returned lost)."""
    if runtime == "gevent" and method == "spawn":
        pytest.skip("a spawned child is a plain interpreter: the threads run covers it")
    script = tmp_path / "mp.py"
    script.write_text(_MP)
    env, prefix = child_env(runtime)
    db = tmp_path / "r.db"
    done = subprocess.run(
        [*prefix, str(script), str(db), method],
        capture_output=True,
        text=True,
        env=env,
        timeout=EXIT_WITHIN_S * 2,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert _statuses(db) == {"completed": 6}


def test_after_an_interrupt_every_later_run_of_the_exit_hook_leaves_at_once() -> None:
    """The hook runs twice at exit (``atexit``, then multiprocessing's finalizers): once an
    interrupt ended its wait, the second run must not start the stop again (before: the
    second run waited the whole bound, the process did not leave)."""
    from actors.runtime.at_exit import ExitHook

    class Host:
        stopped = False
        stops = 0

        def stop(self, timeout_s: float) -> None:
            Host.stops += 1
            raise KeyboardInterrupt

    hook = ExitHook()
    hook.add(Host())
    hook.run()
    hook.run()
    assert Host.stops == 1
