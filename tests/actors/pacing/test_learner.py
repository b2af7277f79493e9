"""Learning an unknown limit (:class:`actors.pacing.learner.LimitLearner`), driven with a fake
clock against a simulated provider: nginx's ``limit_req`` (rate R, burst B, nodelay)
answering 429 with ``Retry-After: 1``, a sender that always has calls waiting."""

from __future__ import annotations

import heapq
import itertools
import math
import re
from pathlib import Path

import attrs
import pytest

from actors.pacing.bucket import SLOW_START_RPS
from actors.pacing.learner import FIRST_HOLD_FRACTION, FIRST_HOLD_S, HOLD_FRACTION, HOLD_S, LimitLearner


@attrs.define
class Limiter:
    """nginx limit_req: a request is refused when more than ``burst`` are in excess."""

    rps: float
    burst: float
    excess: float = 0.0
    at: float = 0.0

    def accepts(self, now: float) -> bool:
        self.excess = max(0.0, self.excess - (now - self.at) * self.rps)
        self.at = now
        if self.excess + 1.0 > self.burst + 1.0:
            return False
        self.excess += 1.0
        return True


@attrs.define
class Run:
    accepted: list[float] = attrs.field(factory=list)
    refused: list[float] = attrs.field(factory=list)
    rates: list[tuple[float, float]] = attrs.field(factory=list)

    def accepted_between(self, start: float, end: float) -> int:
        return sum(1 for t in self.accepted if start <= t < end)

    def refused_between(self, start: float, end: float) -> int:
        return sum(1 for t in self.refused if start <= t < end)

    def rate_at(self, when: float) -> float:
        return [r for t, r in self.rates if t <= when][-1]


def simulate(
    learner: LimitLearner,
    limiter: Limiter,
    until: float,
    *,
    rtt_s: float = 0.005,
    refused_rtt_s: float | None = None,
    change: tuple[float, float] | None = None,
) -> Run:
    """Send at the learner's rate (paced, no jitter) from 0 to ``until``; each answer
    reaches the learner ``rtt_s`` after its send (a 429 ``refused_rtt_s``: a limiter in
    front of a slow provider refuses at once; default ``rtt_s``), with its send time; a
    429 pauses sending for 1 s (its Retry-After). ``change``: (when, new limit)."""
    run = Run()
    next_send, resume = 0.0, 0.0
    pending: list[tuple[float, float, bool]] = []  # (answer time, sent at, accepted), a heap
    refused_rtt = rtt_s if refused_rtt_s is None else refused_rtt_s
    while True:
        answer_at = pending[0][0] if pending else math.inf
        now = min(answer_at, max(next_send, resume))
        if now >= until:
            return run
        if change is not None and now >= change[0]:
            limiter.rps, change = change[1], None
        if answer_at <= now:
            _, sent, ok = heapq.heappop(pending)
            if ok:
                learner.on_accepted(1, now, sent_at=sent)
            else:
                learner.on_congestion(now, now + 1.0, sent)
                resume = max(resume, now + 1.0)
            continue
        ok = limiter.accepts(now)
        (run.accepted if ok else run.refused).append(now)
        heapq.heappush(pending, (now + (rtt_s if ok else refused_rtt), now, ok))
        assert learner.rate is not None
        run.rates.append((now, learner.rate))
        next_send = now + 1.0 / learner.rate


