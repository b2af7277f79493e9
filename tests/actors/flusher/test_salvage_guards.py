"""Salvage keeps what cannot be stored for an operator, never as a cached value, and a replay
never rewrites a file that is not a salvage file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from actors import OutputNotStorableError, RecordedFailureError, Tool
from actors.flusher.salvage import NotASalvageFileError, SalvageLog
from stores import FailureKind, SqliteReceiptStore

WAIT_S = 15.0


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def test_salvage_an_unstorable_output_is_never_replayed_as_a_cached_value(
    make_system: Any, tmp_path: Path, recorder: Any
) -> None:
    def fn(i: Any, c: Any) -> Any:
        recorder.record("deep", i, c)
        return {"v": _deep(600)}  # JSON, but deeper than the store can hold exactly

    store_path = tmp_path / "receipts.db"
    system = make_system([Tool(tool_id="deep", fn=fn)])
    with pytest.raises(OutputNotStorableError):
        system.proxy().execute("deep", {"n": 1}).get(timeout=WAIT_S)
    salvage = SalvageLog(str(store_path) + ".salvage.jsonl")
    store = SqliteReceiptStore(store_path)
    try:
        report = salvage.replay(store)
    finally:
        store.close()
    assert report.completed == 0
    again = system.proxy().execute("deep", {"n": 1})
    with pytest.raises(RecordedFailureError) as info:  # the recorded failure, never a "cached" placeholder
        again.get(timeout=WAIT_S)
    assert info.value.failure_kind is FailureKind.PERMANENT
    assert recorder.count("deep") == 1


@pytest.mark.parametrize(
    "output",
    [
        pytest.param(lambda: {"v": _deep(600)}, id="nested-too-deep"),
        pytest.param(lambda: {"n": 10**5000}, id="int-past-digit-limit"),
        pytest.param(lambda: [1, {"a": [_deep(700)]}], id="deep-inside-a-list"),
    ],
)
def test_an_unstorable_output_is_paid_once_a_rerun_answers_from_the_receipt(
    make_system: Any, tmp_path: Path, recorder: Any, output: Any
) -> None:
    """The provider was paid for an answer no store can hold: the receipt records the
    failure (kind ``permanent``, a kind every version reads), so neither a new call in the same run, nor a
    rerun in a new run, nor one through ``execute_many`` pays again; ``retry_failed`` does."""

    def fn(i: Any, c: Any) -> Any:
        recorder.record("odd", i, c)
        return output()

    tools = [Tool(tool_id="odd", fn=fn)]
    first = make_system(tools, run_id="run-1")
    with pytest.raises(OutputNotStorableError):
        first.proxy().execute("odd", {"n": 1}).get(timeout=WAIT_S)
    assert recorder.count("odd") == 1
    first.stop()
    rerun = make_system(tools, run_id="run-2")
    [future] = rerun.proxy().execute_many("odd", [{"n": 1}])
    with pytest.raises(RecordedFailureError) as info:
        future.get(timeout=WAIT_S)
    assert info.value.failure_kind is FailureKind.PERMANENT
    assert "salvage" in str(info.value) and "retry_failed" in str(info.value)
    with pytest.raises(RecordedFailureError):
        rerun.proxy().execute("odd", {"n": 1}).get(timeout=WAIT_S)
    assert recorder.count("odd") == 1
    with pytest.raises(OutputNotStorableError):  # asked for: the provider is called again
        rerun.proxy().execute("odd", {"n": 1}, retry_failed=True).get(timeout=WAIT_S)
    assert recorder.count("odd") == 2
    assert len(SalvageLog(str(tmp_path / "receipts.db") + ".salvage.jsonl").entries()) >= 2


def test_salvage_replay_refuses_a_file_that_is_not_a_salvage_file(tmp_path: Path) -> None:
    other = tmp_path / "passwd"
    other.write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/:/usr/sbin/nologin\n")
    os.chmod(other, 0o644)
    before = other.read_bytes()
    store = SqliteReceiptStore(tmp_path / "receipts.db")
    try:
        with pytest.raises(NotASalvageFileError):
            SalvageLog(str(other)).replay(store)
    finally:
        store.close()
    assert other.read_bytes() == before
    assert os.stat(other).st_mode & 0o777 == 0o644


def test_a_reconcile_hooks_answer_no_store_can_hold_is_salvaged(
    make_system: Any, tmp_path: Path, recorder: Any, read_receipts: Any, key_of: Any
) -> None:
    """The provider reports, through the reconcile hook, an answer the store cannot hold:
    the caller hears why, the receipt stays uncertain (nothing is paid again), and the
    answer is kept in the salvage file for an operator (before: dropped)."""
    from actors import ToolTimeoutError

    def charge(i: Any, c: Any) -> Any:
        recorder.record("charge", i, c)
        raise ToolTimeoutError("timed out after sending")

    def reconcile(i: Any, c: Any) -> Any:
        return {"receipt": _deep(600)}

    tool = Tool(tool_id="charge", fn=charge, reconcile=reconcile)
    system = make_system([tool])
    with pytest.raises(ToolTimeoutError):
        system.proxy().execute("charge", {"card": 1}).get(timeout=WAIT_S)
    with pytest.raises(OutputNotStorableError):
        system.proxy().execute("charge", {"card": 1}).get(timeout=WAIT_S)
    (receipt,) = read_receipts([key_of(tool, {"card": 1})])
    assert receipt is not None and receipt.status.value == "uncertain"
    entries = SalvageLog(str(tmp_path / "receipts.db") + ".salvage.jsonl").entries()
    assert any("reconcile hook" in (e.error or "") for e in entries)
    assert recorder.count("charge") == 1
