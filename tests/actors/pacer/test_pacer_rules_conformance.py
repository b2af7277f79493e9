"""The Redis script (``actors/pacing/pacer.lua``) against the Python rules (``BucketState``).

Hypothesis draws sequences of operations (takes, pauses with and without a cut, growth,
rate changes, circuit outcomes, probes, learner publications and reads, time steps) and
runs each sequence twice: on :class:`~actors.pacing.BucketState` and, with EVAL, on the
script in a private ``redis-server``. Every reply must be the same, field for field
(numbers compared as numbers: Python writes ``repr``, Lua ``%.17g``).

The script reads the server's clock (``TIME``); here that one call is replaced by the two
last arguments (seconds, microseconds), so both sides see the same ``now``. Time steps stay
far inside the key TTL and the learner lease (both of which Redis expires on its own
clock), so neither lapses in the middle of a sequence.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.pacing import BucketState
from actors.pacing.redis_pacer import SCRIPT

from .conftest import RedisServer

TIME_CALL = "redis.call('TIME')"
FAKE_TIME = "{ARGV[#ARGV - 1], ARGV[#ARGV]}"
START_S = 1_800_000_000
"""Epoch seconds the sequences start at (the scale of the server's ``TIME``)."""
TTL_MS = "3600000"
LEASE_MS = "3600000"

Op = tuple[Any, ...]

rates = st.sampled_from([0.0, 0.1, 0.5, 3.0, 10.0, 97.5, 1000.0]) | st.floats(0.01, 2000.0)
seconds = st.sampled_from([0.0, 0.001, 0.5, 1.0, 2.5, 30.0]) | st.floats(0.0, 60.0)

ops: st.SearchStrategy[Op] = st.one_of(
    st.tuples(st.just("take"), st.integers(1, 12), st.booleans(), st.sampled_from([0.5, 30.0])),
    st.tuples(
        st.just("pause"),
        seconds,
        st.sampled_from(["none", "current", "stale"]),
        st.sampled_from([0.8, 0.5]),
        st.sampled_from([0.5, 0.25]),
        st.sampled_from([0.1, 1.0]),
        st.sampled_from([20.0, 5.0]),
    ),
    st.tuples(
        st.just("grow"),
        st.sampled_from([0.0, 0.5, 3.0]) | st.floats(0.0, 50.0),
        st.sampled_from([1.0, 1.05, 2.0]),
        st.sampled_from([0.0, 50.0, 300.0]),
        st.sampled_from([0.0, 0.5]),
    ),
    st.tuples(st.just("set"), rates, st.booleans()),
    st.tuples(
        st.just("record"),
        st.integers(0, 2),
        st.integers(0, 3),
        st.integers(0, 4),
        st.sampled_from([1.0, 5.0]),
        st.sampled_from([3.0, 60.0]),
    ),
    st.tuples(
        st.just("learn"),
        st.integers(0, 20),
        st.sampled_from(["", "a", "b"]),
        st.sampled_from([-1.0, 0.0]) | rates,
        st.booleans(),
        st.sampled_from([0.0, 40.0, 250.0]),
        st.integers(0, 3),
        st.integers(0, 3),
    ),
    st.tuples(st.just("state")),
    st.tuples(
        st.just("sleep"), st.sampled_from([0, 1, 1000, 100_000, 1_000_000]) | st.integers(0, 5_000_000)
    ),
)
heads = st.tuples(
    st.sampled_from([0.0, 0.5, 10.0, 98.0]) | st.floats(0.05, 500.0),  # init_rate (0: unpaced)
    st.booleans(),  # init slow start
    st.sampled_from([-1.0, 1.0, 3.0, 7.5]),  # burst (<0: the default)
    st.sampled_from([0.25, 0.5, 2.0]),  # use_window_s
)


def _argv(op: Op, version: int) -> list[str] | None:
    """The script's own arguments for ``op`` (None: a time step)."""
    name = op[0]
    if name == "take":
        _, n, partial, probe_lease = op
        return ["take", str(n), "1" if partial else "0", "w", "10.0", repr(probe_lease)]
    if name == "pause":
        _, pause_s, cut, dec, ss_dec, min_rps, start_rps = op
        cut_ver = {"none": -1, "current": version, "stale": max(0, version - 1)}[cut]
        args = [repr(pause_s), str(cut_ver), repr(dec), repr(ss_dec), repr(min_rps), repr(start_rps)]
        return ["pause", *args]
    if name == "grow":
        _, add, mul, max_rps, in_use = op
        return ["grow", repr(add), repr(mul), repr(max_rps), repr(in_use)]
    if name == "set":
        _, rate, slow = op
        return ["set", repr(rate), str(int(slow))]
    if name == "record":
        _, answered, unavailable, threshold, open_s, open_max_s = op
        return ["record", str(answered), str(unavailable), str(threshold), repr(open_s), repr(open_max_s)]
    if name == "learn":
        _, accepted, holder, rate, slow, limit, phase, cuts = op
        args = [
            str(accepted),
            holder,
            LEASE_MS,
            repr(rate),
            str(int(slow)),
            repr(limit),
            str(phase),
            str(cuts),
        ]
        return ["learn", *args, "0.5"]
    if name == "state":
        return ["state"]
    return None


def _same(python: Sequence[str], lua: Sequence[str]) -> bool:
    if len(python) != len(lua):
        return False
    for mine, theirs in zip(python, lua, strict=True):
        try:
            if float(mine) != float(theirs):
                return False
        except ValueError:
            if mine != theirs:
                return False
    return True


@pytest.fixture
def lua_pacer(redis_server: RedisServer) -> Any:
    """The script with its clock read from its last two arguments, registered on a client."""
    assert SCRIPT.count(TIME_CALL) == 1, "the script no longer reads TIME in one place"
    client = redis_server.client()
    yield client.register_script(SCRIPT.replace(TIME_CALL, FAKE_TIME))
    client.close()


def _run_both(lua_pacer: Any, head: tuple[Any, ...], sequence: list[Op]) -> None:
    """Run ``sequence`` on a fresh BucketState and on fresh keys; every reply must match."""
    init_rate, slow, burst, use_window_s = head
    common = [repr(init_rate), str(int(slow)), repr(burst), TTL_MS, repr(use_window_s)]
    base = f"tdconf:{uuid.uuid4().hex[:12]}"
    keys = [f"{base}:state", f"{base}:workers", f"{base}:learner"]
    python = BucketState()
    micros = 0
    version = 0
    for step, op in enumerate(sequence):
        own = _argv(op, version)
        if own is None:
            micros += op[1]
            continue
        sec, usec = START_S + micros // 1_000_000, micros % 1_000_000
        argv = [own[0], *common, *own[1:]]
        mine = python.run(argv, float(sec) + float(usec) / 1000000)
        theirs = [str(x) for x in lua_pacer(keys=keys, args=[*argv, str(sec), str(usec)])]
        assert _same(mine, theirs), f"step {step}: {argv}\n python: {mine}\n lua:    {theirs}"
        version = int(float(mine[3]))


EXAMPLES = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@EXAMPLES
@given(head=heads, sequence=st.lists(ops, min_size=1, max_size=40))
def test_pacer_script_replies_as_the_python_rules(
    lua_pacer: Any, head: tuple[Any, ...], sequence: list[Op]
) -> None:
    _run_both(lua_pacer, head, sequence)


circuit_ops: st.SearchStrategy[Op] = st.one_of(
    st.tuples(st.just("take"), st.integers(1, 3), st.booleans(), st.sampled_from([0.5, 2.0])),
    st.tuples(
        st.just("record"),
        st.sampled_from([0, 0, 0, 1]),
        st.integers(0, 2),
        st.integers(1, 2),
        st.just(1.0),
        st.sampled_from([3.0, 60.0]),
    ),
    st.tuples(st.just("sleep"), st.sampled_from([100_000, 600_000, 1_000_000, 2_500_000])),
)


@EXAMPLES
@given(head=heads, sequence=st.lists(circuit_ops, min_size=4, max_size=40))
def test_pacer_script_circuit_replies_as_the_python_rules(
    lua_pacer: Any, head: tuple[Any, ...], sequence: list[Op]
) -> None:
    """The circuit alone (failures, opening, reopening for longer, half-open probes and
    their lease), so that sequences reach its rarer states often."""
    _run_both(lua_pacer, head, sequence)