@pytest.mark.parametrize(
    ("rps", "seconds", "share"),
    [
        # issue 29: one pause in the first 30 s (FIRST_HOLD_S), the limit fitted from two
        # cycles, probes backed off (before: 92.3%, 91.6%, 89.0% over 30 s)
        (20.0, 30.0, 0.94),
        (50.0, 30.0, 0.93),
        (200.0, 30.0, 0.91),
        # the plateau at HOLD_FRACTION 0.97 (0.95 gave 93.5% and 92.7% at 50 and 200/s)
        (20.0, 120.0, 0.94),
        (50.0, 120.0, 0.94),
        (200.0, 120.0, 0.94),
    ],
)
def test_learner_finds_an_unknown_limit(rps: float, seconds: float, share: float) -> None:
    limiter = Limiter(rps, burst=rps / 5)  # a burst of 0.2 s inflates the first measure
    learner = LimitLearner(rate=SLOW_START_RPS)
    run = simulate(learner, limiter, seconds)
    accepted, refused = len(run.accepted), len(run.refused)
    # slow start from 10/s and the first pauses are part of the run
    assert accepted >= share * rps * seconds
    assert refused <= 0.01 * (accepted + refused)
    assert learner.limit_rps is not None and learner.limit_rps == pytest.approx(rps, rel=0.15)


def test_learner_burst_inflated_first_cut_converges_from_above() -> None:
    limiter = Limiter(50.0, burst=25.0)  # half a second of burst
    learner = LimitLearner(rate=SLOW_START_RPS)
    run = simulate(learner, limiter, 12.0)
    assert learner.cuts >= 1
    first = learner.limit_rps
    assert first is not None
    # estimates only come down towards the limit; the plateau ends under it
    assert learner.rate is not None and learner.rate < 50.0
    assert learner.limit_rps == pytest.approx(50.0, rel=0.12)
    assert run.refused_between(4.0, 12.0) <= 10


def test_learner_steady_state_holds_a_plateau_and_probes_rarely() -> None:
    limiter = Limiter(50.0, burst=10.0)
    learner = LimitLearner(rate=SLOW_START_RPS)
    run = simulate(learner, limiter, 130.0)
    learnt_cuts = learner.cuts
    assert run.accepted_between(10.0, 130.0) >= 0.9 * 50.0 * 120.0
    # probing against an unchanged limit: at most one congestion event every 20 s
    events = learner.cuts
    assert events - min(learnt_cuts, events) >= 0
    assert events <= 3 + 120 // 20
    assert run.refused_between(10.0, 130.0) <= 0.01 * 50.0 * 120.0
    plateau = [r for t, r in run.rates if t > 10.0]
    assert min(plateau) >= 0.85 * 50.0


def test_learner_finds_a_limit_that_rose_later() -> None:
    limiter = Limiter(50.0, burst=10.0)
    learner = LimitLearner(rate=SLOW_START_RPS)
    run = simulate(learner, limiter, 130.0, change=(40.0, 100.0))
    assert run.accepted_between(30.0, 40.0) <= 50.0 * 10.0 + 10.0
    assert run.accepted_between(100.0, 130.0) >= 0.85 * 100.0 * 30.0
    assert learner.limit_rps is not None and learner.limit_rps >= 90.0
    assert run.refused_between(40.0, 130.0) <= 0.01 * 100.0 * 90.0


def test_learner_follows_a_limit_that_dropped() -> None:
    limiter = Limiter(100.0, burst=20.0)
    learner = LimitLearner(rate=SLOW_START_RPS)
    run = simulate(learner, limiter, 60.0, change=(30.0, 50.0))
    assert learner.limit_rps is not None and learner.limit_rps == pytest.approx(50.0, rel=0.12)
    assert max(r for t, r in run.rates if 36.0 <= t < 44.0) < 50.0  # the plateau under the new limit
    assert run.refused_between(35.0, 60.0) <= 10
    assert run.accepted_between(40.0, 60.0) >= 0.85 * 50.0 * 20.0


