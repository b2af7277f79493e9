"""State-machine tests of the pacing pieces: Retry-After parsing and the provider bucket.

Time is passed in as values; nothing sleeps and no thread runs.
"""

from __future__ import annotations

import email.utils
import math

import pytest

from actors._pacing import AIMD_DECREASE, AIMD_MIN_RPS, OBSERVE_WINDOW_S, ProviderBucket, parse_retry_after

NOW = 1_700_000_000.0  # epoch seconds, so HTTP-dates are realistic
DEFAULT_S, MAX_S, MIN_S = 5.0, 300.0, 0.05


def _parse(value: object, now: float = NOW) -> float:
    return parse_retry_after(value, now, default_s=DEFAULT_S, max_s=MAX_S, min_s=MIN_S)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("120", 120.0, id="delay-seconds"),
        pytest.param(" 120 ", 120.0, id="delay-seconds-padded"),
        pytest.param("1.5", 1.5, id="decimal"),
        pytest.param("0", MIN_S, id="zero-is-minimum"),
        pytest.param("-3", DEFAULT_S, id="negative-is-garbage"),
        pytest.param("abc", DEFAULT_S, id="garbage"),
        pytest.param("nan", DEFAULT_S, id="nan-is-garbage"),
        pytest.param("9999999999", MAX_S, id="capped"),
        pytest.param(None, DEFAULT_S, id="missing"),
        pytest.param("", DEFAULT_S, id="empty"),
        pytest.param(120, 120.0, id="number"),
        pytest.param(-1, DEFAULT_S, id="negative-number"),
    ],
)
def test_parse_retry_after_table(value: object, expected: float) -> None:
    assert _parse(value) == pytest.approx(expected)


def test_parse_retry_after_http_date_ahead() -> None:
    header = email.utils.formatdate(NOW + 120, usegmt=True)
    assert _parse(header) == pytest.approx(120.0, abs=1.0)


def test_parse_retry_after_http_date_in_the_past_is_minimum() -> None:
    header = email.utils.formatdate(NOW - 3600, usegmt=True)
    assert _parse(header) == MIN_S


def test_parse_retry_after_http_date_far_ahead_is_capped() -> None:
    header = email.utils.formatdate(NOW + 86_400, usegmt=True)
    assert _parse(header) == MAX_S


def test_parse_retry_after_default_never_exceeds_cap() -> None:
    assert parse_retry_after("abc", NOW, default_s=900.0, max_s=MAX_S, min_s=MIN_S) == MAX_S


# -- token bucket ---------------------------------------------------------------------


def test_bucket_refills_at_rate_and_caps_at_burst() -> None:
    bucket = ProviderBucket(ceiling_rps=10.0, burst=5.0, max_concurrency=None)
    assert bucket.available(100.0) == 5
    bucket.take(5, 100.0)
    assert bucket.available(100.0) == 0
    assert bucket.available(100.25) == 2  # 0.25 s * 10 rps
    assert bucket.available(100.5) == 5
    assert bucket.available(1000.0) == 5  # never past the burst
    assert bucket.tokens == 5.0


def test_bucket_ready_at_says_when_the_next_token_arrives() -> None:
    bucket = ProviderBucket(ceiling_rps=2.0, burst=1.0, max_concurrency=None)
    assert bucket.available(10.0) == 1
    bucket.take(1, 10.0)
    assert bucket.available(10.0) == 0
    assert bucket.ready_at(10.0) == pytest.approx(10.5)


def test_bucket_max_concurrency_caps_available() -> None:
    bucket = ProviderBucket(ceiling_rps=None, burst=None, max_concurrency=3)
    assert bucket.available(0.0) == 3
    bucket.take(2, 0.0)
    assert bucket.available(0.0) == 1
    bucket.take(1, 0.0)
    assert bucket.available(0.0) == 0
    assert bucket.ready_at(0.0) is None  # only a release can help
    bucket.in_flight -= 1
    assert bucket.available(0.0) == 1


def test_bucket_unknown_rate_is_not_paced() -> None:
    bucket = ProviderBucket(ceiling_rps=None, burst=None, max_concurrency=None)
    bucket.take(1000, 0.0)
    assert bucket.available(0.0) >= 1_000_000
    assert bucket.ready_at(0.0) == 0.0


def test_bucket_backpressure_closes_gate_and_cuts_rate() -> None:
    bucket = ProviderBucket(ceiling_rps=10.0, burst=5.0, max_concurrency=None)
    bucket.on_backpressure(pause_s=30.0, jitter_s=0.5, now=100.0)
    assert bucket.gate_until == pytest.approx(130.5)
    assert bucket.rate == pytest.approx(10.0 * AIMD_DECREASE)
    assert bucket.backpressure_events == 1
    assert bucket.available(100.0) == 0
    assert bucket.available(130.0) == 0  # still closed
    assert bucket.ready_at(120.0) == pytest.approx(130.5)


def test_bucket_tokens_restart_at_zero_after_the_gate() -> None:
    bucket = ProviderBucket(ceiling_rps=4.0, burst=10.0, max_concurrency=None)
    bucket.on_backpressure(pause_s=10.0, jitter_s=0.0, now=0.0)
    rate = 4.0 * AIMD_DECREASE
    assert bucket.available(10.0) == 0  # gate open, but no burst is waiting
    assert bucket.ready_at(10.0) == pytest.approx(10.0 + 1 / rate)
    assert bucket.available(10.0 + 1 / rate) == 1
    assert bucket.available(11.0) == math.floor(rate)  # spread by the rate, not the whole burst of 10


