"""Values past what the system can use are refused where they are given, and values a tool
or provider hands over at run time never stop an actor (second breaker round).

Configuration (``Pacing``, ``BatchStrategy``, ``Tool``, ``Policy``, a pacer URL): a NaN,
an int past a float's range, a string, a fraction where a count goes, a concurrency of
0 would each fail later on an actor's thread (hanging every call, or losing a paid
result to a lease that is already expired). Run time: a ``Retry-After`` that is not a
number or a date (an int past a float's range, an object whose ``str()`` raises), and a
credentials function raising SystemExit, each fail or pause their own call only.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from actors import BatchStrategy, Pacing, Policy, RateLimitedError, Tool
from actors.errors import AuthScopeChangedError, DispatchError
from actors.pacing import InvalidPacerURLError, open_pacer
from actors.pacing.bucket import plain_retry_after

WAIT_S = 15.0
HUGE = 10**400


def _noop(i: Any, c: Any) -> Any:
    return i


BAD = [
    (lambda v: Pacing(rps=v), [HUGE, math.inf, math.nan, 0, "5", True], "Pacing.rps"),
    (lambda v: Pacing(max_concurrency=v), [math.nan, 2.5, 0, "3"], "Pacing.max_concurrency"),
    (lambda v: Pacing(burst=v), [math.nan, 0.5, HUGE], "Pacing.burst"),
    (
        lambda v: BatchStrategy(batch_fn=_noop, max_batch_size=v),
        [2.5, math.nan, math.inf, 0],
        "max_batch_size",
    ),
    (lambda v: Tool(tool_id="t", fn=_noop, timeout_s=v), [HUGE, math.nan, "5", 0, -1], "Tool.timeout_s"),
    (lambda v: Tool(tool_id="t", fn=_noop, lease_ttl_s=v), [HUGE, math.nan, -5], "Tool.lease_ttl_s"),
    (lambda v: Policy(lease_ttl_s=v), [math.nan, -5, 0, HUGE], "Policy.lease_ttl_s"),
    (lambda v: Policy(timeout_s=v), [HUGE, "5", math.nan], "Policy.timeout_s"),
    (lambda v: Policy(batch_grace_s=v), [HUGE, -1, math.nan], "Policy.batch_grace_s"),
    (lambda v: Policy(heartbeat_interval_s=v), [HUGE, 0, math.nan], "Policy.heartbeat_interval_s"),
    (lambda v: Policy(max_concurrency=v), [0, 1.5, math.nan], "Policy.max_concurrency"),
    (lambda v: Policy(retry_after_max_s=v), [math.nan, -1], "Policy.retry_after_max_s"),
    (lambda v: Policy(retry_attempts=v), [-1, math.inf], "Policy.retry_attempts"),
    (lambda v: Policy(completion_ladder_s=v), [(1.0, math.nan), (-1.0,)], "Policy.completion_ladder_s"),
]


@pytest.mark.parametrize(
    ("make", "value", "field"),
    [(make, value, field) for make, values, field in BAD for value in values],
    ids=[f"{field}={value!r}"[:40] for _, values, field in BAD for value in values],
)
def test_a_value_the_system_cannot_use_is_refused_at_construction(make: Any, value: Any, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        make(value)


def test_values_that_mean_never_or_none_are_still_accepted() -> None:
    Policy()
    Policy(
        lease_ttl_s=math.inf, retry_attempts=0, batch_grace_s=0.0, max_provider_calls=0, circuit_failures=None
    )
    Tool(tool_id="t", fn=_noop, timeout_s=1e300, lease_ttl_s=None)
    Pacing(rps=0.01, burst=1, max_concurrency=1)
    BatchStrategy(batch_fn=_noop, max_batch_size=1)


@pytest.mark.parametrize(
    "query", ["timeout=nan", "timeout=inf", "timeout=1e300", "timeout=-1", "connect_timeout=0"]
)
def test_a_pacer_url_timeout_past_reason_is_refused_when_opened(query: str) -> None:
    pytest.importorskip("redis")
    with pytest.raises(InvalidPacerURLError, match="must be a number of seconds"):
        open_pacer(f"redis://127.0.0.1:6379/0?{query}")


class _StrExits:
    def __str__(self) -> str:
        raise SystemExit("no text")


@pytest.mark.parametrize(
    ("value", "plain"),
    [(None, None), ("7", "7"), (2.5, 2.5), (3, 3.0), (HUGE, None), (-HUGE, None), (_StrExits(), None)],
    ids=["none", "text", "float", "int", "huge", "minus-huge", "str-exits"],
)
def test_plain_retry_after_never_hands_the_governor_a_value_it_cannot_read(value: Any, plain: Any) -> None:
    assert plain_retry_after(value) == plain


@pytest.mark.parametrize("retry_after", [HUGE, -HUGE, _StrExits()], ids=["huge", "minus-huge", "str-exits"])
def test_a_429_with_an_unreadable_retry_after_pauses_by_default_and_stops_nothing(
    make_system: Any, recorder: Any, retry_after: Any
) -> None:
    def fn(i: Any, ctx: Any) -> Any:
        recorder.record("fn", i, ctx)
        if recorder.count("fn") == 1:
            raise RateLimitedError("slow down", retry_after=retry_after)
        return {"v": i}

    tools = [Tool(tool_id="t", fn=fn), Tool(tool_id="other", fn=lambda i, c: {"o": i})]
    system = make_system(tools, policy=Policy(retry_after_default_s=0.3, retry_after_min_s=0.01))
    assert system.proxy().execute("t", 1).get(timeout=WAIT_S).value == {"v": 1}
    first, second = recorder.of("fn")
    assert second.at - first.at >= 0.25  # the default pause was taken (not none, not forever)
    assert system.proxy().execute("other", 2).get(timeout=WAIT_S).value == {"o": 2}  # governor alive


@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt, GeneratorExit])
def test_credentials_that_raise_anything_when_asked_again_fail_that_call_alone(
    make_system: Any, raised: type[BaseException]
) -> None:
    asked = {"n": 0}
    sent = {"n": 0}

    def credentials() -> str:
        asked["n"] += 1
        if asked["n"] == 2:
            raise raised("credentials store unreachable")
        return f"key-{asked['n']}"

    def fn(i: Any, ctx: Any) -> Any:
        sent["n"] += 1
        if sent["n"] == 1:
            raise AuthScopeChangedError("the key was rotated")
        return {"v": i}

    tools = [
        Tool(tool_id="t", fn=fn, credentials=credentials),
        Tool(tool_id="other", fn=lambda i, c: {"o": i}),
    ]
    system = make_system(tools)
    with pytest.raises(DispatchError, match="credentials"):
        system.proxy().execute("t", 1).get(timeout=WAIT_S)
    assert system.proxy().execute("other", 2).get(timeout=WAIT_S).value == {"o": 2}  # still running
    started = time.monotonic()
    system.stop(timeout_s=10.0)
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("raised", [SystemExit, GeneratorExit])
def test_credentials_that_raise_anything_at_the_first_call_fail_its_future(
    make_system: Any, raised: type[BaseException]
) -> None:
    def credentials() -> str:
        raise raised("no credentials")

    system = make_system(
        [Tool(tool_id="t", fn=_noop, credentials=credentials), Tool(tool_id="other", fn=_noop)]
    )
    future = system.proxy().execute("t", 1)  # does not raise here
    with pytest.raises(DispatchError, match="credentials function raised"):
        future.get(timeout=WAIT_S)
    assert system.proxy().execute("other", 2).get(timeout=WAIT_S).value == 2