@pytest.mark.parametrize(("rps", "burst_s"), [(20.0, 0.2), (50.0, 0.5), (200.0, 1.0), (200.0, 0.1)])
def test_learner_fits_the_limit_and_burst_from_two_cycles(rps: float, burst_s: float) -> None:
    # one cycle between pauses gives one equation in the limit and the burst; two give
    # both. A burst of 0.5 s inflates slow start's estimate by ~30%: the plateau after it
    # is over the limit, refused within seconds, and the second cycle pins the limit
    # (before: estimates from the accepted rate converged from above, a pause each)
    limiter = Limiter(rps, burst=rps * burst_s)
    learner = LimitLearner(rate=SLOW_START_RPS)
    run = simulate(learner, limiter, 60.0)
    assert learner.burst == pytest.approx(rps * burst_s, abs=2.0)
    assert learner.limit_rps == pytest.approx(rps, rel=0.02)
    events = [at for i, at in enumerate(run.refused) if i == 0 or at - run.refused[i - 1] > 1.5]
    assert len(events) <= 3, events
    assert 0.94 * rps <= run.rate_at(events[1] + 2.0) <= rps  # the plateau after the fit


def test_learner_estimates_from_what_was_accepted_not_what_was_asked() -> None:
    learner = LimitLearner(rate=70.0)
    learner.phase = "plateau"  # asked for 70/s, the provider accepted 40/s of them
    for i in range(60):
        learner.on_accepted(1, 10.0 + i / 40.0, in_use=False)
    assert learner.on_congestion(11.5, 12.5, sent_at=11.49) is True
    assert learner.limit_rps == pytest.approx(40.0, rel=0.05)
    assert learner.rate == pytest.approx(HOLD_FRACTION * learner.limit_rps)


def test_learner_cuts_once_per_congestion_event() -> None:
    learner = LimitLearner(rate=100.0)
    for i in range(150):
        learner.on_accepted(1, i / 100.0, in_use=False)
    assert learner.on_congestion(1.5, 2.5, sent_at=1.49) is True
    rate = learner.rate
    assert learner.on_congestion(1.51, 2.51, sent_at=1.495) is False  # sent before the cut
    assert learner.rate == rate and learner.cuts == 1
    assert learner.on_congestion(5.0, 6.0, sent_at=4.0) is True  # sent after it: a new event
    assert learner.cuts == 2


def test_learner_never_cuts_below_half_on_a_thin_measure() -> None:
    learner = LimitLearner(rate=100.0)
    learner.on_accepted(1, 0.0, in_use=False)  # one answer in the window
    learner.on_congestion(1.0, 2.0, sent_at=0.9)
    assert learner.rate == pytest.approx(50.0)


def test_learner_plateau_is_held_before_probing_and_only_while_used() -> None:
    learner = LimitLearner(rate=100.0)
    for i in range(150):
        learner.on_accepted(1, i / 100.0, in_use=False)
    learner.on_congestion(1.5, 2.5, sent_at=1.49)
    plateau = learner.rate
    learner.on_accepted(1, 2.5 + FIRST_HOLD_S / 2)
    assert learner.rate == plateau and learner.phase == "plateau"
    learner.on_accepted(1, 2.5 + FIRST_HOLD_S + 0.1, in_use=False)
    assert learner.rate == plateau  # not used: not raised
    learner.on_accepted(1, 2.5 + FIRST_HOLD_S + 0.2)
    assert learner.phase == "probe" and learner.rate is not None and learner.rate > plateau


def test_learner_slow_start_doubles_per_period_of_accepted_calls() -> None:
    learner = LimitLearner(rate=10.0)
    assert learner.phase == "slow_start"
    learner.on_accepted(5, 0.5)  # half a second's worth at 10/s
    assert learner.rate == pytest.approx(20.0)


def test_learner_leaves_slow_start_from_the_rate_the_provider_saw() -> None:
    # slow start asked for 100/s but calls reached the provider at 50/s (the way from
    # grant to provider lags a ramp): half the rate asked for would be over the limit
    learner = LimitLearner(rate=100.0)
    for i in range(75):
        learner.on_accepted(1, i / 50.0, in_use=False)
    assert learner.on_congestion(1.5, 2.5, sent_at=1.49) is True
    assert learner.rate == pytest.approx(FIRST_HOLD_FRACTION * 50.0, rel=0.02)


