"""State-machine tests of the pacing pieces: Retry-After parsing and the provider bucket.

Time is passed in as values; nothing sleeps and no thread runs.
"""

from __future__ import annotations

import email.utils
import math
import time

import pytest

from actors.pacing.bucket import (
    AIMD_CUT_COOLDOWN_S,
    AIMD_DECREASE,
    AIMD_INCREASE_FRACTION,
    AIMD_MIN_RPS,
    IN_USE_FRACTION,
    PACE_MARGIN,
    SLOW_START_DOUBLING_S,
    SLOW_START_EXIT_DECREASE,
    SLOW_START_RPS,
    USE_WINDOW_S,
    ProviderBucket,
    parse_retry_after,
)
from actors.pacing.circuit import Circuit
from actors.pacing.send_gate import HEADROOM, WAKE_S, SendGate, SendGates

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


def _bucket(rps: float | None = None, burst: float | None = None, **kw: object) -> ProviderBucket:
    return ProviderBucket(ceiling_rps=rps, burst=burst, max_concurrency=None, **kw)  # type: ignore[arg-type]


def _use(bucket: ProviderBucket, now: float) -> None:
    """Admit calls at the bucket's rate for the 3 s before ``now`` (so successes may grow it)."""
    assert bucket.rate is not None
    n = math.ceil(3.0 * bucket.rate)
    for i in range(n + 1):
        bucket.take(1, now - 3.0 + i * 3.0 / n)
    bucket.in_flight = 0
    assert bucket.used_rps(now) >= bucket.rate


def test_a_stated_rate_is_paced_just_under_itself() -> None:
    bucket = _bucket(10.0, burst=5.0)
    assert bucket.rate == pytest.approx(10.0 * PACE_MARGIN)
    assert PACE_MARGIN >= 0.97  # the main job's target is >= 97% of a stated rate


def test_bucket_refills_at_rate_and_caps_at_burst() -> None:
    bucket = _bucket(10.0, burst=5.0)
    assert bucket.available(100.0) == 5
    bucket.take(5, 100.0)
    assert bucket.available(100.0) == 0
    assert bucket.available(100.25) == 2  # 0.25 s * 9.8 rps
    assert bucket.available(100.6) == 5
    assert bucket.available(1000.0) == 5  # never past the burst
    assert bucket.tokens == 5.0


def test_bucket_ready_at_says_when_the_next_token_arrives() -> None:
    bucket = _bucket(2.0, burst=1.0)
    assert bucket.available(10.0) == 1
    bucket.take(1, 10.0)
    assert bucket.available(10.0) == 0
    assert bucket.ready_at(10.0) == pytest.approx(10.0 + 1 / (2.0 * PACE_MARGIN))


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


def test_bucket_unknown_rate_without_a_start_is_not_paced() -> None:
    bucket = _bucket()
    assert bucket.rate is None and not bucket.slow_start
    bucket.take(1000, 0.0)
    assert bucket.available(0.0) >= 1_000_000
    assert bucket.ready_at(0.0) == 0.0
    bucket.on_success(0.0)
    assert bucket.rate is None


def test_bucket_backpressure_closes_gate_and_cuts_rate() -> None:
    bucket = _bucket(10.0, burst=5.0)
    bucket.on_backpressure(pause_s=30.0, jitter_s=0.5, now=100.0)
    assert bucket.gate_until == pytest.approx(130.5)
    assert bucket.rate == pytest.approx(10.0 * PACE_MARGIN * AIMD_DECREASE)
    assert bucket.backpressure_events == 1
    assert bucket.available(100.0) == 0
    assert bucket.available(130.0) == 0  # still closed
    assert bucket.ready_at(120.0) == pytest.approx(130.5)


