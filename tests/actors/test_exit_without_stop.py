"""A host that ends without ``DispatchSystem.stop()`` (its script raised, was interrupted,
or simply ran to its end) still exits, and what its running calls paid for is stored:
the system is stopped at interpreter exit. Before, the actors' non-daemon threads held
the exit up for ever. Real child processes on real SQLite files, in the runtime of this
test run (``-m gevent.monkey`` under gevent).
"""

from __future__ import annotations

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

EXIT_WITHIN_S = 20.0

_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from actors import DispatchSystem, RunInfo, Tool
    from stores import SqliteReceiptStore

    db, ending = sys.argv[1], sys.argv[2]

    def slow(i, c):
        time.sleep(0.5)
        return {"i": i}

    def make():
        store = SqliteReceiptStore(db)
        run = RunInfo(run_id=ending, org_id="o", scope="s")
        return DispatchSystem.start(tools=[Tool(tool_id="slow", fn=slow)], store=store, run=run)

    systems = [make() for _ in range(2 if ending == "two-systems" else 1)]
    for n, system in enumerate(systems):
        system.proxy().execute_many("slow", [{"i": n * 10 + i} for i in range(3)])
    if ending == "dropped":
        systems.clear()  # the host lets go of every handle: the actors still run
    time.sleep(0.2)
    print("running", flush=True)
    if ending == "raise":
        raise RuntimeError("the script crashed with calls running")
    if ending == "sigint":
        time.sleep(30)  # interrupted here
    if ending == "exit":
        sys.exit(3)
    """
)


def _run(
    runtime: str, tmp_path: Path, ending: str, interrupt: bool = False
) -> tuple[subprocess.CompletedProcess[str], float]:
    script = tmp_path / "host.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(actors.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    prefix = [sys.executable, "-m", "gevent.monkey"] if runtime == "gevent" else [sys.executable]
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
    done, _ = _run(runtime, tmp_path, "sigint", interrupt=True)
    assert "KeyboardInterrupt" in done.stderr
    assert done.returncode != 0
    assert _statuses(tmp_path / "r.db") == {"completed": 3}
