"""The Redis script (``actors/pacing/pacer.lua``) against the Python rules (``BucketState``).

Hypothesis draws sequences of operations (takes, with and without a fairness key and its
weight, pauses with and without a cut, growth,
rate changes, circuit outcomes, probes, learner publications and reads, workers rejoining
from a local share while others are presumed local, time steps) and
runs each sequence twice: on :class:`~actors.pacing.BucketState` and, with EVAL, on the
script in a private ``redis-server`` (its arguments made and its replies read by the
RedisPacer's own ``script_args`` and ``parse_reply``). Every reply must be equal.

The script reads the server's clock (``TIME``); here that one call is replaced by the two
last arguments (seconds, microseconds), so both sides see the same ``now``. Time steps stay
far inside the key TTL and the learner lease (both of which Redis expires on its own
clock), so neither lapses in the middle of a sequence.
"""

from __future__ import annotations

import uuid
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.pacing import BucketState, PacerSettings, ProviderLimits
from actors.pacing.redis_pacer import SCRIPT, parse_reply, script_args
from actors.pacing.values import PHASES, Grow, Learn, PacerOp, Pause, ReadState, Record, Rejoin, SetRate, Take

from .conftest import RedisServer

TIME_CALL = "redis.call('TIME')"
FAKE_TIME = "{ARGV[#ARGV - 1], ARGV[#ARGV]}"
START_S = 1_800_000_000
"""Epoch seconds the sequences start at (the scale of the server's ``TIME``)."""

Step = tuple[Any, ...]
"""``("op", operation)``, ``("cut", pause_s, "current" | "stale")`` or ``("sleep", µs)``."""

rates = st.sampled_from([0.0, 0.1, 0.5, 3.0, 10.0, 97.5, 1000.0]) | st.floats(0.01, 2000.0)
seconds = st.sampled_from([0.0, 0.001, 0.5, 1.0, 2.5, 30.0]) | st.floats(0.0, 60.0)
sleeps = st.tuples(
    st.just("sleep"), st.sampled_from([0, 1, 1000, 100_000, 1_000_000]) | st.integers(0, 5_000_000)
)
publications = st.none() | st.tuples(
    st.sampled_from([-1.0, 0.0]) | rates,
    st.booleans(),
    st.sampled_from([None, 40.0, 250.0]),
    st.sampled_from(PHASES),
    st.integers(0, 3),
)

fair_keys = st.none() | st.sampled_from(["a", "b", "c", "customer 7/é"])
weights = st.sampled_from([1.0, 3.0, 0.5]) | st.floats(0.01, 100.0)