def test_bucket_tokens_restart_at_zero_after_the_gate() -> None:
    bucket = _bucket(4.0, burst=10.0)
    bucket.on_backpressure(pause_s=10.0, jitter_s=0.0, now=0.0)
    rate = 4.0 * PACE_MARGIN * AIMD_DECREASE
    assert bucket.available(10.0) == 0  # gate open, but no burst is waiting
    assert bucket.ready_at(10.0) == pytest.approx(10.0 + 1 / rate)
    assert bucket.available(10.0 + 1 / rate) == 1
    assert bucket.available(11.0) == math.floor(rate)  # spread by the rate, not the whole burst of 10


def test_bucket_repeated_backpressure_cuts_again_never_below_minimum() -> None:
    bucket = _bucket(1.0, burst=1.0)
    for i in range(50):
        bucket.on_backpressure(pause_s=1.0, jitter_s=0.0, now=10.0 * i)  # separate events
    assert bucket.rate == AIMD_MIN_RPS
    assert bucket.backpressure_events == 50


def test_bucket_backpressure_never_shortens_an_open_gate() -> None:
    bucket = _bucket(10.0, burst=1.0)
    bucket.on_backpressure(pause_s=60.0, jitter_s=0.0, now=0.0)
    bucket.on_backpressure(pause_s=1.0, jitter_s=0.0, now=5.0)
    assert bucket.gate_until == 60.0


def test_bucket_success_adds_rate_back_gradually_up_to_the_stated_rate() -> None:
    bucket = _bucket(10.0, burst=1.0)
    bucket.on_backpressure(pause_s=1.0, jitter_s=0.0, now=0.0)
    cut = bucket.rate
    assert cut == pytest.approx(10.0 * PACE_MARGIN * AIMD_DECREASE)
    _use(bucket, 2.0)
    bucket.on_success(2.0)
    assert cut < bucket.rate < cut + 0.2  # gradual: one success is a small step
    previous = bucket.rate
    for _ in range(10):
        bucket.on_success(2.0)
        assert bucket.rate >= previous
        previous = bucket.rate
    assert bucket.rate < 10.0 * PACE_MARGIN
    for _ in range(10_000):
        bucket.on_success(2.0)
    assert bucket.rate == pytest.approx(10.0 * PACE_MARGIN)  # back at the stated rate, never past it


def test_bucket_additive_increase_is_a_share_of_the_reference_per_second() -> None:
    bucket = _bucket(100.0)
    bucket.on_backpressure(pause_s=0.05, jitter_s=0.0, now=0.0)
    reference, cut = bucket.reference_rps, bucket.rate
    assert reference == pytest.approx(100.0 * PACE_MARGIN)
    _use(bucket, 1.0)
    assert cut is not None and reference is not None
    for _ in range(round(cut)):  # about one second's worth of successes at the cut rate
        bucket.on_success(1.0)
    assert bucket.rate == pytest.approx(cut + AIMD_INCREASE_FRACTION * reference, rel=0.03)


def test_bucket_rate_nobody_uses_does_not_grow() -> None:
    bucket = _bucket(10.0, burst=1.0)
    bucket.on_backpressure(pause_s=1.0, jitter_s=0.0, now=0.0)
    cut = bucket.rate
    assert cut is not None
    for _ in range(1000):
        bucket.on_success(5.0)  # nothing was admitted: the rate is unused
    assert bucket.rate == cut
    _use(bucket, 6.0)
    bucket.on_success(6.0)
    assert bucket.rate > cut  # admitted at its rate: grows
    rate = bucket.rate
    idle = 6.0 + 4 * USE_WINDOW_S  # nothing admitted since: the average decayed under half the rate
    assert bucket.used_rps(idle) < IN_USE_FRACTION * rate
    bucket.on_success(idle)
    assert bucket.rate == rate


def test_bucket_success_at_the_stated_rate_stays_there() -> None:
    bucket = _bucket(10.0, burst=1.0)
    _use(bucket, 0.0)
    bucket.on_success(0.0)
    assert bucket.rate == pytest.approx(10.0 * PACE_MARGIN)


