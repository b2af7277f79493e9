"""A caller whose result is being written when its own ``timeout_s`` passes (another
writer holds the SQLite file) gets that result then, from the value in hand: it no longer
waits for the store (6 s on a 0.3 s timeout), nor gets a timeout error for a call whose
tool returned. The write goes on: the receipt completes once the file is free, and a
rerun reuses it. Real systems on SQLite files, both runtimes."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from actors import Policy, Tool

WAIT_S = 20.0
LOCK_S = 3.0


def _locker(db_path: Path, hold_s: float) -> threading.Event:
    """Another writer takes the file's write lock now and holds it ``hold_s``."""
    taken = threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
        conn.execute("BEGIN IMMEDIATE")
        taken.set()
        time.sleep(hold_s)
        conn.execute("COMMIT")
        conn.close()

    threading.Thread(target=hold, daemon=True).start()
    assert taken.wait(WAIT_S)
    return taken


@pytest.mark.parametrize("failing", [False, True], ids=["value", "failure"])
@pytest.mark.waits
def test_callers_waiting_on_a_locked_write_are_answered_at_their_own_timeout(
    make_system: Any, db_path: Path, recorder: Any, read_receipts: Any, key_of: Any, failing: bool
) -> None:
    started = threading.Event()

    def tool(i: Any, ctx: Any) -> Any:
        recorder.record("t", i, ctx)
        started.set()
        time.sleep(0.3)
        if failing:
            raise ValueError("the provider said no")
        return {"v": i}

    tools = [Tool(tool_id="t", fn=tool)]
    system = make_system(tools, policy=Policy(batch_grace_s=0.02))
    proxy = system.proxy()
    t0 = time.monotonic()
    owner = proxy.execute("t", {"k": 1}, timeout_s=1.0)
    assert started.wait(WAIT_S)
    _locker(db_path, LOCK_S)
    time.sleep(0.5)  # the tool returned; its write waits for the lock
    t1 = time.monotonic()
    joiner = proxy.execute("t", {"k": 1}, timeout_s=0.3)
    for future, since, timeout_s, execution in ((joiner, t1, 0.3, "in_flight"), (owner, t0, 1.0, "live")):
        if failing:
            with pytest.raises(ValueError, match="the provider said no"):
                future.get(timeout=WAIT_S)
        else:
            result = future.get(timeout=WAIT_S)
            assert (result.value, result.execution) == ({"v": {"k": 1}}, execution)
        waited = time.monotonic() - since
        assert waited < timeout_s + 0.6, f"a caller waited {waited:.2f} s on a {timeout_s} s timeout"
    deadline = time.monotonic() + WAIT_S
    key = key_of(tools[0], {"k": 1})
    while time.monotonic() < deadline:
        (receipt,) = read_receipts([key])
        if receipt is not None and receipt.status.value in ("completed", "failed"):
            break
        time.sleep(0.1)
    assert receipt is not None and receipt.status.value == ("failed" if failing else "completed")
    system.stop()
    rerun = make_system(tools, run_id="r2")
    if failing:
        with pytest.raises(Exception, match="the provider said no"):
            rerun.proxy().execute("t", {"k": 1}).get(timeout=WAIT_S)
    else:
        assert rerun.proxy().execute("t", {"k": 1}).get(timeout=WAIT_S).execution == "cached"
    assert recorder.count("t") == 1
