"""The send gate's turns (both runtimes): a turn
given back from the middle of the queue (a sender withdrawn while later ones wait) must
not put the next sender on a turn another holds (two requests left at once at a gate
paced to one per spacing; against nginx at burst 0, a 429); senders parked at the gate
when the provider's circuit opens must not reach the dead provider (they slept out
their turns and sent past the half-open probe), and a call refused there is not
counted as sent."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from typing import Any

import pytest

from actors import CallCancelledError, Pacing, Policy, ProviderUnavailableError, Tool
from actors.pacing.send_gate import SendGate

from ..conftest import ORG, WAIT_S, until


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _sends(gate: SendGate, clock: Clock, pending: list[tuple[float, str, int]]) -> list[tuple[str, float]]:
    """Each sender tries to pass at its turn, and waits as the gate tells it."""
    sends: list[tuple[str, float]] = []
    pending = sorted(pending)
    while pending:
        at, name, epoch = pending.pop(0)
        clock.t = max(clock.t, at)
        extra = gate.try_pass(clock(), epoch)
        assert extra is not None
        if extra > 0:
            pending = sorted([*pending, (clock.t + extra, name, epoch)])
            continue
        sends.append((name, clock.t))
    return sends


def test_gate_a_turn_given_back_from_the_middle_never_lets_two_requests_leave_at_once() -> None:
    clock = Clock()
    gate = SendGate(rps=1.0)  # one request a second, burst 1
    turns = {name: gate.book(clock()) for name in "ABCD"}  # turns at 100, 101, 102, 103
    _delay, epoch, undo = turns.pop("B")
    gate.unbook(epoch, undo)  # B (turn 101) is withdrawn while C and D wait: a gap
    turns["E"] = gate.book(clock())  # a fresh sender: the turn B gave back
    assert turns["E"][0] == 1.0
    sends = _sends(gate, clock, [(100 + d, n, ep) for n, (d, ep, _) in turns.items()])
    gaps = [round(b - a, 6) for (_, a), (_, b) in itertools.pairwise(sends)]
    assert min(gaps) >= 1.0 - 1e-9, f"sends {sends}: gaps {gaps} at a gate paced to 1 rps, burst 1"


def test_gate_turns_given_back_in_any_order_are_all_taken_back() -> None:
    clock = Clock()
    gate = SendGate(rps=1.0)
    gate.book(clock())  # A: now, sent
    held = [gate.book(clock()) for _ in range(3)]  # 101, 102, 103
    for _delay, epoch, turn in (held[0], held[2], held[1]):  # woken in this order
        gate.unbook(epoch, turn)
    assert gate.book(clock())[0] == 1.0  # the next turn after A's, whatever the order
    assert gate.book(clock())[0] == 2.0


def test_gate_the_last_turn_given_back_is_the_next_senders() -> None:
    clock = Clock()
    gate = SendGate(rps=1.0)
    gate.book(clock())  # A: now
    _delay, epoch, undo = gate.book(clock())  # B: 101
    gate.unbook(epoch, undo)
    assert gate.book(clock())[0] == 1.0  # C takes 101, not 102


@pytest.mark.waits
def test_gate_a_cancel_at_the_gate_never_lets_two_requests_leave_at_once(make_system: Any) -> None:
    sends: list[tuple[int, float]] = []
    lock = threading.Lock()

    def fn(input: Any, ctx: Any) -> Any:
        with lock:
            sends.append((input["i"], time.monotonic()))
        return {"i": input["i"]}

    tool = Tool(tool_id="paced", fn=fn, pacing=Pacing(rps=50.0))
    system = make_system([tool], policy=Policy(batch_grace_s=0.0))
    assert system.proxy().execute("paced", {"i": 0}).get(timeout=WAIT_S).value == {"i": 0}
    gate = system.gates.get(ORG, "paced")
    rate = 2.0
    gate.set_rate(rate)  # as the governor does after a 429's cut
    spacing = 1.0 / (rate * 1.02)
    futures = {}
    for i in (1, 2, 3, 4):  # one at a time, so they book turns in this order
        booked = gate.next_turn
        futures[i] = system.proxy().execute("paced", {"i": i})
        until(lambda booked=booked: gate.next_turn > booked, f"call {i} to book its turn")
    futures[2].cancel()  # it waits at the gate for its turn
    with contextlib.suppress(CallCancelledError):
        futures[2].get(timeout=WAIT_S)
    futures[5] = system.proxy().execute("paced", {"i": 5})
    for i, future in futures.items():
        if i != 2:
            assert future.get(timeout=WAIT_S).value == {"i": i}
    with lock:
        paced = sorted((at, i) for i, at in sends if i != 0)
    assert 2 not in [i for _, i in paced]
    gaps = [(b[1], round(b[0] - a[0], 3)) for a, b in itertools.pairwise(paced)]
    assert all(gap >= 0.8 * spacing for _, gap in gaps), (
        f"a gate paced at {rate} rps (spacing {spacing:.3f} s) let requests go {gaps} apart "
        f"(call, seconds after the previous send)"
    )


def test_gate_a_call_refused_there_as_the_circuit_opens_is_not_counted_sent(make_system: Any) -> None:
    sent: list[str] = []
    release = threading.Event()

    def ok(input: Any, ctx: Any) -> Any:
        sent.append(f"ok{input['i']}")
        return {"i": input["i"]}

    def down(input: Any, ctx: Any) -> Any:
        sent.append("down")
        release.wait(WAIT_S)
        raise ConnectionError("provider down")

    pacing = Pacing(rps=50.0)
    tools = [
        Tool(tool_id="ok", fn=ok, provider="p", pacing=pacing),
        Tool(tool_id="down", fn=down, provider="p", pacing=pacing),
    ]
    policy = Policy(batch_grace_s=0.0, circuit_failures=1, circuit_open_s=30.0, circuit_open_max_s=60.0)
    system = make_system(tools, policy=policy)
    assert system.proxy().execute("ok", {"i": 0}).get(timeout=WAIT_S).value == {"i": 0}
    gate = system.gates.get(ORG, "p")
    gate.set_rate(0.5)  # one request in 2 s, as after a 429's cut
    failing = system.proxy().execute("down", {"i": 1})  # its turn is now
    until(lambda: "down" in sent, "the failing call to be sent")
    waited = gate.waited_s
    held = system.proxy().execute("ok", {"i": 2})  # books a turn ~2 s ahead, waits at the gate
    until(lambda: gate.waited_s > waited + 1.0, "the second call to wait at its gate")
    before = system.stats()
    release.set()  # ConnectionError: the circuit opens (threshold 1) while `held` waits
    with contextlib.suppress(Exception):
        failing.get(timeout=WAIT_S)
    try:
        got: Any = held.get(timeout=WAIT_S)
    except Exception as exc:
        got = exc
    assert isinstance(got, ProviderUnavailableError), got
    assert sent == ["ok0", "down"]  # `held` was never sent
    until(lambda: system.stats().get("requests") == 2, "stats to settle")
    stats = system.stats()
    assert stats.get("provider_calls") == 2, (
        f"2 requests sent (ok0, down); held was refused unsent, stats say provider_calls="
        f"{stats.get('provider_calls')} requests={stats.get('requests')} (before the open: "
        f"{before.get('provider_calls')})"
    )


def test_gate_senders_parked_when_the_circuit_opens_never_reach_the_dead_provider(make_system: Any) -> None:
    sent: list[tuple[str, float]] = []
    release = threading.Event()
    opened_at: list[float] = []

    def down(input: Any, ctx: Any) -> Any:
        sent.append((f"down{input['i']}", time.monotonic()))
        if input["i"] == 1:
            release.wait(WAIT_S)
            opened_at.append(time.monotonic())
        raise ConnectionError("provider down")

    def ok(input: Any, ctx: Any) -> Any:
        return {"i": input["i"]}

    pacing = Pacing(rps=50.0)
    tools = [
        Tool(tool_id="ok", fn=ok, provider="p", pacing=pacing),
        Tool(tool_id="down", fn=down, provider="p", pacing=pacing),
    ]
    policy = Policy(
        batch_grace_s=0.0, circuit_failures=1, circuit_open_s=0.3, circuit_open_max_s=60.0, timeout_s=30.0
    )
    system = make_system(tools, policy=policy)
    assert system.proxy().execute("ok", {"i": 0}).get(timeout=WAIT_S).value == {"i": 0}
    gate = system.gates.get(ORG, "p")
    gate.set_rate(1.0)  # one request a second, as after a 429's cut
    first = system.proxy().execute("down", {"i": 1})  # its turn is now
    until(lambda: len(sent) == 1, "the first call to be sent")
    waited = gate.waited_s
    parked = [system.proxy().execute("down", {"i": i}) for i in (2, 3, 4)]  # turns ~1, 2, 3 s ahead
    until(lambda: gate.waited_s > waited + 5.0, "three calls to book turns at the gate")
    release.set()  # ConnectionError: the circuit opens (threshold 1) while three wait
    outcomes = []
    for future in [first, *parked]:
        try:
            outcomes.append(future.get(timeout=WAIT_S))
        except Exception as exc:
            outcomes.append(exc)
    after = [(name, round(at - opened_at[0], 2)) for name, at in sent if at > opened_at[0]]
    report = system.stats()["pacing"]
    assert len(after) <= 1, (
        f"after the circuit opened, {len(after)} requests reached the dead provider "
        f"{after} (s after the open); outcomes {[type(o).__name__ for o in outcomes]}; "
        f"circuit {report.get(f'{ORG}/p', {}).get('circuit')}"
    )


# -- round 3: a closure voids every booking (breaker: the probe waited 8.9 s behind them) --


def test_gate_a_closure_leaves_no_turn_of_a_sender_that_gave_up() -> None:
    t = 100.0
    g = SendGate(rps=1.0)
    g.book(t)  # sent now
    for _ in range(10):
        g.book(t)  # ten senders parked at 101..110
    g.close(100.4)  # the circuit opens at 100.1 for 0.3 s: each parked sender gives up
    for _ in range(10):
        assert g.book(100.1)[0] == float("inf")
    delay = g.book(100.5)[0]  # the half-open probe
    assert delay <= 1.0, f"half-open probe waits {delay} s for turns of senders that gave up"


@pytest.mark.waits
@pytest.mark.parametrize("probe_timeout_s", [60.0, 3.0])
def test_gate_the_half_open_probe_never_waits_behind_turns_of_senders_that_gave_up(
    make_system: Any, probe_timeout_s: float
) -> None:
    sent: list[float] = []
    release = threading.Event()
    fail = [False]

    def down(input: Any, ctx: Any) -> Any:
        sent.append(time.monotonic())
        if input["i"] == 1:
            release.wait(30)
        if fail[0]:
            raise ConnectionError("provider down")
        return {"i": input["i"]}

    tools = [Tool(tool_id="down", fn=down, provider="p", pacing=Pacing(rps=50.0))]
    policy = Policy(batch_grace_s=0.0, circuit_failures=1, circuit_open_s=0.3, circuit_open_max_s=60.0,
                    timeout_s=60.0, retry_attempts=1)  # fmt: skip
    system = make_system(tools, policy=policy)
    assert system.proxy().execute("down", {"i": 0}).get(timeout=30).value == {"i": 0}
    fail[0] = True
    gate = system.gates.get(ORG, "p")
    gate.set_rate(1.0)  # as after a 429's cut (the repo's own tests do this)
    first = system.proxy().execute("down", {"i": 1})
    until(lambda: len(sent) == 2, "first sent")
    waited = gate.waited_s
    parked = [system.proxy().execute("down", {"i": i}) for i in range(2, 12)]
    until(lambda: gate.waited_s > waited + 40.0, "ten calls to book turns")
    release.set()  # ConnectionError: the circuit opens; the ten parked give up
    for f in [first, *parked]:
        with contextlib.suppress(Exception):
            f.get(timeout=60)
    fail[0] = False  # the provider is back
    threading.Event().wait(0.5)  # the circuit (open 0.3 s) is half-open; nothing sent for 0.5 s+
    asked = time.monotonic()
    try:
        probe: Any = system.proxy().execute("down", {"i": 99}, timeout_s=probe_timeout_s).get(timeout=60)
    except Exception as exc:
        probe = exc
    took = time.monotonic() - asked
    assert not isinstance(probe, Exception), f"the half-open probe failed after {took:.2f} s: {probe!r}"
    assert took < 2.0, f"the half-open probe took {took:.2f} s at a gate paced to 1 rps, idle for 0.5 s"


def test_gate_a_rate_set_with_now_moves_the_next_turn_as_the_bucket_does() -> None:
    """A rate announced by the first answer (20/s in slow start, then 196/s): the second
    request goes at the new spacing, not 50 ms after the first (the pacer's token bucket
    rescales the same way); without ``now`` (and after a pause) the turns stay."""
    gate = SendGate(rps=20.0)
    assert gate.book(0.0)[0] == 0.0 and gate.try_pass(0.0, 0) == 0.0
    gate.set_rate(200.0, now=0.01)  # 40 ms left of 50: 4 ms at the new rate
    wait, epoch, _ = gate.book(0.01)
    assert wait == pytest.approx(0.004)
    assert gate.try_pass(0.014, epoch) == 0.0
    kept = SendGate(rps=20.0)
    kept.book(0.0)
    kept.try_pass(0.0, 0)
    kept.set_rate(200.0)
    assert kept.book(0.01)[0] == pytest.approx(0.04)
    paused = SendGate(rps=20.0)
    paused.pause_until(1.0, 20.0)
    paused.set_rate(200.0, now=0.5)  # nothing moves before the pause's end
    assert paused.book(0.5)[0] == pytest.approx(0.5)
