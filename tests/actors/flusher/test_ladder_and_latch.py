"""State-machine tests of the completion flusher's pieces: the retry ladder and the latch."""

from __future__ import annotations

import threading

import pytest

from actors.flusher.actor import Latch, ladder_backoff

LADDER = (1.0, 3.0, 9.0)
HEADROOM_S = 10.0


def _backoff(
    failures: int, *, now: float = 0.0, deadline: float | None = None, tripped: bool = False
) -> float | None:
    return ladder_backoff(failures, LADDER, now, deadline, HEADROOM_S, tripped)


@pytest.mark.parametrize(("failures", "expected"), [(1, 1.0), (2, 3.0), (3, 9.0), (4, None), (10, None)])
def test_ladder_backoff_climbs_then_gives_up(failures: int, expected: float | None) -> None:
    assert _backoff(failures) == expected


def test_ladder_backoff_far_deadline_follows_the_ladder() -> None:
    assert [_backoff(n, now=100.0, deadline=10_000.0) for n in (1, 2, 3, 4)] == [1.0, 3.0, 9.0, None]


@pytest.mark.parametrize(
    ("failures", "left_s", "expected"),
    [
        pytest.param(1, 11.0, 1.0, id="exactly-backoff-plus-headroom"),
        pytest.param(1, 10.99, None, id="just-short-for-1s"),
        pytest.param(2, 13.0, 3.0, id="enough-for-3s"),
        pytest.param(2, 12.9, None, id="short-for-3s"),
        pytest.param(3, 18.9, None, id="short-for-9s"),
        pytest.param(3, 19.0, 9.0, id="enough-for-9s"),
        pytest.param(1, -5.0, None, id="deadline-passed"),
    ],
)
def test_ladder_backoff_gives_up_when_the_deadline_is_near(
    failures: int, left_s: float, expected: float | None
) -> None:
    now = 500.0
    assert _backoff(failures, now=now, deadline=now + left_s) == expected


def test_ladder_backoff_tripped_latch_gives_up_at_once() -> None:
    assert _backoff(1, tripped=True) is None
    assert _backoff(1, deadline=1e9, tripped=True) is None


def test_ladder_backoff_custom_ladder() -> None:
    assert ladder_backoff(2, (0.1, 0.2), 0.0, None, 0.0, False) == 0.2
    assert ladder_backoff(3, (0.1, 0.2), 0.0, None, 0.0, False) is None
    assert ladder_backoff(1, (), 0.0, None, 0.0, False) is None


def test_latch_trips_once_and_keeps_the_first_reason() -> None:
    latch = Latch()
    assert not latch.tripped and latch.reason == ""
    latch.trip("disk full")
    latch.trip("database locked")
    assert latch.tripped
    assert latch.reason == "disk full"


def test_latch_concurrent_trips_keep_exactly_one_reason() -> None:
    latch = Latch()
    start = threading.Barrier(8)

    def trip(i: int) -> None:
        start.wait(timeout=10)
        latch.trip(f"reason-{i}")

    threads = [threading.Thread(target=trip, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert latch.tripped
    assert latch.reason in {f"reason-{i}" for i in range(8)}
