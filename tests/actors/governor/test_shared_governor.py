"""shared_governor (actors/governor/shared.py): two governors (two worker processes) pacing
through one pacer. A plain state machine: a LocalPacer on a fake clock stands for Redis
(the same rules; the Redis pacer passes the same conformance suite in tests/actors/pacing/shared)."""

from __future__ import annotations

import pytest

from actors import Pacing, Policy
from actors.errors import ProviderUnavailableError
from actors.governor.shared import shared_governor
from actors.pacing.bucket import pacing_report
from actors.pacing.pacers import LocalPacer


def _pair(rps: float = 10.0, **policy):
    now = [100.0]
    pacer = LocalPacer(clock=lambda: now[0])
    pacings = {"p": Pacing(rps=rps)}
    one = shared_governor(Policy(**policy), pacings, pacer, rng=lambda: 0.0)
    two = shared_governor(Policy(**policy), pacings, pacer, rng=lambda: 0.0)
    return now, pacer, one, two


def test_two_governors_share_one_rate():
    now, _, one, two = _pair()
    granted = 0
    for gov in (one, two):
        for i in range(5):
            granted += sum(n for _, n in gov.acquire("org", "p", 1, f"{id(gov)}-{i}", now[0]).grants)
    assert granted == 1  # a stated 10/s: one call now, for both processes together
    later = 0
    for _ in range(10):  # one second in steps of 0.1 s
        now[0] += 0.1
        later += sum(n for gov in (one, two) for _, n in gov.wake(now[0]).grants)
    assert 9 <= later <= 10  # one second of the rate, not two


def test_one_governors_429_pauses_the_other():
    now, _, one, two = _pair()
    one.acquire("org", "p", 1, "a", now[0])
    one.backpressure("org", "p", "2", now[0], 0.0, sent_at=now[0])
    now[0] += 1.0
    out = two.acquire("org", "p", 1, "b", now[0])
    assert out.grants == []
    _, until = out.gates[("org", "p")]
    assert until is not None and until > now[0]  # its senders hold too
    assert out.wake_at is not None and out.wake_at >= now[0] + 0.9


def test_a_circuit_opened_by_one_refuses_the_others_waiters():
    now, _, one, two = _pair(rps=1000.0, circuit_failures=2)
    one.acquire("org", "p", 1, "a", now[0])
    out = one.release("org", "p", 1, 0, now[0], unavailable=2)
    assert ("org", "p") in out.closed
    refused = two.acquire("org", "p", 1, "b", now[0])
    assert refused.grants == []
    assert [type(exc) for _, exc in refused.refusals] == [ProviderUnavailableError]


def _drive(govs, now, seconds: float, step: float = 0.02) -> None:
    """Each governor asks for one slot every ``step`` (taking turns at going first) and
    its grants succeed at once."""
    end, turn = now[0] + seconds, 0
    while now[0] < end:
        now[0] += step
        for gov in govs[turn % len(govs) :] + govs[: turn % len(govs)]:
            out = gov.acquire("org", "p", 1, object(), now[0])
            granted = sum(n for _, n in out.grants)
            if granted:
                gov.release("org", "p", granted, granted, now[0])
        turn += 1


def _reported_limit(gov, now: float):
    gov.refresh_report(now)
    return pacing_report(gov.buckets, now)["org/p"]


def _learning_pair():
    now = [100.0]
    pacer = LocalPacer(clock=lambda: now[0])
    pacings = {"p": Pacing(start_rps=10.0)}  # limit unknown: learnt
    one = shared_governor(Policy(), pacings, pacer, rng=lambda: 0.0)
    two = shared_governor(Policy(), pacings, pacer, rng=lambda: 0.0)
    return now, one, two


def test_two_governors_learn_one_estimate_from_a_429_either_met():
    now, one, two = _learning_pair()
    _drive([one, two], now, 1.0)  # slow start, counted together
    assert one.pacing.roles[("org", "p")].learner is not None  # the first to learn holds the lease
    assert two.pacing.roles[("org", "p")].learner is None
    two.backpressure("org", "p", "1", now[0], 0.0, sent_at=now[0])  # the follower's 429
    now[0] += 1.05
    _drive([one, two], now, 0.5)
    learner = one.pacing.roles[("org", "p")].learner
    assert learner is not None and learner.cuts == 1 and learner.phase == "plateau"
    reports = [_reported_limit(gov, now[0]) for gov in (one, two)]
    assert reports[0]["limit_rps"] == reports[1]["limit_rps"] == learner.limit_rps
    assert reports[0]["learnt"] == reports[1]["learnt"] == "plateau"
    # the shared rate is the learner's plateau, not the pacer's own cut
    assert two.pacing.seen[("org", "p")][0] == learner.rate