steps: st.SearchStrategy[Step] = st.one_of(
    st.tuples(
        st.just("op"),
        st.builds(
            Take,
            n=st.integers(1, 12),
            partial=st.booleans(),
            nested=st.booleans(),
            key=fair_keys,
            weight=weights,
        ),
    ),
    st.tuples(st.just("op"), st.builds(Pause, pause_s=seconds)),
    st.tuples(st.just("cut"), seconds, st.sampled_from(["current", "stale"])),
    st.tuples(
        st.just("op"),
        st.builds(
            Grow,
            add_rps=st.sampled_from([0.0, 0.5, 3.0]) | st.floats(0.0, 50.0),
            mul=st.sampled_from([1.0, 1.05, 2.0]),
        ),
    ),
    st.tuples(st.just("op"), st.builds(SetRate, rate_rps=st.none() | rates, slow_start=st.booleans())),
    st.tuples(st.just("op"), st.builds(Record, answered=st.integers(0, 2), unavailable=st.integers(0, 3))),
    st.tuples(
        st.just("op"),
        st.builds(
            Learn,
            accepted=st.integers(0, 20),
            holder=st.sampled_from(["", "a", "b"]),
            publish=publications,
        ),
    ),
    st.tuples(
        st.just("op"),
        st.builds(
            Rejoin,
            spent=st.sampled_from([0.0, 1.0, 2.5]) | st.floats(0.0, 50.0),
            pause_s=st.sampled_from([0.0, 1.0]) | seconds,
            rate_rps=st.none() | rates,
            away=st.integers(0, 3),
            share=st.sampled_from([1.0, 0.5, 0.25]),
            since_s=st.sampled_from([0.0, 0.5, 5.0]) | seconds,
        ),
    ),
    st.tuples(st.just("op"), st.just(ReadState())),
    sleeps,
)
limits_st = st.builds(
    ProviderLimits,
    rate_rps=st.sampled_from([None, 0.5, 10.0, 98.0]) | st.floats(0.05, 500.0),
    burst=st.sampled_from([None, 1.0, 3.0, 7.5]),
    max_rps=st.sampled_from([None, 50.0, 300.0]),
    slow_start=st.booleans(),
)
settings_st = st.builds(
    PacerSettings,
    decrease=st.sampled_from([0.8, 0.5]),
    slow_start_decrease=st.sampled_from([0.5, 0.25]),
    min_rps=st.sampled_from([0.1, 1.0]),
    unpaced_start_rps=st.sampled_from([20.0, 5.0]),
    use_window_s=st.sampled_from([0.25, 0.5, 2.0]),
    in_use_fraction=st.sampled_from([0.0, 0.5]),
    circuit_failures=st.sampled_from([None, 1, 2, 5]),
    circuit_open_s=st.sampled_from([1.0, 5.0]),
    circuit_open_max_s=st.sampled_from([3.0, 60.0]),
    probe_lease_s=st.sampled_from([0.5, 30.0]),
    away_s=st.sampled_from([0.5, 3.0]),
    fair_window_s=st.sampled_from([0.2, 1.0]),
    # Redis expires these on its own clock: far longer than any sequence
    state_ttl_s=st.just(3600.0),
    learner_lease_s=st.just(3600.0),
)


@pytest.fixture
def lua_pacer(redis_server: RedisServer) -> Any:
    """The script with its clock read from its last two arguments, registered on a client."""
    assert SCRIPT.count(TIME_CALL) == 1, "the script no longer reads TIME in one place"
    client = redis_server.client()
    yield client.register_script(SCRIPT.replace(TIME_CALL, FAKE_TIME))
    client.close()


def _run_both(lua_pacer: Any, limits: ProviderLimits, rules: PacerSettings, sequence: list[Step]) -> None:
    """Run ``sequence`` on a fresh BucketState and on fresh keys; every reply must be equal."""
    base = f"tdconf:{uuid.uuid4().hex[:12]}"
    keys = [f"{base}:state", f"{base}:workers", f"{base}:learner", f"{base}:fair"]
    python = BucketState()
    micros = 0
    version = 0
    for step, (kind, *args) in enumerate(sequence):
        if kind == "sleep":
            micros += args[0]
            continue
        op: PacerOp = (
            args[0]
            if kind == "op"
            else Pause(pause_s=args[0], cut_version=version if args[1] == "current" else max(0, version - 1))
        )
        sec, usec = START_S + micros // 1_000_000, micros % 1_000_000
        mine = python.handle(op, float(sec) + float(usec) / 1000000, limits, rules)
        argv = script_args(op, limits, rules, worker="w")
        theirs = parse_reply(op, [str(x) for x in lua_pacer(keys=keys, args=[*argv, str(sec), str(usec)])])
        assert mine == theirs, f"step {step}: {op}\n python: {mine}\n lua:    {theirs}"
        version = mine.version


EXAMPLES = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@EXAMPLES
@given(limits=limits_st, rules=settings_st, sequence=st.lists(steps, min_size=1, max_size=40))
def test_pacer_script_replies_as_the_python_rules(
    lua_pacer: Any, limits: ProviderLimits, rules: PacerSettings, sequence: list[Step]
) -> None:
    _run_both(lua_pacer, limits, rules, sequence)


