"""State-machine tests of the pacing pieces: Retry-After parsing, the pacing rules
(:class:`~actors.pacing.pacer_state.BucketState`, the one engine of every pacer: driven
here as a governor drives it), the circuit, and the send gate.

Time is passed in as values; nothing sleeps and no thread runs.
"""

from __future__ import annotations

import email.utils
import math
import time
from typing import Any

import pytest

from actors.governor.decisions import Governor
from actors.pacing.bucket import (
    AIMD_DECREASE,
    AIMD_INCREASE_FRACTION,
    AIMD_MIN_RPS,
    PACE_MARGIN,
    SLOW_START_DOUBLING_S,
    SLOW_START_EXIT_DECREASE,
    SLOW_START_RPS,
    ProviderBucket,
    parse_retry_after,
)
from actors.pacing.pacer_state import BucketState, growth
from actors.pacing.send_gate import HEADROOM, WAKE_S, SendGate, SendGates
from actors.pacing.values import (
    CircuitRecorded,
    Grant,
    Grow,
    Grown,
    PacerOp,
    PacerSettings,
    Pause,
    Paused,
    ProviderLimits,
    ReadState,
    Record,
    Take,
)
from actors.tool import Pacing, Policy

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


class Engine:
    """One provider's :class:`BucketState`, driven the way a governor drives its pacer."""

    def __init__(self, pacing: Pacing, settings: PacerSettings | None = None) -> None:
        self.state = BucketState()
        self.limits = ProviderLimits.from_pacing(pacing)
        self.settings = settings or PacerSettings()

    def op(self, op: PacerOp, now: float) -> Any:
        return self.state.handle(op, now, self.limits, self.settings)

    def take(self, n: int, now: float, nested: bool = False) -> Grant:
        return self.op(Take(n=n, partial=True, nested=nested), now)  # type: ignore[no-any-return]

    def granted(self, n: int, now: float) -> int:
        return self.take(n, now).granted

    def pause(self, pause_s: float, now: float, cut: bool = True) -> Paused:
        """A 429: pause; ``cut``: for a request granted at the current version (a new event)."""
        version = self.op(ReadState(), now).version
        return self.op(Pause(pause_s=pause_s, cut_version=version if cut else version - 1), now)  # type: ignore[no-any-return]

    def rate(self, now: float = 0.0) -> float | None:
        return self.op(ReadState(), now).rate_rps  # type: ignore[no-any-return]

    def succeed(self, successes: int, now: float) -> Grown:
        """``successes`` successful calls: the growth they earn, as a governor grows it."""
        state = self.op(ReadState(), now)
        rate = state.rate_rps or 0.0
        if state.rate_rps is None:
            return self.op(Grow(), now)  # type: ignore[no-any-return]
        return self.op(growth(rate, state.reference_rps, state.slow_start, successes), now)  # type: ignore[no-any-return]

    def use(self, now: float) -> None:
        """Grant calls as fast as the rate allows for the 3 s before ``now`` (so successes
        may grow it)."""
        rate = self.rate(now)
        assert rate is not None
        at = now - 3.0
        while at <= now:
            grant = self.take(1, at)
            at += 1 / rate if grant.granted else grant.wait_s
        window = self.settings.use_window_s
        used_rps = self.state.used * math.exp(-(now - self.state.used_at) / window) / window
        assert used_rps >= 0.9 * rate  # (grown from a half: see in_use_fraction)


def test_a_stated_rate_is_paced_just_under_itself() -> None:
    assert ProviderBucket(ceiling_rps=10.0, burst=5.0, max_concurrency=None).rate == pytest.approx(
        10.0 * PACE_MARGIN
    )
    assert Engine(Pacing(rps=10.0, burst=5.0)).rate() == pytest.approx(10.0 * PACE_MARGIN)
    assert PACE_MARGIN >= 0.97  # the main job's target is >= 97% of a stated rate


def test_bucket_refills_at_rate_and_caps_at_burst() -> None:
    bucket = Engine(Pacing(rps=10.0, burst=5.0))
    assert bucket.granted(6, 100.0) == 5  # a full bucket: its burst
    assert bucket.granted(5, 100.0) == 0
    assert bucket.granted(5, 100.25) == 2  # 0.25 s * 9.8 rps
    assert bucket.granted(5, 100.6) == 3  # 0.35 s more
    assert bucket.granted(10, 1000.0) == 5  # never past the burst