def test_the_learner_lease_passes_to_another_governor_when_its_holder_goes_quiet():
    now, one, two = _learning_pair()
    _drive([one, two], now, 1.0)
    one.backpressure("org", "p", "1", now[0], 0.0, sent_at=now[0])
    now[0] += 1.05
    _drive([one, two], now, 0.5)
    estimate = one.pacing.roles[("org", "p")].learner.limit_rps
    _drive([two], now, 4.0)  # one is gone: its lease (3 s) lapses, two takes the role
    taken = two.pacing.roles[("org", "p")].learner
    assert taken is not None and taken.limit_rps == estimate and taken.cuts == 1
    _drive([one], now, 0.1)  # one comes back as a follower
    assert one.pacing.roles[("org", "p")].learner is None
    assert _reported_limit(one, now[0])["limit_rps"] == taken.limit_rps


def test_a_lease_holder_whose_calls_do_not_end_still_learns_from_the_others():
    # the holder lost every race for tokens (or its calls hang): the shared rate still
    # follows what the others' calls were accepted at, not held at the start until a
    # lump of answers made slow start jump at once
    now, one, two = _learning_pair()
    one.acquire("org", "p", 1, object(), now[0])
    one.release("org", "p", 1, 1, now[0])  # one holds the lease from now on
    one.acquire("org", "p", 1, object(), now[0])
    rates = []
    for _ in range(50):  # one second; two goes first, one only waits
        now[0] += 0.02
        out = two.acquire("org", "p", 1, object(), now[0])
        granted = sum(n for _, n in out.grants)
        if granted:
            two.release("org", "p", granted, granted, now[0])
        one.wake(now[0])
        rates.append(two.pacing.seen[("org", "p")][0])
    assert one.pacing.roles[("org", "p")].learner is not None
    assert rates[-1] > 2 * rates[0]  # slow start went on as two's calls were accepted


def test_a_half_open_probe_given_back_unsent_lets_the_next_worker_probe_at_once():
    now, _, one, two = _pair(rps=1000.0, circuit_failures=1, circuit_open_s=1.0)
    one.acquire("org", "p", 1, "a", now[0])
    assert ("org", "p") in one.release("org", "p", 1, 0, now[0], unavailable=1).closed
    now[0] += 1.5  # half-open: one probe may go
    probe = one.acquire("org", "p", 1, "probe", now[0])
    assert sum(n for _, n in probe.grants) == 1
    one.release("org", "p", 1, 0, now[0], refunds=1)  # granted, never sent (its caller left)
    assert sum(n for _, n in two.acquire("org", "p", 1, "next", now[0]).grants) == 1  # not 30 s later


def test_a_half_open_probe_that_ends_with_no_verdict_lets_the_next_worker_probe_at_once():
    """The probe went, but its outcome says nothing of the provider (the tool passed on a
    nested call's error: no answer, not unavailable, nothing refunded). As the local
    governor does, the next call probes at once; the shared one waited out the probe's
    30 s claim, for every worker (breaker)."""
    now, _, one, two = _pair(rps=1000.0, circuit_failures=1, circuit_open_s=1.0)
    one.acquire("org", "p", 1, "a", now[0])
    assert ("org", "p") in one.release("org", "p", 1, 0, now[0], unavailable=1).closed
    now[0] += 1.5
    assert sum(n for _, n in one.acquire("org", "p", 1, "probe", now[0]).grants) == 1
    now[0] += 0.1
    one.release("org", "p", 1, 0, now[0], answered=0)  # sent, and it says nothing
    now[0] += 0.1
    assert sum(n for _, n in two.acquire("org", "p", 1, "next", now[0]).grants) == 1