circuit_steps: st.SearchStrategy[Step] = st.one_of(
    st.tuples(
        st.just("op"), st.builds(Take, n=st.integers(1, 3), partial=st.booleans(), nested=st.booleans())
    ),
    st.tuples(
        st.just("op"),
        st.builds(Record, answered=st.sampled_from([0, 0, 0, 1]), unavailable=st.integers(0, 2)),
    ),
    st.tuples(st.just("sleep"), st.sampled_from([100_000, 600_000, 1_000_000, 2_500_000])),
)


@EXAMPLES
@given(
    limits=limits_st,
    rules=settings_st.map(
        lambda s: attrs.evolve(s, circuit_failures=2, circuit_open_s=1.0, probe_lease_s=2.0)
    ),
    sequence=st.lists(circuit_steps, min_size=4, max_size=40),
)
def test_pacer_script_circuit_replies_as_the_python_rules(
    lua_pacer: Any, limits: ProviderLimits, rules: PacerSettings, sequence: list[Step]
) -> None:
    """The circuit alone (failures, opening, reopening for longer, half-open probes and
    their lease), so that sequences reach its rarer states often."""
    _run_both(lua_pacer, limits, rules, sequence)


rejoin_steps: st.SearchStrategy[Step] = st.one_of(
    st.tuples(st.just("op"), st.builds(Take, n=st.integers(1, 4), partial=st.booleans())),
    st.tuples(
        st.just("op"),
        st.builds(
            Rejoin,
            spent=st.sampled_from([0.0, 1.0, 2.5]),
            pause_s=st.sampled_from([0.0, 0.0, 0.3]),
            rate_rps=st.sampled_from([None, None, 5.0, 40.0]),
            away=st.integers(0, 3),
            share=st.sampled_from([0.5, 0.25]),
            since_s=st.sampled_from([0.0, 0.2, 5.0]),
        ),
    ),
    st.tuples(st.just("sleep"), st.sampled_from([1000, 50_000, 200_000, 1_000_000])),
)


@EXAMPLES
@given(
    limits=limits_st,
    rules=settings_st,
    sequence=st.lists(rejoin_steps, min_size=3, max_size=30),
)
def test_pacer_script_rejoin_replies_as_the_python_rules(
    lua_pacer: Any, limits: ProviderLimits, rules: PacerSettings, sequence: list[Step]
) -> None:
    """Workers rejoining from local shares and the takes paced meanwhile at the rate less
    the shares of those presumed still local, so that sequences reach them often."""
    _run_both(lua_pacer, limits, rules, sequence)


fair_steps: st.SearchStrategy[Step] = st.one_of(
    st.tuples(
        st.just("op"),
        st.builds(
            Take,
            n=st.integers(1, 5),
            partial=st.booleans(),
            key=st.sampled_from(["a", "b", "c"]) | fair_keys,
            weight=st.sampled_from([1.0, 1.0, 3.0, 0.25]),
        ),
    ),
    st.tuples(st.just("op"), st.builds(SetRate, rate_rps=st.sampled_from([None, 2.0, 50.0]))),
    st.tuples(st.just("op"), st.builds(Pause, pause_s=st.sampled_from([0.0, 0.3]))),
    st.tuples(st.just("sleep"), st.sampled_from([0, 1000, 20_000, 100_000, 400_000, 1_500_000])),
)


@EXAMPLES
@given(
    limits=limits_st,
    rules=settings_st,
    sequence=st.lists(fair_steps, min_size=3, max_size=50),
)
def test_pacer_script_fair_share_replies_as_the_python_rules(
    lua_pacer: Any, limits: ProviderLimits, rules: PacerSettings, sequence: list[Step]
) -> None:
    """Takes of several fairness keys and weights, close together and across the fairness
    window (keys coming to want more, borrowing, idle ones forgotten), so that sequences
    reach shares below 1 often."""
    _run_both(lua_pacer, limits, rules, sequence)
