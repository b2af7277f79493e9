"""A receipt whose stored output cannot be read back fails that call alone (the output
text changed behind the store's back, as a hand edit with ``sqlite-utils`` would): the
other calls of the same ``execute_many`` are answered from their receipts, nothing is
paid again, and a forced refresh replaces it. Before, one such row failed every call of
the bulk claim with a raw ``JSONDecodeError``."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from actors import Policy, Tool, ToolDispatchError
from stores import UnreadableOutput, UnreadableOutputError

from ..conftest import ORG, WAIT_S
from ..lifecycle.conftest import Driver, run_to_running, value_of


def _outcomes(futures: list[Any]) -> list[Any]:
    out = []
    for future in futures:
        try:
            out.append(future.get(timeout=WAIT_S))
        except Exception as exc:
            out.append(exc)
    return out


@pytest.mark.parametrize("calls", [5, 40], ids=["claimed", "read-first"])  # a cold rerun reads 32+ first
def test_unreadable_receipt_fails_its_own_call_alone(
    make_system: Any, recorder: Any, db_path: Path, key_of: Any, calls: int
) -> None:
    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("t", input, ctx)
        return {"v": input["i"]}

    tool = Tool(tool_id="t", fn=fn)
    inputs = [{"i": i} for i in range(calls)]
    first = make_system([tool], run_id="r1", policy=Policy(batch_grace_s=0.01))
    assert {r.execution for r in _outcomes(first.proxy().execute_many("t", inputs))} == {"live"}
    first.stop()
    bad = key_of(tool, {"i": 3})
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE receipts SET output = ? WHERE org_id = ? AND key = ?", ("{'v': 3}", ORG, bad))

    again = make_system([tool], run_id="r2", policy=Policy(batch_grace_s=0.01))
    outcomes = _outcomes(again.proxy().execute_many("t", inputs))
    assert recorder.count() == calls  # nothing paid again
    error = outcomes[3]
    assert isinstance(error, UnreadableOutputError) and isinstance(error, ToolDispatchError), error
    assert bad in str(error) and "force_refresh" in str(error)
    others = [o for i, o in enumerate(outcomes) if i != 3]
    assert [(o.execution, o.value) for o in others] == [("cached", {"v": i}) for i in range(calls) if i != 3]

    refreshed = again.proxy().execute("t", {"i": 3}, force_refresh=True).get(timeout=WAIT_S)
    assert (refreshed.execution, refreshed.value) == ("live", {"v": 3})
    assert again.proxy().execute("t", {"i": 3}).get(timeout=WAIT_S).value == {"v": 3}
    assert recorder.count() == calls + 1


def test_unreadable_output_of_the_run_that_completed_it_first_answers_ours_and_keeps_it() -> None:
    """Our completion met a receipt another run completed, with an output nobody can read:
    the caller gets what we paid for, which is kept in the salvage file."""
    from actors.flusher.actor import FlushOutcome

    d = Driver()
    (call,) = run_to_running(d, "a")
    d.finish({"ours": 1})
    d.persisted(a=FlushOutcome("completed_by_other", UnreadableOutput("{bad", "JSONDecodeError")))
    result = d.outcome(call)
    assert (value_of(result), result.execution) == ({"ours": 1}, "live")
    assert [k for k, _ in d.fx.salvaged] == ["a"]
    d.assert_nothing_held()


def test_unknown_status_fails_its_own_call_alone_and_is_never_run_again(
    make_system: Any, recorder: Any, db_path: Path, key_of: Any
) -> None:
    from actors import UncertainOutcomeError

    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("t", input, ctx)
        return {"v": input["i"]}

    tool = Tool(tool_id="t", fn=fn)
    inputs = [{"i": i} for i in range(5)]
    first = make_system([tool], run_id="r1", policy=Policy(batch_grace_s=0.01))
    _outcomes(first.proxy().execute_many("t", inputs))
    first.stop()
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE receipts SET status = 'done' WHERE key = ?", (key_of(tool, {"i": 2}),))

    again = make_system([tool], run_id="r2", policy=Policy(batch_grace_s=0.01))
    for force in (False, True):
        outcomes = _outcomes(again.proxy().execute_many("t", inputs, force_refresh=force))
        assert isinstance(outcomes[2], UncertainOutcomeError) and "'done'" in str(outcomes[2]), outcomes[2]
        assert all(not isinstance(o, Exception) for i, o in enumerate(outcomes) if i != 2), outcomes
    assert [c.input for c in recorder.calls].count({"i": 2}) == 1  # never paid again


EDITS = {
    "lease-expires-text": (
        "UPDATE receipts SET status = 'running', lease_expires_at = '2026-12-02 10:00' "
        "WHERE org_id = ? AND key = ?",
        {},
    ),
    "attempts-text": (
        "UPDATE receipts SET status = 'pending', output = NULL, completed_at = NULL, "
        "attempts = 'two' WHERE org_id = ? AND key = ?",
        {},
    ),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_column_it_cannot_read_fails_its_own_call_alone(
    make_system: Any, recorder: Any, db_path: Path, key_of: Any, edit: str
) -> None:
    sql, kw = EDITS[edit]

    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("t", input, ctx)
        return {"v": input["i"]}

    tool = Tool(tool_id="t", fn=fn)
    inputs = [{"i": i} for i in range(5)]
    first = make_system([tool], run_id="r1", policy=Policy(batch_grace_s=0.01))
    assert {r.execution for r in _outcomes(first.proxy().execute_many("t", inputs, **kw))} == {"live"}
    first.stop()
    with sqlite3.connect(db_path) as conn:
        conn.execute(sql, (ORG, key_of(tool, {"i": 3})))

    again = make_system([tool], run_id="r2", policy=Policy(batch_grace_s=0.01))
    outcomes = _outcomes(again.proxy().execute_many("t", inputs, **kw))
    fresh = _outcomes([again.proxy().execute("t", {"i": 99}, **kw)])[0]
    others = [o for i, o in enumerate(outcomes) if i != 3]
    seen = [
        f"{type(o).__name__}: {str(o)[:60]}" if isinstance(o, Exception) else o.execution for o in outcomes
    ]
    assert all(not isinstance(o, Exception) for o in others), (
        f"one hand-edited row ({edit}) failed the other calls of the claim: {seen}"
    )
    assert not isinstance(fresh, Exception), fresh
