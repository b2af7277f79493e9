"""The input cap at the host API: ``execute``, ``execute_many`` and a tool's nested call
refuse an input over ``MAX_INPUT_BYTES`` for that call alone, before anything is claimed
or sent; the other calls go on. Error texts kept or raised quote inputs shortened.

Real systems on SQLite files (both runtimes); the provider is a recorded tool function.
"""

from __future__ import annotations

import datetime
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import rfc8785

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


def sized(n: int, target_bytes: int, filler: float) -> dict[str, Any]:
    """``{"n": n, "trace": [filler * 1000, "xx…"]}`` whose RFC 8785 text (measured by the
    ``rfc8785`` package itself) is ``target_bytes`` long; orjson's text of it is longer
    (``1.0``: ``1.0``, canonical ``1``) or shorter (``1e20``: ``1e+20``)."""
    value: dict[str, Any] = {"n": n, "trace": [filler] * 1000 + [""]}
    value["trace"][-1] = "x" * (target_bytes - len(rfc8785.dumps(value)))
    return value


@pytest.mark.parametrize("filler", [1.0, 1e20], ids=["orjson-longer", "orjson-shorter"])
@pytest.mark.parametrize("path", ["execute", "execute_many"])
def test_input_cap_holds_the_whole_input_by_its_canonical_text_non_semantic_fields_too(
    make_system: Any, recorder: Any, db_path: Path, path: str, filler: float
) -> None:
    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("echo", input, ctx)
        return {"n": input["n"], "trace_items": len(input["trace"])}

    system = make_system([Tool(tool_id="echo", fn=fn, non_semantic_fields=("trace",))])
    proxy = system.proxy()
    at, over = sized(1, MAX_INPUT_BYTES, filler), sized(2, MAX_INPUT_BYTES + 1, filler)

    if path == "execute":
        results = [outcome(proxy.execute("echo", at)), outcome(proxy.execute("echo", over))]
    else:
        results = [outcome(f) for f in proxy.execute_many("echo", [at, over])]

    assert not isinstance(results[0], Exception), results[0]
    assert results[0].value == {"n": 1, "trace_items": 1001}  # at the cap: sent, whole
    assert isinstance(results[1], InputTooLargeError) and results[1].size_bytes == MAX_INPUT_BYTES + 1
    assert [call.input["n"] for call in recorder.calls] == [1]  # one byte over: never sent
    assert receipts_in(db_path) == 1


def test_non_semantic_field_that_is_not_json_fails_its_call_alone_and_is_never_sent(
    make_system: Any, recorder: Any, db_path: Path
) -> None:
    system = make_system([echo_tool(recorder, non_semantic_fields=("trace",))])
    proxy = system.proxy()
    odd = [
        b"\0" * (MAX_INPUT_BYTES + 1),  # over the cap, and not JSON: it used to measure 0 bytes
        datetime.datetime(2026, 1, 15, tzinfo=datetime.timezone.utc),  # orjson would send a string
        {1, 2},
        float("nan"),
    ]

    many = [outcome(f) for f in proxy.execute_many("echo", [{"n": i, "trace": v} for i, v in enumerate(odd)])]
    single = outcome(proxy.execute("echo", {"n": 9, "trace": odd[0]}))
    fine = outcome(proxy.execute("echo", {"n": 10, "trace": "t-1"}))

    for refused in [*many, single]:
        assert type(refused) is InvalidInputError, refused
        assert "'trace'" in str(refused) and len(str(refused)) < 600
    assert fine.value == {"n": 10}
    assert [call.input for call in recorder.calls] == [{"n": 10, "trace": "t-1"}]
    assert receipts_in(db_path) == 1
