"""The CLI's per-call tally: each call counted once, whatever order rows finish in."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from actors.job.tally import CallTally

A, B = "ab" * 32, "cd" * 32


def _result(key, execution):
    return SimpleNamespace(receipt_key=key, execution=execution)


@pytest.mark.parametrize(
    "order", list(itertools.permutations([(A, "live"), (A, "cached"), (A, "cached"), (B, "cached")]))
)
def test_tally_cached_answer_seen_before_its_live_one_is_this_runs(order):
    tally = CallTally([])

    for key, execution in order:
        tally.record("lookup", _result(key, execution))

    assert tally.snapshot()["lookup"] == {
        "calls": 4, "ran": 1, "joined": 0, "reused_this_run": 2, "reused": 1, "reused_receipts": 1,
        "failed": 0, "input_refused": 0, "cancelled": 0, "salvaged": 0,
    }  # fmt: skip


def test_tally_local_tools_are_counted_apart():
    tally = CallTally([SimpleNamespace(tool_id="tidy", durable=False), SimpleNamespace(tool_id="lookup")])

    tally.record("tidy", _result(A, "live"))
    tally.record("lookup", _result(B, "live"))
    tally.record_error("lookup")

    assert tally.totals()["calls"] == 2 and tally.totals()["failed"] == 1
    assert tally.totals(local=True)["calls"] == 1