def test_bucket_wait_says_when_the_next_token_arrives() -> None:
    bucket = Engine(Pacing(rps=2.0, burst=1.0))
    assert bucket.granted(1, 10.0) == 1
    waiting = bucket.take(1, 10.0)
    assert waiting.granted == 0 and waiting.verdict == "wait"
    assert waiting.wait_s == pytest.approx(1 / (2.0 * PACE_MARGIN))
    assert bucket.granted(1, 10.0 + waiting.wait_s) == 1


def test_governor_max_concurrency_caps_grants() -> None:
    gov = Governor(Policy(), {"p": Pacing(max_concurrency=3)})
    assert dict(gov.acquire("o", "p", 2, "a", now=0.0).grants) == {"a": 2}
    assert dict(gov.acquire("o", "p", 5, "b", now=0.0).grants) == {"b": 1}
    waiting = gov.acquire("o", "p", 1, "c", now=0.0)
    assert waiting.grants == [] and waiting.wake_at is None  # only a release can help
    assert dict(gov.release("o", "p", 1, successes=1, now=0.0).grants) == {"c": 1}


def test_bucket_unknown_rate_without_a_start_is_not_paced() -> None:
    bucket = Engine(Pacing())
    assert bucket.rate() is None
    assert bucket.granted(1000, 0.0) == 1000
    assert bucket.granted(1_000_000, 0.0) == 1_000_000  # never waits
    bucket.succeed(1, 0.0)
    assert bucket.rate() is None


def test_bucket_backpressure_closes_gate_and_cuts_rate() -> None:
    bucket = Engine(Pacing(rps=10.0, burst=5.0))
    paused = bucket.pause(30.5, now=100.0)
    assert paused.cut and paused.pause_s == pytest.approx(30.5)
    assert bucket.rate() == pytest.approx(10.0 * PACE_MARGIN * AIMD_DECREASE)
    assert bucket.take(1, 100.0).verdict == "paused"
    assert bucket.granted(1, 130.0) == 0  # still closed
    assert bucket.take(1, 120.0).wait_s == pytest.approx(10.5)


def test_bucket_tokens_restart_at_zero_after_the_gate() -> None:
    bucket = Engine(Pacing(rps=4.0, burst=10.0))
    bucket.pause(10.0, now=0.0)
    rate = 4.0 * PACE_MARGIN * AIMD_DECREASE
    after = bucket.take(10, 10.0)
    assert after.granted == 0  # gate open, but no burst is waiting
    assert after.wait_s == pytest.approx(1 / rate)
    first = bucket.granted(10, 10.0 + 1 / rate)
    assert first == 1
    assert first + bucket.granted(10, 11.0) == math.floor(rate)  # spread by the rate, not the burst of 10


def test_bucket_repeated_backpressure_cuts_again_never_below_minimum() -> None:
    bucket = Engine(Pacing(rps=1.0, burst=1.0))
    for i in range(50):
        assert bucket.pause(1.0, now=10.0 * i).cut  # separate events
    assert bucket.rate() == AIMD_MIN_RPS


def test_bucket_backpressure_never_shortens_an_open_gate() -> None:
    bucket = Engine(Pacing(rps=10.0, burst=1.0))
    bucket.pause(60.0, now=0.0)
    assert bucket.pause(1.0, now=5.0).pause_s == pytest.approx(55.0)


def test_bucket_success_adds_rate_back_gradually_up_to_the_stated_rate() -> None:
    bucket = Engine(Pacing(rps=10.0, burst=1.0))
    bucket.pause(1.0, now=0.0)
    cut = bucket.rate()
    assert cut == pytest.approx(10.0 * PACE_MARGIN * AIMD_DECREASE)
    bucket.use(4.0)
    bucket.succeed(1, 4.0)
    rate = bucket.rate()
    assert rate is not None and cut < rate < cut + 0.2  # gradual: one success is a small step
    previous = rate
    for _ in range(10):
        bucket.succeed(1, 4.0)
        rate = bucket.rate()
        assert rate is not None and rate >= previous
        previous = rate
    assert previous < 10.0 * PACE_MARGIN
    for _ in range(10_000):
        bucket.succeed(1, 4.0)
    assert bucket.rate() == pytest.approx(10.0 * PACE_MARGIN)  # back at the stated rate, never past it


