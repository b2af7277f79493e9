"""The input cap at the host API: ``execute``, ``execute_many`` and a tool's nested call
refuse an input over ``MAX_INPUT_BYTES`` for that call alone, before anything is claimed
or sent; the other calls go on. Error texts kept or raised quote inputs shortened.

Real systems on SQLite files (both runtimes); the provider is a recorded tool function.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from actors import (
    BatchStrategy,
    InputTooLargeError,
    InvalidInputError,
    ProviderError,
    RecordedFailureError,
    Tool,
    UnknownToolError,
)
from stores import MAX_ERROR_CHARS, MAX_INPUT_BYTES, FailureKind

WAIT_S = 10.0

OVER_CAP = "x" * (MAX_INPUT_BYTES - 1)
"""A string whose JSON text (with its quotes) is one byte over the cap."""


def outcome(future: Any) -> Any:
    try:
        return future.get(timeout=WAIT_S)
    except Exception as exc:
        return exc


def receipts_in(db_path: Path) -> int:
    with sqlite3.connect(db_path) as conn:
        (count,) = conn.execute("select count(*) from receipts").fetchone()
    return int(count)


def echo_tool(recorder: Any, **kwargs: Any) -> Tool:
    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("echo", input, ctx)
        return {"n": input["n"]}

    return Tool(tool_id="echo", fn=fn, **kwargs)


def test_execute_input_over_the_cap_fails_alone_before_anything_is_claimed_or_sent(
    make_system: Any, recorder: Any, db_path: Path
) -> None:
    system = make_system([echo_tool(recorder)])
    proxy = system.proxy()

    refused = outcome(proxy.execute("echo", {"n": 1, "note": OVER_CAP}))
    after = outcome(proxy.execute("echo", {"n": 2}))

    assert isinstance(refused, InputTooLargeError) and isinstance(refused, InvalidInputError)
    assert refused.size_bytes > MAX_INPUT_BYTES
    assert len(str(refused)) < 200  # the sizes, not the input
    assert after.value == {"n": 2}
    assert [call.input["n"] for call in recorder.calls] == [2]  # the large one was never sent
    assert receipts_in(db_path) == 1  # nor claimed
    assert system.stats()["errors"] == 1


def test_execute_many_input_over_the_cap_fails_alone_and_the_others_travel_in_one_batch(
    make_system: Any, recorder: Any, db_path: Path
) -> None:
    def batch_fn(payload: Any, ctx: Any) -> Any:
        recorder.record("batch", payload, ctx)
        return [{"n": item["n"]} for item in payload]

    def single(input: Any, ctx: Any) -> Any:
        recorder.record("single", input, ctx)
        return {"n": input["n"]}

    tool = Tool(tool_id="echo", fn=single, batch=BatchStrategy(batch_fn=batch_fn, max_batch_size=10))
    system = make_system([tool])

    futures = system.proxy().execute_many("echo", [{"n": 1}, {"n": 2, "note": OVER_CAP}, {"n": 3}])
    results = [outcome(f) for f in futures]

    assert results[0].value == {"n": 1} and results[2].value == {"n": 3}
    assert isinstance(results[1], InputTooLargeError)
    assert [sorted(item["n"] for item in call.input) for call in recorder.of("batch")] == [[1, 3]]
    assert recorder.count("single") == 0
    assert receipts_in(db_path) == 2


def test_input_cap_counts_non_semantic_fields_at_the_front_door(
    make_system: Any, recorder: Any, db_path: Path
) -> None:
    system = make_system([echo_tool(recorder, non_semantic_fields=("trace",))])

    refused = outcome(system.proxy().execute("echo", {"n": 1, "trace": OVER_CAP}))

    assert isinstance(refused, InputTooLargeError)
    assert recorder.count() == 0 and receipts_in(db_path) == 0


def test_nested_call_over_the_cap_fails_inside_the_tool_that_made_it(
    make_system: Any, recorder: Any, db_path: Path
) -> None:
    proxies: list[Any] = []

    def outer(input: Any, ctx: Any) -> Any:
        recorder.record("outer", input, ctx)
        child = outcome(proxies[0].execute("echo", {"n": input["n"], "note": OVER_CAP}))
        return {"child": type(child).__name__}

    system = make_system([echo_tool(recorder), Tool(tool_id="outer", fn=outer)])
    proxies.append(system.proxy())

    result = outcome(system.proxy().execute("outer", {"n": 1}))

    assert result.value == {"child": "InputTooLargeError"}
    assert recorder.count("echo") == 0
    assert receipts_in(db_path) == 1  # the outer call's


def test_error_texts_quote_what_the_caller_passed_shortened(make_system: Any, recorder: Any) -> None:
    system = make_system([echo_tool(recorder)])
    proxy = system.proxy()
    huge = "q" * 5_000_000

    unknown = outcome(proxy.execute(huge, {"n": 1}))
    bad_timeout = outcome(proxy.execute("echo", {"n": 1}, timeout_s=huge))  # type: ignore[arg-type]

    assert isinstance(unknown, UnknownToolError) and len(str(unknown)) < 500
    assert isinstance(bad_timeout, InvalidInputError) and len(str(bad_timeout)) < 500
    assert recorder.count() == 0


def test_a_failure_that_quotes_the_whole_input_is_recorded_shortened(
    make_system: Any, recorder: Any, read_receipts: Any, key_of: Any
) -> None:
    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("strict", input, ctx)
        raise ProviderError(f"not a domain name: {input['domain']!r}", failure_kind=FailureKind.PERMANENT)

    tool = Tool(tool_id="strict", fn=fn)
    system = make_system([tool])
    domain = "d" * 3_000_000 + " (end)"

    first = outcome(system.proxy().execute("strict", {"domain": domain}))
    again = outcome(make_system([tool], run_id="r2").proxy().execute("strict", {"domain": domain}))

    assert isinstance(first, ProviderError)  # the tool's own error reaches its caller as raised
    (receipt,) = read_receipts([key_of(tool, {"domain": domain})])
    assert receipt.error is not None and len(receipt.error) <= MAX_ERROR_CHARS + 30
    assert receipt.error.startswith("not a domain name: 'ddd") and receipt.error.endswith("(end)'")
    assert isinstance(again, RecordedFailureError) and len(str(again)) <= MAX_ERROR_CHARS + 200
    assert recorder.count() == 1


def test_execute_many_bad_input_and_large_input_fail_alone_together(
    make_system: Any, recorder: Any, db_path: Path
) -> None:
    system = make_system([echo_tool(recorder)])

    futures = system.proxy().execute_many("echo", [{"n": float("nan")}, {"n": 1}, OVER_CAP, {"n": 2}])
    results = [outcome(f) for f in futures]

    assert type(results[0]) is InvalidInputError and type(results[2]) is InputTooLargeError
    assert [r.value for r in (results[1], results[3])] == [{"n": 1}, {"n": 2}]
    assert receipts_in(db_path) == 2