def test_bucket_repeated_backpressure_cuts_again_never_below_minimum() -> None:
    bucket = ProviderBucket(ceiling_rps=1.0, burst=1.0, max_concurrency=None)
    for i in range(50):
        bucket.on_backpressure(pause_s=1.0, jitter_s=0.0, now=10.0 * i)  # separate events
    assert bucket.rate == AIMD_MIN_RPS
    assert bucket.backpressure_events == 50


def test_bucket_backpressure_never_shortens_an_open_gate() -> None:
    bucket = ProviderBucket(ceiling_rps=10.0, burst=1.0, max_concurrency=None)
    bucket.on_backpressure(pause_s=60.0, jitter_s=0.0, now=0.0)
    bucket.on_backpressure(pause_s=1.0, jitter_s=0.0, now=5.0)
    assert bucket.gate_until == 60.0


def test_bucket_success_adds_rate_back_gradually_up_to_the_ceiling() -> None:
    bucket = ProviderBucket(ceiling_rps=10.0, burst=1.0, max_concurrency=None)
    bucket.on_backpressure(pause_s=1.0, jitter_s=0.0, now=0.0)
    cut = bucket.rate
    assert cut == pytest.approx(10.0 * AIMD_DECREASE)
    bucket.on_success(2.0)
    assert cut < bucket.rate < cut + 0.1  # gradual: one success is a small step
    previous = bucket.rate
    for _ in range(10):
        bucket.on_success(2.0)
        assert bucket.rate >= previous
        previous = bucket.rate
    assert bucket.rate < 10.0
    for _ in range(10_000):
        bucket.on_success(3.0)
    assert bucket.rate == 10.0  # reaches the ceiling, never exceeds it


def test_bucket_success_at_the_ceiling_stays_at_the_ceiling() -> None:
    bucket = ProviderBucket(ceiling_rps=10.0, burst=1.0, max_concurrency=None)
    bucket.on_success(0.0)
    assert bucket.rate == 10.0


def test_bucket_unknown_rate_backpressure_learns_from_observed_admissions() -> None:
    bucket = ProviderBucket(ceiling_rps=None, burst=None, max_concurrency=None)
    for i in range(20):
        bucket.take(1, 100.0 + i * 0.1)  # 20 admissions within the observe window
    now = 100.0 + 1.9
    observed = bucket.observed_rps(now)
    assert observed == pytest.approx(20 / OBSERVE_WINDOW_S)
    bucket.on_backpressure(pause_s=5.0, jitter_s=0.0, now=now)
    assert bucket.rate == pytest.approx(observed * AIMD_DECREASE)
    assert bucket.available(now + 5.0) == 0
    assert bucket.available(now + 5.0 + 1 / bucket.rate) == 1  # paced now


def test_bucket_observed_rps_forgets_old_admissions() -> None:
    bucket = ProviderBucket(ceiling_rps=None, burst=None, max_concurrency=None)
    bucket.take(10, 0.0)
    assert bucket.observed_rps(1.0) == pytest.approx(10 / OBSERVE_WINDOW_S)
    assert bucket.observed_rps(OBSERVE_WINDOW_S + 1.0) == 0.0


def test_bucket_wake_time_always_yields_a_token() -> None:
    # Regression: a refill landing at 0.99999999999994 tokens gave available() == 0 and a
    # ready_at() that rounded to ``now``, so the governor armed no wake-up (lost waiter).
    bucket = ProviderBucket(ceiling_rps=10.0, burst=10.0, max_concurrency=None)
    bucket.on_backpressure(pause_s=30.0, jitter_s=0.0, now=100.0)
    now = 130.0
    for _ in range(50):
        assert bucket.available(now) == 0
        ready = bucket.ready_at(now)
        assert ready is not None and ready > now
        now = ready
        if bucket.available(now) >= 1:
            break
    else:
        pytest.fail("ready_at never led to a token")
    assert now == pytest.approx(130.0 + 1 / bucket.rate)


def test_bucket_ready_at_is_strictly_ahead_for_a_tiny_deficit() -> None:
    bucket = ProviderBucket(ceiling_rps=1000.0, burst=1.0, max_concurrency=None)
    now = 10_000_000.0  # a monotonic clock after months of uptime: coarse floats
    bucket.refill(now)
    bucket.take(1, now)
    bucket.tokens = 1.0 - 1e-8
    ready = bucket.ready_at(now)
    assert ready is not None and ready > now
    assert bucket.available(ready) == 1


def test_bucket_429s_of_one_congestion_event_cut_the_rate_once() -> None:
    from actors._pacing import AIMD_CUT_COOLDOWN_S

    bucket = ProviderBucket(ceiling_rps=10.0, burst=1.0, max_concurrency=None)
    bucket.on_backpressure(pause_s=0.1, jitter_s=0.0, now=0.0)
    bucket.on_backpressure(pause_s=0.1, jitter_s=0.0, now=AIMD_CUT_COOLDOWN_S / 2)  # in flight at the first
    assert bucket.rate == pytest.approx(10.0 * AIMD_DECREASE)
    assert bucket.backpressure_events == 2
    bucket.on_backpressure(pause_s=0.1, jitter_s=0.0, now=AIMD_CUT_COOLDOWN_S * 2)  # a new event
    assert bucket.rate == pytest.approx(10.0 * AIMD_DECREASE**2)
    assert bucket.reference_rps == pytest.approx(10.0 * AIMD_DECREASE)


def test_send_gate_spaces_sends_at_the_stated_rate() -> None:
    from actors._pacing import SendGate

    gate = SendGate()
    waits = [gate.turn_in(10.0, now=100.0) for _ in range(4)]  # four sends admitted at once
    assert waits == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert gate.turn_in(10.0, now=101.0) == 0.0  # idle long enough: no wait
