"""SharedGovernor (actors/_shared_governor.py): two governors (two worker processes) pacing
through one pacer. A plain state machine: a LocalPacer on a fake clock stands for Redis
(the same rules; the Redis pacer passes the same conformance suite in tests/actors/pacer)."""

from __future__ import annotations

from actors import Pacing, Policy
from actors._shared_governor import SharedGovernor
from actors.errors import ProviderUnavailableError
from actors.shared_pacer import LocalPacer


def _pair(rps: float = 10.0, **policy):
    now = [100.0]
    pacer = LocalPacer(clock=lambda: now[0])
    pacings = {"p": Pacing(rps=rps)}
    one = SharedGovernor(Policy(**policy), pacings, pacer, rng=lambda: 0.0)
    two = SharedGovernor(Policy(**policy), pacings, pacer, rng=lambda: 0.0)
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