def test_slow_start_doubles_the_rate_every_period_while_it_is_used() -> None:
    bucket = _bucket(start_rps=SLOW_START_RPS)
    assert bucket.slow_start and bucket.rate == SLOW_START_RPS
    rates: dict[float, float] = {}
    now = 0.0
    while now < 1.0 + 2 * SLOW_START_DOUBLING_S:  # calls admitted and succeeding at the rate
        assert bucket.rate is not None
        bucket.take(1, now)
        bucket.on_success(now)
        rates.setdefault(round(now, 1), bucket.rate)
        now += 1 / bucket.rate
    assert bucket.rate > SLOW_START_RPS * 2
    # once the calls admitted fill the moving average, it doubles every period: x4 in two
    start = max(r for t, r in rates.items() if t <= 1.0)
    assert bucket.rate == pytest.approx(4 * start, rel=0.1)


def test_slow_start_ramps_from_a_providers_first_grant() -> None:
    # no history is no evidence of an idle provider: the ramp starts with the first call
    # (a moving average starting at zero held it back ~0.3 s, ~1% of a 30 s run)
    bucket = _bucket(start_rps=SLOW_START_RPS)
    now = 0.0
    while now < 2 * SLOW_START_DOUBLING_S:  # calls admitted and succeeding at the rate
        assert bucket.rate is not None
        bucket.take(1, now)
        bucket.on_success(now)
        now += 1 / bucket.rate
    assert bucket.rate == pytest.approx(4 * SLOW_START_RPS, rel=0.2)


def test_slow_start_does_not_ramp_a_rate_nobody_uses_after_its_first_grant() -> None:
    bucket = _bucket(start_rps=SLOW_START_RPS)
    bucket.take(1, 0.0)
    bucket.on_success(0.05)
    assert bucket.rate is not None and bucket.rate > SLOW_START_RPS  # in use at first
    rate = bucket.rate
    for i in range(5):  # then one call a second: the average falls under half the rate
        bucket.on_success(2.0 + i)
    assert bucket.rate == rate


def test_unpaced_bucket_starts_slow_start_from_half_the_admitted_rate_at_its_first_429() -> None:
    bucket = _bucket()
    for i in range(300):
        bucket.take(1, 100.0 + i * 0.01)  # 100 admissions a second for 3 s
    now = 100.0 + 2.99
    observed = bucket.used_rps(now)
    assert observed == pytest.approx(100.0, rel=0.05)
    bucket.on_backpressure(pause_s=5.0, jitter_s=0.0, now=now)
    assert bucket.slow_start
    assert bucket.rate == pytest.approx(observed * SLOW_START_EXIT_DECREASE)
    assert bucket.available(now + 5.0) == 0
    assert bucket.available(now + 5.0 + 1 / bucket.rate) == 1  # paced now


def test_unpaced_bucket_restarts_no_lower_than_the_slow_start_floor() -> None:
    bucket = _bucket()
    bucket.take(3, 0.0)
    bucket.on_backpressure(pause_s=0.1, jitter_s=0.0, now=0.01)
    assert bucket.rate == SLOW_START_RPS and bucket.slow_start


def test_bucket_used_rps_forgets_old_admissions() -> None:
    bucket = _bucket()
    bucket.take(10, 0.0)
    assert bucket.used_rps(0.0) == pytest.approx(10 / USE_WINDOW_S)
    assert bucket.used_rps(USE_WINDOW_S) == pytest.approx(10 / USE_WINDOW_S / math.e)
    assert bucket.used_rps(20 * USE_WINDOW_S) < 1e-6


