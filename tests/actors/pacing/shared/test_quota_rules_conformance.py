"""The Redis script (``actors/pacing/quotas.lua``) against the Python rules (``QuotaState``).

Hypothesis draws limits (rates and quotas, in requests and in tokens) and sequences of
operations (takes of several requests, give-backs, corrections up and down,
announcements, time steps) and runs each sequence on :class:`QuotaState` and, with EVAL,
on the script in a private ``redis-server`` (its arguments made and its replies read by
the RedisPacer's own ``quota_args`` and ``parse_quota_reply``). Every reply must be equal
(to 1e-9: both sides compute in doubles, the script stores them as 17-digit text).
The script's one ``TIME`` call is replaced by its two last arguments, so both sides
see the same ``now``.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.pacing.quotas import (
    Announce,
    Correct,
    GiveBack,
    QuotaOp,
    QuotaRead,
    QuotaState,
    TakeUnits,
    UnitsTaken,
)
from actors.pacing.redis_quotas import QUOTA_SCRIPT, parse_quota_reply, quota_args
from actors.tool import Limit

from .conftest import RedisServer

TIME_CALL = "redis.call('TIME')"
FAKE_TIME = "{ARGV[#ARGV - 1], ARGV[#ARGV]}"
START_S = 1_800_000_000

limits_st = st.lists(
    st.builds(
        Limit,
        amount=st.sampled_from([1.0, 5.0, 100.0, 1000.0, 20000.0]),
        per=st.sampled_from(["second", "minute", "hour", 0.5, 10.0]),
        unit=st.sampled_from(["requests", "tokens"]),
        burst=st.sampled_from([None, 2.0, 500.0]),
    ),
    min_size=1,
    max_size=3,
)
usage = st.dictionaries(st.sampled_from(["tokens", "requests"]), st.sampled_from([0.0, 1.0, 150.0, 2000.0]))
deltas = st.dictionaries(st.just("tokens"), st.sampled_from([-900.0, -1.0, 0.0, 7.5, 1000.0]))
ages = st.sampled_from([0.0, 0.5, 3.0, 70.0])
ops = st.one_of(
    st.builds(
        TakeUnits,
        requests=st.lists(
            st.dictionaries(st.just("tokens"), st.sampled_from([0.0, 100.0, 1999.0, 25000.0])),
            min_size=1,
            max_size=6,
        ).map(tuple),
    ),
    st.builds(GiveBack, units=usage, age_s=ages),
    st.builds(Correct, delta=deltas, age_s=ages),
    st.builds(
        Announce,
        unit=st.sampled_from(["requests", "tokens"]),
        remaining=st.sampled_from([0.0, 3.0, 500.0]),
        reset_s=st.sampled_from([0.0, 1.5, 30.0, 4000.0]),
        sent_ago_s=ages,
        window_s=st.sampled_from([None, 60.0, 57.0, 66.5, 3600.0]),
    ),
)
steps = st.lists(
    st.one_of(st.tuples(st.just("op"), ops), st.tuples(st.just("sleep"), st.integers(0, 90_000_000))),
    min_size=1,
    max_size=30,
)


@pytest.fixture
def lua_quota(redis_server: RedisServer) -> Any:
    assert QUOTA_SCRIPT.count(TIME_CALL) == 1, "the script no longer reads TIME in one place"
    client = redis_server.client()
    yield client.register_script(QUOTA_SCRIPT.replace(TIME_CALL, FAKE_TIME))
    client.close()


def _same(a: QuotaRead, b: QuotaRead) -> bool:
    def close(x: float, y: float) -> bool:
        return x == y or (
            math.isfinite(x) and math.isfinite(y) and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-6)
        )

    if type(a) is not type(b) or len(a.room) != len(b.room):
        return False
    if not all(close(x, y) for x, y in zip(a.room, b.room, strict=True)):
        return False
    if isinstance(a, UnitsTaken) and isinstance(b, UnitsTaken):
        return (
            a.granted == b.granted
            and a.limit == b.limit
            and close(a.wait_s, b.wait_s)
            and close(a.reset_s, b.reset_s)
        )
    return True


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limits=limits_st, sequence=steps)
def test_quota_script_replies_as_the_python_rules(
    lua_quota: Any, limits: list[Limit], sequence: list[Any]
) -> None:
    _run_both(lua_quota, [limits], [(kind, arg, 0) for kind, arg in sequence])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lists=st.lists(limits_st, min_size=2, max_size=3),
    sequence=st.lists(
        st.one_of(
            st.tuples(st.just("op"), ops, st.integers(0, 2)),
            st.tuples(st.just("sleep"), st.integers(0, 90_000_000), st.just(0)),
        ),
        min_size=1,
        max_size=30,
    ),
)
def test_callers_stating_different_limits_share_one_state_alike(
    lua_quota: Any, lists: list[list[Limit]], sequence: list[Any]
) -> None:
    """Callers stating different lists of limits (a rolling deploy) on one key: each op
    under one of them; both sides keep each limit's state under its own identity."""
    _run_both(lua_quota, lists, sequence)


def _run_both(lua_quota: Any, lists: list[list[Limit]], sequence: list[Any]) -> None:
    key = f"tdquota:{uuid.uuid4().hex[:12]}:quota"
    python = QuotaState()
    micros = 0
    for step, (kind, arg, which) in enumerate(sequence):
        if kind == "sleep":
            micros += arg
            continue
        limits = lists[which % len(lists)]
        op: QuotaOp = arg
        sec, usec = START_S + micros // 1_000_000, micros % 1_000_000
        mine = python.handle(op, float(sec) + float(usec) / 1_000_000, limits)
        argv = quota_args(op, limits, 3_600_000_000)
        if argv is None:
            continue
        theirs = parse_quota_reply(
            op, [str(x) for x in lua_quota(keys=[key], args=[*argv, str(sec), str(usec)])], len(limits)
        )
        assert _same(mine, theirs), f"step {step}: {op} under {limits}\n python: {mine}\n lua:    {theirs}"
