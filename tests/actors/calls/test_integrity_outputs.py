"""Issue 9, part 2 (and the memo of 1b), through running systems on real SQLite files:
what a provider answered is kept exactly, what is not JSON is refused for its call alone,
an oversized answer reaches its caller and is salvaged, a failed refresh keeps the old
value, and the memo stays within its byte bound with 1 MiB outputs. Both runtimes."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path
from typing import Any

import pytest

from actors import (
    InvalidOutputError,
    Policy,
    ProviderError,
    RecordedFailureError,
    Tool,
)
from actors.flusher.salvage import SalvageLog
from stores import MAX_OUTPUT_BYTES, FailureKind, ReceiptStatus

WAIT_S = 15.0
MIB = 1024 * 1024


@pytest.mark.parametrize(
    "answer",
    [{"snippet": "caf\ud83d"}, {"n": 2**70}],
    ids=["lone_surrogate", "int_beyond_64_bits"],
)
def test_outputs_json_answer_is_live_then_cached_exactly_by_the_next_run(
    make_system: Any, recorder: Any, answer: dict[str, Any]
) -> None:
    def search(i: Any, c: Any) -> Any:
        recorder.record("search", i, c)
        return answer

    tool = Tool(tool_id="search", fn=search)
    live = make_system([tool]).proxy().execute("search", {"q": "cafe"}).get(timeout=WAIT_S)
    assert (live.execution, live.value) == ("live", answer)
    nxt = make_system([tool], run_id="r2").proxy().execute("search", {"q": "cafe"}).get(timeout=WAIT_S)
    assert (nxt.execution, nxt.value) == ("cached", answer)  # not a RecordedFailureError
    assert [type(v) for v in nxt.value.values()] == [type(v) for v in answer.values()]
    assert recorder.count("search") == 1  # paid once


@pytest.mark.parametrize(
    "output",
    [{"tags": {1, 2}}, {"raw": b"\x00\x01"}, {"at": datetime.datetime(2026, 11, 30, 12, 0)}, {1: "a"}],
    ids=["set", "bytes", "datetime", "int_keys"],
)
def test_outputs_not_json_fail_their_call_alone_and_never_answer_two_values(
    make_system: Any, read_receipts: Any, key_of: Any, recorder: Any, db_path: Path, output: Any
) -> None:
    def fn(i: Any, c: Any) -> Any:
        recorder.record("fn", i, c)
        return output if i["bad"] else {"ok": i["n"]}

    tool = Tool(tool_id="t", fn=fn)
    system = make_system([tool])
    bad = system.proxy().execute("t", {"n": 1, "bad": True})
    good = system.proxy().execute("t", {"n": 2, "bad": False})
    with pytest.raises(InvalidOutputError, match="would come back as a different value"):
        bad.get(timeout=WAIT_S)
    assert good.get(timeout=WAIT_S).value == {"ok": 2}  # unaffected
    key = key_of(tool, {"n": 1, "bad": True})
    (entry,) = [e for e in SalvageLog(f"{db_path}.salvage.jsonl").entries() if e.receipt_key == key]
    assert entry.output_form == "described"  # the paid answer is kept for an operator
    (receipt,) = read_receipts([key])
    # what the receipt holds after the refusal: a permanent failure, no output
    assert receipt is not None and receipt.status is ReceiptStatus.FAILED
    assert receipt.failure_kind is FailureKind.PERMANENT and receipt.output is None
    for system_ in (system, make_system([tool], run_id="r2")):  # never a (converted) value
        with pytest.raises(RecordedFailureError):
            system_.proxy().execute("t", {"n": 1, "bad": True}).get(timeout=WAIT_S)
    assert recorder.count("fn") == 2


def test_outputs_over_the_cap_reach_the_caller_are_salvaged_and_the_receipt_says_why(
    make_system: Any, read_receipts: Any, key_of: Any, db_path: Path
) -> None:
    blob = "x" * (MAX_OUTPUT_BYTES + MIB)  # 33 MiB against the 32 MiB cap
    salvage_path = db_path.parent / "salvage.jsonl"
    tool = Tool(tool_id="h", fn=lambda i, c: {"blob": blob})
    system = make_system([tool], policy=Policy(batch_grace_s=0.05, salvage_path=str(salvage_path)))
    result = system.proxy().execute("h", {"n": 1}).get(timeout=WAIT_S * 2)
    assert result.execution == "live" and result.value["blob"] == blob  # the caller gets it
    system.stop(timeout_s=WAIT_S)  # the caller is answered first; the failure is written after
    key = key_of(tool, {"n": 1})
    (receipt,) = read_receipts([key])
    assert receipt is not None and receipt.status is ReceiptStatus.FAILED and receipt.output is None
    assert receipt.failure_kind is FailureKind.OUTPUT_TOO_LARGE
    assert str(salvage_path) in (receipt.error or "")  # says why, and where the answer went
    (entry,) = [e for e in SalvageLog(salvage_path).entries() if e.receipt_key == key]
    assert entry.output_form == "json" and entry.output == {"blob": blob}  # salvaged exactly


@pytest.mark.parametrize("failure", ["provider_error", "raises", "transient"])
def test_outputs_a_failed_refresh_keeps_the_old_value_for_the_next_call(
    make_system: Any, read_receipts: Any, key_of: Any, recorder: Any, failure: str
) -> None:
    def fn(i: Any, c: Any) -> Any:
        recorder.record("fn", i, c)
        run = recorder.count("fn")
        if run == 2:  # the refresh
            if failure == "raises":
                raise RuntimeError("the tool broke")
            kind = FailureKind.TRANSIENT if failure == "transient" else FailureKind.PERMANENT
            raise ProviderError("the provider failed", failure_kind=kind)
        return {"run": run}

    tool = Tool(tool_id="t", fn=fn)
    system = make_system([tool])
    assert system.proxy().execute("t", {"k": 1}).get(timeout=WAIT_S).value == {"run": 1}
    with pytest.raises((ProviderError, RuntimeError)):
        system.proxy().execute("t", {"k": 1}, force_refresh=True).get(timeout=WAIT_S)
    (receipt,) = read_receipts([key_of(tool, {"k": 1})])
    assert receipt is not None and receipt.status is ReceiptStatus.COMPLETED
    assert receipt.output == {"run": 1}
    for system_ in (system, make_system([tool], run_id="r2")):  # its memo, then the store alone
        again = system_.proxy().execute("t", {"k": 1}).get(timeout=WAIT_S)
        assert (again.execution, again.value) == ("cached", {"run": 1})
    assert recorder.count("fn") == 2


@pytest.mark.parametrize("char", ["x", "\U0001f600"], ids=["ascii", "emoji"])
def test_outputs_memo_stays_within_its_bytes_with_1_mib_outputs(
    make_system: Any, recorder: Any, char: str
) -> None:
    blob = char * (MIB // len(char.encode("utf-8")))  # 1 MiB of text (an emoji: 4 bytes each)

    def fn(i: Any, c: Any) -> Any:
        recorder.record("fn", i, c)
        return {"n": i["n"], "blob": blob}

    tool = Tool(tool_id="t", fn=fn)
    bound = 3 * MIB + 4096  # room for three 1 MiB outputs
    system = make_system([tool], policy=Policy(batch_grace_s=0.05, memo_max_bytes=bound))
    memo = system.memos["t"]
    for wave in range(3):  # 12 outputs of 1 MiB, four at once
        futures = [system.proxy().execute("t", {"n": n}) for n in range(wave * 4, wave * 4 + 4)]
        for f in futures:
            assert f.get(timeout=WAIT_S).execution == "live"
        texts = [entry[1] for entry in list(memo.entries.values())]
        assert sum(sys.getsizeof(text) for text in texts) <= bound + 1024  # the memory they take
        assert 1 <= len(texts) <= 3 and memo.bytes <= bound
    newest = system.proxy().execute("t", {"n": 11}).get(timeout=WAIT_S)
    oldest = system.proxy().execute("t", {"n": 0}).get(timeout=WAIT_S)  # dropped: from the store
    assert (newest.execution, oldest.execution) == ("cached", "cached")
    assert oldest.value == {"n": 0, "blob": blob}
    assert recorder.count("fn") == 12
    assert memo.bytes <= bound


def test_outputs_memo_refuses_outputs_larger_than_its_bound(make_system: Any) -> None:
    tool = Tool(tool_id="t", fn=lambda i, c: {"blob": "x" * MIB})
    system = make_system([tool], policy=Policy(batch_grace_s=0.05, memo_max_bytes=MIB // 2))
    for n in range(3):
        assert system.proxy().execute("t", {"n": n}).get(timeout=WAIT_S).execution == "live"
    assert system.memos["t"].entries == {} and system.memos["t"].bytes == 0
    assert system.proxy().execute("t", {"n": 0}).get(timeout=WAIT_S).execution == "cached"  # the store