def test_a_nested_calls_slot_coming_back_while_the_probe_is_out_keeps_the_probe():
    now, _, one, two = _pair(rps=1000.0, circuit_failures=1, circuit_open_s=1.0)
    one.acquire("org", "p", 1, "a", now[0])
    one.release("org", "p", 1, 0, now[0], unavailable=1)
    now[0] += 1.5
    assert sum(n for _, n in one.acquire("org", "p", 1, "probe", now[0]).grants) == 1
    one.release("org", "p", 1, 0, now[0], answered=0, exempt=True)  # a nested call's, not the probe's
    assert sum(n for _, n in two.acquire("org", "p", 1, "next", now[0]).grants) == 0  # the probe is out


def test_a_dated_retry_after_is_read_against_the_pacers_clock_not_this_hosts():
    import email.utils

    shared_wall = 1_800_000_000.0
    date = email.utils.formatdate(shared_wall + 60.0, usegmt=True)  # "retry in 60 s"
    for skew in (-120.0, 0.0, 120.0):  # this host's clock off by two minutes either way
        now, pacer, one, _ = _pair()
        pacer.wall_time = lambda fallback: shared_wall  # type: ignore[method-assign]
        one.acquire("org", "p", 1, "a", now[0])
        out = one.backpressure("org", "p", date, now[0], shared_wall + skew, sent_at=now[0])
        _, until = out.gates[("org", "p")]
        assert until - now[0] == pytest.approx(60.0, abs=1.5)


def test_a_call_granted_before_the_circuit_opened_ending_with_no_verdict_keeps_the_shared_probe():
    """As the local governor: a slot coming back with no verdict ends this worker's probe
    only when no slot of the probe's kind is out here (it may be an earlier call's, and
    the probe still out: breaker round 3 found a second probe sent meanwhile)."""
    now, _, one, two = _pair(rps=1000.0, max_concurrency=3, circuit_failures=1, circuit_open_s=1.0)
    assert sum(n for _, n in one.acquire("org", "p", 3, "abc", now[0]).grants) == 3
    one.release("org", "p", 1, 0, now[0], unavailable=1)  # opens; two calls still out
    now[0] += 1.5
    assert sum(n for _, n in one.acquire("org", "p", 1, "probe", now[0]).grants) == 1
    now[0] += 0.1
    one.release("org", "p", 1, 0, now[0], answered=0)  # an earlier call, no verdict
    assert sum(n for _, n in two.acquire("org", "p", 1, "next", now[0]).grants) == 0  # the probe is out
    one.release("org", "p", 1, 0, now[0], answered=0)
    one.release("org", "p", 1, 0, now[0], answered=0)  # nothing of this worker's is out now
    assert sum(n for _, n in two.wake(now[0]).grants) == 1  # the next probe


def test_a_worker_waiting_on_another_workers_probe_asks_again_soon_after_it_closes_the_circuit():
    """Another worker's probe settling wakes nobody here: this worker was told to wait the
    probe's whole 30 s claim, and its calls went 29 s after the circuit had closed
    (breaker round 4). It asks the pacer again within a second (``WAIT_POLL_S``)."""
    now, _, one, two = _pair(rps=1000.0, circuit_failures=1, circuit_open_s=1.0)
    one.acquire("org", "p", 1, "a", now[0])
    one.release("org", "p", 1, 0, now[0], unavailable=1)  # opens
    now[0] += 1.5
    assert sum(n for _, n in one.acquire("org", "p", 1, "probe", now[0]).grants) == 1
    waiting = two.acquire("org", "p", 1, "next", now[0])
    assert waiting.grants == [] and waiting.wake_at is not None
    assert waiting.wake_at <= now[0] + 1.0 + 1e-9  # not the probe claim's 30 s
    now[0] += 0.2
    one.release("org", "p", 1, 1, now[0])  # the probe succeeded: the circuit closes
    now[0] = waiting.wake_at
    assert sum(n for _, n in two.wake(now[0]).grants) == 1


def test_a_shared_pacers_grants_go_to_the_send_gate_with_their_count():
    now, _, one, _ = _pair(rps=100.0)
    out = one.acquire("org", "p", 1, "r1", now[0])
    assert [n for _, n in out.grants] == [1]
    assert out.granted == [(("org", "p"), 1, False)]  # the gate's slot for that send