def test_bucket_429_for_a_request_sent_after_the_cut_is_a_new_event() -> None:
    bucket = _bucket(100.0)
    rate = 100.0 * PACE_MARGIN
    bucket.on_backpressure(pause_s=0.05, jitter_s=0.0, now=10.0, sent_at=9.99)
    assert bucket.rate == pytest.approx(rate * AIMD_DECREASE)
    bucket.on_backpressure(pause_s=0.05, jitter_s=0.0, now=10.01, sent_at=9.995)  # sent before the cut
    assert bucket.rate == pytest.approx(rate * AIMD_DECREASE)
    bucket.on_backpressure(pause_s=0.05, jitter_s=0.0, now=10.1, sent_at=10.06)  # sent after it
    assert bucket.rate == pytest.approx(rate * AIMD_DECREASE**2)
    assert bucket.backpressure_events == 3


def test_bucket_wake_time_always_yields_a_token() -> None:
    # Regression: a refill landing at 0.99999999999994 tokens gave available() == 0 and a
    # ready_at() that rounded to ``now``, so the governor armed no wake-up (lost waiter).
    bucket = _bucket(10.0, burst=10.0)
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
    assert bucket.rate is not None
    assert now == pytest.approx(130.0 + 1 / bucket.rate)


def test_bucket_ready_at_is_strictly_ahead_for_a_tiny_deficit() -> None:
    bucket = _bucket(1000.0, burst=1.0)
    now = 10_000_000.0  # a monotonic clock after months of uptime: coarse floats
    bucket.refill(now)
    bucket.take(1, now)
    bucket.tokens = 1.0 - 1e-8
    ready = bucket.ready_at(now)
    assert ready is not None and ready > now
    assert bucket.available(ready) == 1


def test_bucket_429s_of_one_congestion_event_cut_the_rate_once() -> None:
    bucket = _bucket(10.0, burst=1.0)
    rate = 10.0 * PACE_MARGIN
    bucket.on_backpressure(pause_s=0.1, jitter_s=0.0, now=0.0)
    bucket.on_backpressure(pause_s=0.1, jitter_s=0.0, now=AIMD_CUT_COOLDOWN_S / 2)  # in flight at the first
    assert bucket.rate == pytest.approx(rate * AIMD_DECREASE)
    assert bucket.backpressure_events == 2
    bucket.on_backpressure(pause_s=0.1, jitter_s=0.0, now=AIMD_CUT_COOLDOWN_S * 2)  # a new event
    assert bucket.rate == pytest.approx(rate * AIMD_DECREASE**2)
    assert bucket.reference_rps == pytest.approx(rate * AIMD_DECREASE)


# -- send gate ------------------------------------------------------------------------