def test_bucket_additive_increase_is_a_share_of_the_reference_per_second() -> None:
    bucket = Engine(Pacing(rps=100.0))
    bucket.pause(0.05, now=0.0)
    state = bucket.op(ReadState(), 0.0)
    reference, cut = state.reference_rps, state.rate_rps
    assert reference == pytest.approx(100.0 * PACE_MARGIN)
    bucket.use(4.0)
    assert cut is not None and reference is not None
    for _ in range(round(cut)):  # about one second's worth of successes at the cut rate
        bucket.succeed(1, 4.0)
    assert bucket.rate() == pytest.approx(cut + AIMD_INCREASE_FRACTION * reference, rel=0.03)


def test_bucket_rate_nobody_uses_does_not_grow() -> None:
    settings = PacerSettings()
    bucket = Engine(Pacing(rps=10.0, burst=1.0), settings)
    bucket.pause(1.0, now=0.0)
    cut = bucket.rate()
    assert cut is not None
    for _ in range(1000):
        assert not bucket.succeed(1, 5.0).grown  # nothing was granted: the rate is unused
    assert bucket.rate() == cut
    bucket.use(7.0)
    assert bucket.succeed(1, 7.0).grown  # granted at its rate: grows
    rate = bucket.rate()
    assert rate is not None and rate > cut
    idle = 7.0 + 4 * settings.use_window_s  # nothing granted since: the average decayed under half the rate
    assert not bucket.succeed(1, idle).grown
    assert bucket.rate() == rate


def test_bucket_success_at_the_stated_rate_stays_there() -> None:
    bucket = Engine(Pacing(rps=10.0, burst=1.0))
    bucket.use(3.0)
    bucket.succeed(1, 3.0)
    assert bucket.rate() == pytest.approx(10.0 * PACE_MARGIN)


def _ramp(bucket: Engine, until: float) -> dict[float, float]:
    """Calls granted and succeeding at the rate until ``until``: the rate every 0.1 s."""
    rates: dict[float, float] = {}
    now = 0.0
    while now < until:
        rate = bucket.rate(now)
        assert rate is not None
        assert bucket.granted(1, now) == 1
        bucket.succeed(1, now)
        rates.setdefault(round(now, 1), rate)
        now += 1 / rate
    return rates


def test_slow_start_doubles_the_rate_every_period_while_it_is_used() -> None:
    bucket = Engine(Pacing(start_rps=SLOW_START_RPS))
    state = bucket.op(ReadState(), 0.0)
    assert state.slow_start and state.rate_rps == SLOW_START_RPS
    rates = _ramp(bucket, 1.0 + 2 * SLOW_START_DOUBLING_S)
    rate = bucket.rate()
    assert rate is not None and rate > SLOW_START_RPS * 2
    # once the calls granted fill the moving average, it doubles every period: x4 in two
    start = max(r for t, r in rates.items() if t <= 1.0)
    assert rate == pytest.approx(4 * start, rel=0.1)


def test_slow_start_ramps_from_a_providers_first_grant() -> None:
    # no history is no evidence of an idle provider: the ramp starts with the first call
    # (a moving average starting at zero held it back ~0.3 s, ~1% of a 30 s run)
    bucket = Engine(Pacing(start_rps=SLOW_START_RPS))
    _ramp(bucket, 2 * SLOW_START_DOUBLING_S)
    assert bucket.rate() == pytest.approx(4 * SLOW_START_RPS, rel=0.2)


def test_slow_start_does_not_ramp_a_rate_nobody_uses_after_its_first_grant() -> None:
    bucket = Engine(Pacing(start_rps=SLOW_START_RPS))
    assert not bucket.succeed(1, 0.0).grown  # no grant yet: nothing in use
    bucket.take(1, 0.0)
    assert bucket.succeed(1, 0.05).grown  # in use from the first grant
    rate = bucket.rate()
    assert rate is not None and rate > SLOW_START_RPS
    for i in range(5):  # then one call a second: the average falls under half the rate
        bucket.take(1, 2.0 + i)
        bucket.succeed(1, 2.0 + i)
    assert bucket.rate() == rate