@pytest.mark.parametrize(("rps", "most_refused"), [(1.0, 5), (2.0, 5), (5.0, 5)])
def test_learner_limit_far_below_slow_start_costs_few_429s(rps: float, most_refused: int) -> None:
    # a limit under slow start's first rate: each pause refills the provider's bucket, so
    # the next cycle is refused after a handful of answers that measure only that bucket;
    # such a 429 halves the rate (before: a 4% cut, 26 of 57 requests refused at 1/s)
    limiter = Limiter(rps, burst=1.0)
    learner = LimitLearner(rate=SLOW_START_RPS)
    run = simulate(learner, limiter, 30.0)
    assert len(run.refused) <= most_refused
    assert learner.limit_rps is not None and learner.limit_rps <= rps * 1.5


@pytest.mark.parametrize("rps", [50.0, 100.0, 200.0])
def test_learner_behind_a_slow_provider_estimates_from_what_was_sent_before_the_429(rps: float) -> None:
    # a limiter in front of a provider answering in 300 ms refuses at once: when slow
    # start's 429 comes back, the answers of the last 300 ms of its ramp are not; the
    # estimate is made again from the sends before the 429 once the pause has ended
    # (before: 84.8/s for 100/s against nginx, 74% of R over 30 s)
    limiter = Limiter(rps, burst=rps / 5)
    learner = LimitLearner(rate=SLOW_START_RPS)
    run = simulate(learner, limiter, 30.0, rtt_s=0.3, refused_rtt_s=0.001)
    assert len(run.accepted) >= 0.85 * rps * 30.0
    assert len(run.refused) <= 0.02 * (len(run.accepted) + len(run.refused))


DOCS_PACING = Path(__file__).resolve().parents[3] / "docs" / "pacing.md"


def _documented_probe_period() -> tuple[float, float, float]:
    """How far apart docs/pacing.md says a steady probe's first 429s are, seconds, and the
    longest plateau hold (seconds of use) it says the probes back off to."""
    text = DOCS_PACING.read_text(encoding="utf-8")
    found = re.search(r"meets its first 429s (\d+)\u2013(\d+) s apart", text)
    longest = re.search(r"twice as long, up to (\d+) s of use", text)
    assert found is not None and longest is not None, (
        "docs/pacing.md no longer says how often the probe meets a 429"
    )
    return float(found.group(1)), float(found.group(2)), float(longest.group(1))


@pytest.mark.parametrize("rps", [20.0, 50.0, 200.0])
@pytest.mark.parametrize("burst_s", [0.0, 0.05, 0.2])
@pytest.mark.parametrize("rtt_s", [0.005, 0.3])
def test_learner_probe_meets_a_429_as_often_as_the_docs_say(rps: float, burst_s: float, rtt_s: float) -> None:
    # each probe that finds the limit where it was doubles the plateau's hold (HOLD_GROWTH):
    # a 1 s pause (Retry-After) every 17.5 s was 5.7% of the limit (before: 16-21 s apart)
    low, high, longest = _documented_probe_period()
    limiter = Limiter(rps, burst=rps * burst_s)
    learner = LimitLearner(rate=SLOW_START_RPS)
    run = simulate(learner, limiter, 300.0, rtt_s=rtt_s)
    events: list[float] = []  # congestion events: 429s more than 1.5 s after the last
    for at in run.refused:
        if not events or at - events[-1] > 1.5:
            events.append(at)
    steady = [b - a for a, b in itertools.pairwise(events[1:])]  # past slow start's cut
    assert len(steady) >= 3, events
    assert low <= steady[0] <= high, [round(s, 1) for s in steady]
    assert min(steady) >= low and max(steady) <= longest + high - HOLD_S, [round(s, 1) for s in steady]
    assert steady[-1] >= 1.5 * steady[0], [round(s, 1) for s in steady]  # backed off