class FakeTime:
    """A clock and a sleep that advances it; ``hook(now)`` runs after each sleep."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.slept: list[float] = []
        self.hook = lambda now: None

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        self.hook(self.now)


def test_send_gate_spaces_bookings_at_its_rate() -> None:
    gate = SendGate(10.0)
    waits = [gate.book(100.0)[0] for _ in range(4)]  # four sends admitted at once
    assert waits == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert gate.book(101.0)[0] == 0.0  # idle long enough: no wait, no saved-up burst
    assert gate.book(101.0)[0] == pytest.approx(0.1)


def test_send_gate_without_a_rate_does_not_wait() -> None:
    gate = SendGate()
    assert [gate.book(5.0)[0] for _ in range(3)] == [0.0, 0.0, 0.0]


def test_send_gate_follows_rate_changes() -> None:
    gate = SendGate(10.0)
    gate.book(0.0)
    gate.set_rate(2.0)
    assert gate.book(0.0)[0] == pytest.approx(0.1)  # booked at the old spacing
    assert gate.book(0.0)[0] == pytest.approx(0.6)  # then at 2/s


def test_send_gate_pause_rebooks_senders_already_waiting() -> None:
    gate = SendGate(100.0)
    fake = FakeTime(10.0)
    for _ in range(50):
        gate.book(10.0)  # 50 senders ahead: the next slot is 0.5 s away

    def pause_once(now: float) -> None:
        if now >= 10.2 and gate.rps == 100.0:
            gate.pause_until(11.0, 50.0)  # a 429 came back while this sender slept

    fake.hook = pause_once
    # the sender sleeps in steps only because the fake sleep runs the hook afterwards
    assert gate.wait_turn(clock=fake.clock, sleep=fake.sleep) is True
    assert fake.slept[0] == pytest.approx(WAKE_S)  # a slice of its first booking (0.5 s away)
    assert fake.now == pytest.approx(11.0)  # re-booked from the pause, not sent into it
    assert sum(fake.slept) == pytest.approx(1.0)  # it saw the pause after that slice


def test_send_gate_unpaused_sender_goes_at_its_booking() -> None:
    gate = SendGate(4.0)
    fake = FakeTime(0.0)
    gate.book(0.0)
    assert gate.wait_turn(clock=fake.clock, sleep=fake.sleep) is True
    assert fake.slept == [pytest.approx(0.25)]


def test_send_gates_space_sends_a_little_faster_than_the_governor_grants() -> None:
    # a second pacer at the same rate would be a queue at full utilisation (its delay
    # never drains); a stated rate paced at 98% is sent at no more than the rate itself
    gate = SendGates().get("org", "p")
    gate.set_rate(100.0 * PACE_MARGIN)
    assert [gate.book(0.0)[0] for _ in range(2)] == pytest.approx([0.0, 1 / (100.0 * PACE_MARGIN * HEADROOM)])
    assert 100.0 * PACE_MARGIN * HEADROOM <= 100.0


def test_send_gates_are_one_per_org_and_provider() -> None:
    gates = SendGates()
    assert gates.get("org", "p") is gates.get("org", "p")
    assert gates.get("org", "p") is not gates.get("other", "p")
    assert gates.get("org", "p") is not gates.get("org", "q")


def test_send_gate_gives_up_a_turn_booked_after_the_latest_useful_moment() -> None:
    gate = SendGate(2.0)
    fake = FakeTime(0.0)
    gate.book(0.0)  # the next turn is at 0.5
    assert gate.wait_turn(latest=0.4, clock=fake.clock, sleep=fake.sleep) is False
    assert fake.slept == []  # gave up without waiting


def test_send_gate_gives_up_when_a_pause_pushes_the_turn_past_the_latest_moment() -> None:
    gate = SendGate(10.0)
    fake = FakeTime(0.0)
    gate.book(0.0)
    fake.hook = lambda now: gate.pause_until(30.0, 8.0)  # a 429 with Retry-After 30 s
    assert gate.wait_turn(latest=5.0, clock=fake.clock, sleep=fake.sleep) is False
    assert fake.now == pytest.approx(0.1)  # one spacing waited, then the re-booking was refused


def test_send_gate_stop_ends_the_wait() -> None:
    import threading

    gate = SendGate(0.001)  # turns 1000 s apart
    gate.book(time.monotonic())
    stop = threading.Event()
    stop.set()
    start = time.monotonic()
    assert gate.wait_turn(stop=stop) is False
    assert time.monotonic() - start < 1.0


def test_send_gate_senders_woken_late_together_go_at_most_two_back_to_back() -> None:
    gate = SendGate(10.0)
    bookings = [gate.book(0.0) for _ in range(4)]  # slots at 0.0, 0.1, 0.2, 0.3
    # the event loop was busy until 0.35: all four wake at once
    passes = [gate.try_pass(0.35, epoch) for _, epoch, _ in bookings]
    assert passes[:2] == [0.0, 0.0]  # one spacing of tolerance: two go back to back
    assert passes[2] == pytest.approx(0.1)  # the third waits a spacing; the fourth is not counted yet
    assert gate.try_pass(0.45, bookings[2][1]) == 0.0
    assert gate.try_pass(0.45, bookings[3][1]) == pytest.approx(0.1)
    assert gate.try_pass(0.55, bookings[3][1]) == 0.0


def test_send_gate_pause_voids_bookings_made_before_it() -> None:
    gate = SendGate(10.0)
    _, epoch, _ = gate.book(0.0)
    gate.pause_until(2.0, 10.0)
    assert gate.try_pass(0.05, epoch) is None  # book again
    delay, fresh, _ = gate.book(0.05)
    assert delay == pytest.approx(1.95)
    assert gate.try_pass(2.0, fresh) == 0.0


# -- circuit breaker ------------------------------------------------------------------


def _circuit() -> Circuit:
    return Circuit(threshold=3, open_s=5.0, open_max_s=12.0)


def test_circuit_opens_after_consecutive_unavailable_outcomes_only() -> None:
    circuit = _circuit()
    assert circuit.record(answered=0, unavailable=2, now=0.0) is False
    assert circuit.record(answered=1, unavailable=0, now=0.1) is False  # an answer resets the count
    assert circuit.record(answered=0, unavailable=2, now=0.2) is False
    assert circuit.admits(0.2) == "go"
    assert circuit.record(answered=0, unavailable=1, now=0.3) is True
    assert (circuit.state, circuit.open_until, circuit.opened) == ("open", pytest.approx(5.3), 1)
    assert circuit.admits(5.0) == "refuse"


def test_circuit_half_open_lets_one_probe_and_its_answer_closes_it() -> None:
    circuit = _circuit()
    circuit.record(answered=0, unavailable=3, now=0.0)
    assert circuit.admits(5.0) == "probe"
    circuit.probe_sent()
    assert circuit.admits(5.1) == "wait"  # the others wait for the probe
    assert circuit.record(answered=1, unavailable=0, now=5.2) is False
    assert (circuit.state, circuit.failures) == ("closed", 0)
    assert circuit.admits(5.2) == "go"


def test_circuit_failed_probe_reopens_for_twice_as_long_up_to_the_max() -> None:
    circuit = _circuit()
    circuit.record(answered=0, unavailable=3, now=0.0)
    periods = []
    now = 0.0
    for _ in range(3):
        now = circuit.open_until
        assert circuit.admits(now) == "probe"
        circuit.probe_sent()
        assert circuit.record(answered=0, unavailable=1, now=now) is True
        periods.append(circuit.period_s)
    assert periods == [10.0, 12.0, 12.0]
    assert circuit.opened == 4


def test_circuit_probe_that_was_not_sent_lets_another_probe() -> None:
    circuit = _circuit()
    circuit.record(answered=0, unavailable=3, now=0.0)
    assert circuit.admits(6.0) == "probe"
    circuit.probe_sent()
    circuit.record(answered=0, unavailable=0, now=6.1)  # given back unsent: nothing learnt
    assert circuit.state == "half_open"
    assert circuit.admits(6.1) == "probe"


def test_circuit_without_a_threshold_never_opens() -> None:
    circuit = Circuit(threshold=None, open_s=5.0, open_max_s=60.0)
    assert circuit.record(answered=0, unavailable=1000, now=0.0) is False
    assert circuit.admits(0.0) == "go"


def test_send_gate_closed_for_an_open_circuit_gives_up_every_turn() -> None:
    gate = SendGate(10.0)
    fake = FakeTime(0.0)
    for _ in range(5):
        gate.book(0.0)  # senders already waiting
    gate.close(until=30.0)
    assert gate.wait_turn(latest=100.0, clock=fake.clock, sleep=fake.sleep) is False
    assert fake.now < 1.0  # gave up instead of waiting for the circuit
    fake.now = 30.0
    assert gate.wait_turn(latest=100.0, clock=fake.clock, sleep=fake.sleep) is True  # the probe goes


def test_send_gate_closed_books_nothing_and_a_voided_sender_does_not_sleep_first() -> None:
    gate = SendGate(1.0)
    fake = FakeTime(0.0)
    for _ in range(20):
        gate.book(0.0)  # the next free slot is 20 s away
    gate.close(until=5.0)
    assert gate.book(1.0)[0] == math.inf
    assert gate.wait_turn(latest=100.0, clock=fake.clock, sleep=fake.sleep) is False
    assert fake.slept == []