def test_unpaced_bucket_starts_slow_start_from_half_the_granted_rate_at_its_first_429() -> None:
    bucket = Engine(Pacing())
    for i in range(300):
        bucket.take(1, 100.0 + i * 0.01)  # 100 grants a second for 3 s
    now = 100.0 + 2.99
    paused = bucket.pause(5.0, now=now)
    assert paused.slow_start and paused.cut
    assert paused.rate_rps == pytest.approx(100.0 * SLOW_START_EXIT_DECREASE, rel=0.05)
    rate = paused.rate_rps
    assert rate is not None
    assert bucket.granted(1, now + 5.0) == 0
    assert bucket.granted(1, now + 5.0 + 1 / rate) == 1  # paced now


def test_unpaced_bucket_restarts_no_lower_than_the_slow_start_floor() -> None:
    bucket = Engine(Pacing())
    bucket.take(3, 0.0)
    paused = bucket.pause(0.1, now=0.01)
    assert paused.rate_rps == SLOW_START_RPS and paused.slow_start


def test_bucket_use_forgets_old_grants() -> None:
    window = PacerSettings().use_window_s
    restarts = []
    for ago in (0.0, window, 20 * window):  # 100 grants, then a 429 ``ago`` seconds later
        bucket = Engine(Pacing())
        bucket.take(100, 0.0)
        restarts.append(bucket.pause(1.0, now=ago).rate_rps)
    used = 100 / window
    assert restarts == [
        pytest.approx(used * SLOW_START_EXIT_DECREASE),
        pytest.approx(used / math.e * SLOW_START_EXIT_DECREASE),
        SLOW_START_RPS,  # forgotten: the floor
    ]


def test_governor_429_for_a_request_sent_after_the_cut_is_a_new_event() -> None:
    gov = Governor(Policy(retry_after_min_s=0.01), {"p": Pacing(rps=100.0)}, rng=lambda: 0.0)
    rate = 100.0 * PACE_MARGIN
    assert gov.acquire("o", "p", 1, "a", now=9.99).grants
    gov.backpressure("o", "p", "0.05", now=10.0, wall=1_700_000_000.0, sent_at=9.99)
    assert gov.bucket("o", "p").rate == pytest.approx(rate * AIMD_DECREASE)
    gov.backpressure("o", "p", "0.05", now=10.01, wall=1_700_000_000.0, sent_at=9.995)  # sent before the cut
    assert gov.bucket("o", "p").rate == pytest.approx(rate * AIMD_DECREASE)
    assert gov.acquire("o", "p", 1, "b", now=10.08).grants  # granted after the cut
    gov.backpressure("o", "p", "0.05", now=10.1, wall=1_700_000_000.0, sent_at=10.08)
    assert gov.bucket("o", "p").rate == pytest.approx(rate * AIMD_DECREASE**2)
    assert gov.bucket("o", "p").backpressure_events == 3
    assert gov.bucket("o", "p").cuts == 2


def test_bucket_wait_always_yields_a_token() -> None:
    # Regression: a refill landing at 0.99999999999994 tokens granted nothing and said to
    # wait until ``now``, so the governor armed no wake-up (lost waiter).
    bucket = Engine(Pacing(rps=10.0, burst=10.0))
    bucket.pause(30.0, now=100.0)
    rate = bucket.rate()
    now = 130.0
    for _ in range(50):
        grant = bucket.take(1, now)
        if grant.granted:
            break
        assert grant.wait_s > 0
        now += grant.wait_s
    else:
        pytest.fail("the waits never led to a token")
    assert rate is not None
    assert now == pytest.approx(130.0 + 1 / rate)


def test_bucket_wait_is_strictly_ahead_for_a_tiny_deficit() -> None:
    bucket = Engine(Pacing(rps=1000.0, burst=1.0))
    now = 1_800_000_000.0  # epoch seconds, as a shared pacer's clock: coarse floats
    assert bucket.granted(1, now) == 1
    grant = bucket.take(1, now + 1 / (1000.0 * PACE_MARGIN) - 1e-7)  # a hair short of the token
    assert grant.granted == 1 or grant.wait_s > 0
    if not grant.granted:
        assert bucket.granted(1, now + 1 / (1000.0 * PACE_MARGIN) - 1e-7 + grant.wait_s) == 1


