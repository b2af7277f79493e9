"""Salvage keeps what cannot be stored for an operator, never as a cached value, and a replay
never rewrites a file that is not a salvage file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from actors import OutputNotStorableError, Tool
from actors.salvage import NotASalvageFileError, SalvageLog
from stores import SqliteReceiptStore

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
    with pytest.raises(OutputNotStorableError):  # asked again, never a placeholder "cached"
        again.get(timeout=WAIT_S)
    assert recorder.count("deep") == 2


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
