"""A memo keeps what each kept output's call cost (``Memo.cost_of``) exactly as long as it
keeps the output: replaced, dropped past its bytes, read ahead and expired, forgotten."""

from __future__ import annotations

from actors.queue.memo import AHEAD_TTL_S, Memo
from stores.money import Money

PAID = Money("0.002", "USD")


def test_a_kept_output_keeps_its_cost_and_a_newer_unpriced_one_drops_it() -> None:
    memo = Memo(max_bytes=10_000)
    memo.remember("k", '{"v":1}', 0.0, PAID)
    assert memo.recall("k", None, 0.0) == '{"v":1}' and memo.cost_of("k") == PAID
    memo.remember("k", '{"v":2}', 1.0)  # a refresh while the tool had no price
    assert memo.cost_of("k") is None


def test_an_output_dropped_past_the_bytes_takes_its_cost_along() -> None:
    memo = Memo(max_bytes=200)
    memo.remember("old", "x" * 90, 0.0, PAID)
    memo.remember("new", "y" * 90, 1.0, PAID)
    memo.remember("newer", "z" * 90, 2.0, PAID)  # past 200 bytes: "old" goes
    assert memo.recall("old", None, 3.0) is None and memo.cost_of("old") is None
    assert set(memo.costs) == set(memo.entries) == {"new", "newer"}


def test_an_output_read_ahead_keeps_its_cost_until_it_expires_or_is_forgotten() -> None:
    memo = Memo(max_bytes=10_000)
    memo.keep_ahead("a", "1", 0.0, PAID)
    memo.keep_ahead("b", "2", 0.0, PAID)
    assert memo.recall("a", None, 0.5) == "1" and memo.cost_of("a") == PAID
    memo.expire_ahead(AHEAD_TTL_S + 1.0)
    assert memo.cost_of("a") is None and memo.costs == {}
    memo.keep_ahead("c", "3", 10.0, PAID)
    memo.remember("d", "4", 10.0, PAID)
    memo.forget("c")
    assert memo.costs == {"d": PAID}
    memo.forget()  # a purge
    assert memo.costs == {}