def test_bucket_429s_of_one_congestion_event_cut_the_rate_once() -> None:
    bucket = Engine(Pacing(rps=10.0, burst=1.0))
    rate = 10.0 * PACE_MARGIN
    assert bucket.pause(0.1, now=0.0).cut
    assert not bucket.pause(0.1, now=0.5, cut=False).cut  # granted before the first: in flight at it
    assert bucket.rate() == pytest.approx(rate * AIMD_DECREASE)
    assert bucket.pause(0.1, now=2.0).cut  # granted after the cut: a new event
    state = bucket.op(ReadState(), 2.0)
    assert state.rate_rps == pytest.approx(rate * AIMD_DECREASE**2)
    assert state.reference_rps == pytest.approx(rate * AIMD_DECREASE)


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


def _circuit(threshold: int | None = 3) -> Engine:
    settings = PacerSettings(circuit_failures=threshold, circuit_open_s=5.0, circuit_open_max_s=12.0)
    return Engine(Pacing(), settings)


def _record(bucket: Engine, answered: int, unavailable: int, now: float) -> CircuitRecorded:
    return bucket.op(Record(answered=answered, unavailable=unavailable), now)  # type: ignore[no-any-return]


def test_circuit_opens_after_consecutive_unavailable_outcomes_only() -> None:
    circuit = _circuit()
    assert _record(circuit, answered=0, unavailable=2, now=0.0).opened is False
    assert _record(circuit, answered=1, unavailable=0, now=0.1).opened is False  # an answer resets the count
    assert _record(circuit, answered=0, unavailable=2, now=0.2).opened is False
    assert circuit.take(1, 0.2).verdict == "go"
    opened = _record(circuit, answered=0, unavailable=1, now=0.3)
    assert opened.opened is True and opened.open_s == pytest.approx(5.0)
    refused = circuit.take(1, 5.0)
    assert (refused.verdict, refused.granted, refused.wait_s) == ("refuse", 0, pytest.approx(0.3))


def test_circuit_half_open_lets_one_probe_and_its_answer_closes_it() -> None:
    circuit = _circuit()
    _record(circuit, answered=0, unavailable=3, now=0.0)
    probe = circuit.take(3, 5.0)
    assert (probe.verdict, probe.granted) == ("probe", 1)  # one call: the probe
    assert circuit.take(1, 5.1).verdict == "wait"  # the others wait for the probe
    assert circuit.take(1, 5.1, nested=True).verdict == "go"  # but a nested call (its parent may be it)
    assert _record(circuit, answered=1, unavailable=0, now=5.2).opened is False
    assert circuit.take(1, 5.2).verdict == "go"
    for i in range(2):  # closed, its count of failures reset: two more do not open it
        assert _record(circuit, answered=0, unavailable=1, now=5.3 + i).opened is False


def test_circuit_failed_probe_reopens_for_twice_as_long_up_to_the_max() -> None:
    circuit = _circuit()
    periods = [_record(circuit, answered=0, unavailable=3, now=0.0).open_s]
    now = periods[0]
    for _ in range(3):
        assert circuit.take(1, now).verdict == "probe"
        reopened = _record(circuit, answered=0, unavailable=1, now=now)
        assert reopened.opened is True
        periods.append(reopened.open_s)
        now += reopened.open_s
    assert periods == [5.0, 10.0, 12.0, 12.0]  # opened four times


def test_circuit_probe_that_was_not_sent_lets_another_probe() -> None:
    circuit = _circuit()
    _record(circuit, answered=0, unavailable=3, now=0.0)
    assert circuit.take(1, 6.0).verdict == "probe"
    assert circuit.take(1, 6.05).verdict == "wait"
    _record(circuit, answered=0, unavailable=0, now=6.1)  # given back unsent: nothing learnt
    assert circuit.take(1, 6.1).verdict == "probe"  # still half-open: another probe


def test_circuit_without_a_threshold_never_opens() -> None:
    circuit = _circuit(threshold=None)
    assert _record(circuit, answered=0, unavailable=1000, now=0.0).opened is False
    assert circuit.take(1, 0.0).verdict == "go"


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
