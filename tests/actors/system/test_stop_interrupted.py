"""A stop cut short (Ctrl-C, a signal handler's exit) while the receipt store is locked
keeps what was paid for: what the flusher holds is salvaged before the interrupt leaves
the stop, on every way a stop is made (``stop()``, the context manager, a second caller
waiting on another's stop, the exit's own stop). Before, the interrupt left at once: the
receipts stayed ``running``, nothing was salvaged, and the actors' daemon threads died
with the process. Real child processes in this run's runtime, real signals, a real
SQLite file locked by another connection.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from .test_exit_without_stop import child_env

pytestmark = pytest.mark.scenario

CALLS = 3

_HOST = textwrap.dedent(
    """
    import signal, sqlite3, sys, threading, time
    from actors import DispatchSystem, RunInfo, Tool
    from stores import SqliteReceiptStore

    db, how = sys.argv[1], sys.argv[2]
    started, go = threading.Semaphore(0), threading.Event()

    def paid(i, c):
        started.release()
        go.wait(30)
        with open(db + ".paid", "a") as out:  # what the provider was paid for
            out.write("%d\\n" % i["i"])
        return {"i": i["i"]}

    def leave(signum, frame):  # the host's handler: stops the system, then exits
        system.stop(timeout_s=60)
        sys.exit(5)

    if how == "handler-stops-during-stop":
        signal.signal(signal.SIGTERM, leave)
    system = DispatchSystem.start(
        tools=[Tool(tool_id="paid", fn=paid)], store=SqliteReceiptStore(db),
        run=RunInfo(run_id="r", org_id="o", scope="s"),
    )
    system.proxy().execute_many("paid", [{"i": k} for k in range(CALLS)])
    for _ in range(CALLS):  # every receipt is claimed (running) and its tool started
        started.acquire()
    lock = sqlite3.connect(db, isolation_level=None, timeout=30)
    lock.execute("BEGIN EXCLUSIVE")  # held until the process exits
    go.set()
    while True:  # each result is paid, then waits on the lock at the flusher
        try:
            with open(db + ".paid") as f:
                if len(f.read().split()) == CALLS:
                    break
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    if how == "second-stop":  # another thread's stop is under way; this one waits on it
        threading.Thread(target=system.stop, args=(60,), daemon=True).start()
        time.sleep(0.2)
    print("stopping", flush=True)
    if how == "with":
        with system:
            pass
    elif how != "at-exit":  # at-exit: the script ends, and the exit's stop runs
        system.stop(timeout_s=60)
    """
).replace("CALLS", str(CALLS))


@pytest.mark.parametrize(
    ("how", "sig"),
    [
        pytest.param("stop", signal.SIGINT, id="ctrl-c-in-stop"),
        pytest.param("with", signal.SIGINT, id="ctrl-c-in-the-context-managers-stop"),
        pytest.param("second-stop", signal.SIGINT, id="ctrl-c-in-a-stop-waiting-on-another"),
        pytest.param("at-exit", signal.SIGINT, id="ctrl-c-in-the-exits-stop"),
        pytest.param("handler-stops-during-stop", signal.SIGTERM, id="sigterm-handler-stops-in-stop"),
    ],
)
def test_a_stop_cut_short_while_the_store_is_locked_salvages_every_paid_result(
    runtime: Any, tmp_path: Path, how: str, sig: int
) -> None:
    """The last variant: the host's SIGTERM handler calls ``stop()`` then exits while the
    host's own stop is under way, on the same thread; that inner stop waited on the outer
    one for its whole bound (60 s). It now salvages what is held and returns at once."""
    script, db = tmp_path / "host.py", tmp_path / "r.db"
    script.write_text(_HOST)
    env, prefix = child_env(runtime)
    proc = subprocess.Popen(
        [*prefix, str(script), str(db), how], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().strip() == "stopping", proc.stderr.read()[-3000:]
        if how == "at-exit":  # once the exit's stop has begun
            for line in proc.stderr:
                if "stopping it, up to" in line:
                    break
        signal_after = 1.0  # the stop waits on the flusher, which waits on the lock
        try:
            proc.wait(timeout=signal_after)
        except subprocess.TimeoutExpired:
            proc.send_signal(sig)
        # well inside the stop's own bound (60 s): the interrupt leaves the stop at once
        _, err = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if how == "handler-stops-during-stop":
        assert proc.returncode == 5, err[-3000:]
    paid = {int(n) for n in (tmp_path / "r.db.paid").read_text().split()}
    assert len(paid) == CALLS
    salvage = tmp_path / "r.db.salvage.jsonl"
    lines = salvage.read_text().splitlines() if salvage.exists() else []
    salvaged = {json.loads(line)["output"]["i"] for line in lines}
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT status, output FROM receipts").fetchall()
    completed = {json.loads(output)["i"] for status, output in rows if status == "completed"}
    assert paid <= salvaged | completed, (sorted(salvaged), rows, err[-3000:])  # nothing paid for is lost
